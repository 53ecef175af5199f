"""Comparing while the server ingests an upload's runs (`compare/compute/early.py` for the CLI's pipeline): the runs of
an upload ingest at once, so whichever of a pair's two tensors lands second starts its comparison, with the
same guess and cache key as the CLI's (`early.guess`): results identical by construction, and a pair the plan
does not make costs only its computation.

The ingests run in child processes (`ingest/child.py`): each tells the server the tensors of each file it has
stored (`ingest/stored.StoredNote`), and before its run's arrays may move (shared with an identical array, or
deleted with a failed run) it waits for the server's listener to settle (`wait_for`: every comparison reading them
is done and cached, so neither reads a moved array nor runs again once the run is planned). Once the run is ready
its rows stand for it, and the tensors of runs still ingesting that met nothing meanwhile are paired with them.
The reference is the run the plan will take: the session's first by position that is no rerun and has not failed.
An upload of a reference and a candidate ingests both in one child process, which compares their pairs from the
bytes as it reads them and sends the statistics (`sent_pairs.py`): those pairs' jobs take them instead of reading
the stored copies (`EarlyUploads.pair`), as the CLI's take them from its `Lockstep`s.
"""

from __future__ import annotations

import enum
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select

from tensor_debugger.compare.compute.early import (
    EarlyCount,
    EarlyEngine,
    EarlyProgress,
    detached_tensors,
    guess,
    pairable_by_name,
    stored_record,
)
from tensor_debugger.compare.compute.in_memory_pairs import from_memory_only
from tensor_debugger.compare.compute.lockstep import Lockstep
from tensor_debugger.compare.compute.lockstep_handoff import LockstepCounts
from tensor_debugger.compare.compute.pending import PendingPair
from tensor_debugger.compare.compute.sent_pairs import SentPairs
from tensor_debugger.compare.context import CompareContext
from tensor_debugger.engine.logical_tensors import shard_of
from tensor_debugger.engine.streaming import PairJob
from tensor_debugger.ingest.runs import PendingRun
from tensor_debugger.ingest.stored import NoteListener, StoredNote
from tensor_debugger.ingest.taps import Found
from tensor_debugger.store.compared_against import session_reference
from tensor_debugger.store.models import RunRecord, SessionRecord, TensorRecord

Job = tuple[PairJob[PendingPair], tuple[int, ...]]
KEPT_RESULTS = 1000  # results of one session kept for its page (the counts go on)
KEPT_SESSIONS = 100  # sessions whose figures are kept once their ingests are over (until they are planned)


class EarlyStatus(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"


@dataclass(frozen=True)
class EarlyPair:
    """A pair compared while its runs ingest: the candidate run, the tensors' name, the verdict."""

    run_id: int
    name: str
    status: EarlyStatus


@dataclass(frozen=True)
class EarlyFigures:
    count: EarlyCount
    results: tuple[EarlyPair, ...]  # in the order they came, the first KEPT_RESULTS
    # a reference and a candidate ingested at once: how their pairs were read (from the blocks as they were read for
    # storing, or from the store, by why: compute/lockstep.py); None where no two runs were
    read_once: LockstepCounts | None = None


class SessionComparisons(EarlyEngine):
    """The early comparisons of one session while this server ingests runs of it."""

    def __init__(
        self,
        context: CompareContext,
        session_id: int,
        progress: EarlyProgress | None = None,
        lockstep: Lockstep | None = None,
    ) -> None:
        """`lockstep`: the two runs' blocks compared in memory as they ingest (`compute/lockstep.py`); its pairs'
        jobs take their statistics from there instead of reading the stored copies (as those `in_memory` adds)."""
        self._lock = threading.Lock()
        self._in_memory: list[Lockstep | SentPairs] = [lockstep] if lockstep is not None else []
        self._tensors: dict[int, dict[str, TensorRecord]] = {}  # run -> its tensors to pair, by name
        self._seen: dict[int, set[str]] = {}  # in-flight run -> names met (a second one is renamed: not guessed)
        # a reference settled before its candidates: its tensors, for pairs whose statistics come from memory only
        # (its in-flight arrays are no longer read; a pair that would read them waits for the plan)
        self._settled: dict[str, TensorRecord] = {}
        with context.sessions() as db:
            session = db.get_one(SessionRecord, session_id)
            db.expunge(session)
            self._session = session
        self._session_id = session_id
        self._reference: int | None = None
        self._elsewhere: set[int] = set()  # runs compared against another run than the reference
        self._named: dict[str, list[tuple[int, str]]] = {}  # cache key -> (candidate run, name) of its guesses
        self.results: list[EarlyPair] = []
        super().__init__(context, progress)
        self._load_reference()
        for run_id in self._ready_runs():
            self._tensors[run_id] = self._rows(run_id)

    def in_memory(self, pairs: Lockstep | SentPairs) -> None:
        """The pairs of two runs compared from their blocks elsewhere (an upload's child process: `sent_pairs.py`):
        their jobs take their statistics from there."""
        with self._lock:
            self._in_memory.append(pairs)

    def listener(self, run_id: int) -> NoteListener:
        with self._lock:
            self._load_reference()  # a run added to the session since
            self._tensors.setdefault(run_id, {})
            self._seen[run_id] = set()
        return _RunListener(self, run_id)

    def ready(self, run_id: int) -> None:
        """The run's ingest is over and it is ready: its rows stand for it; pair the in-flight tensors that wait."""
        rows = self._rows(run_id)
        with self._lock:
            self._tensors[run_id] = rows
            self.enqueue(self._pairs_of(run_id, list(rows.values())))

    def stored(self, run_id: int, notes: Sequence[StoredNote]) -> None:
        with self._lock:
            if run_id not in self._seen:
                return  # settled already
            fresh: list[TensorRecord] = []
            for note in notes:
                record = stored_record(note)
                if record is None or record.name in self._seen[run_id]:
                    continue
                self._seen[run_id].add(record.name)
                self._tensors[run_id][record.name] = record
                fresh.append(record)
            self.enqueue(self._pairs_of(run_id, fresh))

    def close(self, run_id: int) -> None:
        """The run's ingest settles: no new comparison reads its in-flight arrays; wait for those that do. A
        reference's tensors are kept for the pairs its candidates store later whose statistics were computed in
        memory (an upload's two runs ingested at once: the reference may settle first)."""
        with self._lock:
            self._seen.pop(run_id, None)
            tensors = self._tensors.pop(run_id, None)
            if run_id == self._reference and tensors and self._in_memory:
                self._settled = dict(tensors)
        self.wait_for(run_id)

    def _pairs_of(self, run_id: int, records: Sequence[TensorRecord]) -> list[Job]:
        """The comparisons `records` of `run_id` complete (under the lock)."""
        reference = self._reference
        if reference is None:
            return []
        if reference not in self._tensors:
            if run_id == reference or not self._settled:
                return []
            try:  # the reference settled: only pairs compared in memory, which read none of its arrays
                pairs = [(self._settled.get(r.name), r) for r in records]
                return self._guesses(reference, run_id, pairs, in_memory_only=True)
            except Exception:
                return []
        if run_id in self._elsewhere:
            return []
        jobs: list[Job] = []
        try:
            if run_id == reference:
                for other, tensors in self._tensors.items():
                    if other != reference and other not in self._elsewhere:
                        jobs += self._guesses(reference, other, [(r, tensors.get(r.name)) for r in records])
            else:
                partners = self._tensors[reference]
                jobs += self._guesses(reference, run_id, [(partners.get(r.name), r) for r in records])
        except Exception:  # a guess that cannot be set up is simply not made: the plan computes the pair
            return jobs
        return jobs

    def _guesses(
        self,
        reference: int,
        candidate: int,
        pairs: Sequence[tuple[TensorRecord | None, TensorRecord | None]],
        in_memory_only: bool = False,
    ) -> list[Job]:
        """The jobs of `pairs`; with `in_memory_only`, only those whose statistics were computed in memory."""
        jobs: list[Job] = []
        for a, b in pairs:
            if a is not None and b is not None and (job := guess(self.context, self._session, a, b)) is not None:
                replayed = None
                for in_memory in self._in_memory:
                    if in_memory.runs == (reference, candidate):
                        replayed = in_memory.replayed(a.name, job) or replayed
                if in_memory_only and (replayed is None or not from_memory_only(replayed)):
                    continue
                job = replayed or job
                jobs.append((job, (reference, candidate)))
                self._named.setdefault(job.key.key, []).append((candidate, a.name))
        return jobs

    def judged(self, work: PendingPair, passed: bool) -> None:
        with self._lock:
            for run_id, name in self._named.pop(work.key, []):
                if len(self.results) < KEPT_RESULTS:
                    self.results.append(EarlyPair(run_id, name, EarlyStatus.PASS if passed else EarlyStatus.FAIL))

    def figures(self) -> EarlyFigures:
        with self._lock:
            counts = [pairs.counts() for pairs in self._in_memory]
            return EarlyFigures(self.count, tuple(self.results), _sum(counts) if counts else None)

    def _load_reference(self) -> None:
        with self.context.sessions() as db:
            runs = db.execute(
                select(RunRecord.id, RunRecord.role, RunRecord.status, RunRecord.compared_against_id)
                .where(RunRecord.session_id == self._session_id)
                .order_by(RunRecord.position)
            ).all()
        # as the plan takes it
        reference = session_reference(runs)
        self._reference = reference.id if reference is not None else None
        # runs compared against another run than the reference: no guess pairs them with the reference's tensors
        # (the plan pairs them with that run's)
        self._elsewhere = {
            r.id for r in runs if r.status != "failed" and r.compared_against_id is not None and r.role != "noise"
        }

    def _ready_runs(self) -> list[int]:
        with self.context.sessions() as db:
            return list(
                db.scalars(
                    select(RunRecord.id).where(RunRecord.session_id == self._session_id, RunRecord.status == "ready")
                )
            )

    def _rows(self, run_id: int) -> dict[str, TensorRecord]:
        """A ready run's tensors that a guess may pair: one of each name, with values, not a shard."""
        with self.context.sessions() as db:
            rows = detached_tensors(db, run_id)
        return {name: r for name, r in pairable_by_name(rows).items() if shard_of(name)[1] is None}


def _sum(counts: Sequence[LockstepCounts]) -> LockstepCounts:
    read_back: dict[str, int] = {}
    for count in counts:
        for why, n in count.read_back.items():
            read_back[why] = read_back.get(why, 0) + n
    return LockstepCounts(sum(count.in_memory for count in counts), read_back)


class _RunListener:
    """One run's ingest's `NoteListener`, feeding its session's comparisons."""

    def __init__(self, comparisons: SessionComparisons, run_id: int) -> None:
        self._session_comparisons = comparisons
        self._run_id = run_id

    def stored(self, notes: Sequence[StoredNote]) -> None:
        self._session_comparisons.stored(self._run_id, notes)

    def settle(self) -> None:
        self._session_comparisons.close(self._run_id)


class EarlyUploads:
    """The server's `IngestWatcher` (ingest/queue.py): one `SessionComparisons` per session while this server
    ingests runs of it; its figures kept after, for the session page until the session is planned."""

    def __init__(self, context: CompareContext) -> None:
        self._context = context
        self._lock = threading.Lock()
        self._live: dict[int, tuple[SessionComparisons, int]] = {}  # session -> its comparisons, runs ingesting
        self._over: OrderedDict[int, EarlyFigures] = OrderedDict()  # session -> figures of its last ones

    def begin(self, pending: PendingRun) -> NoteListener | None:
        with self._lock:
            live = self._live.get(pending.session_id)
            if live is None:
                live = (SessionComparisons(self._context, pending.session_id), 0)
            self._live[pending.session_id] = (live[0], live[1] + 1)
        return live[0].listener(pending.run_id)

    def pair(self, reference: PendingRun, candidate: PendingRun) -> Found | None:
        """Both runs (begun) are ingested at once in a child process that compares their pairs from the blocks as
        they are read: the session's comparisons take those it sends (`SentPairs.receive`)."""
        with self._lock:
            live = self._live.get(reference.session_id)
        if live is None or reference.session_id != candidate.session_id:
            return None
        sent = SentPairs((reference.run_id, candidate.run_id))
        live[0].in_memory(sent)
        return sent.receive

    def end(self, pending: PendingRun, ready: bool) -> None:
        """The run's ingest is over (`ready`: it succeeded); once a session's last one is, its comparisons end."""
        with self._lock:
            live = self._live.get(pending.session_id)
        if live is None:  # closed: the server is stopping
            return
        early = live[0]
        try:
            if ready:
                early.ready(pending.run_id)
                early.wait_for(pending.run_id)  # cached before the plan that follows
        finally:
            self._ended(pending, early)

    def _ended(self, pending: PendingRun, early: SessionComparisons) -> None:
        with self._lock:
            if pending.session_id not in self._live:
                return
            ingesting = self._live[pending.session_id][1]
            last = ingesting == 1
            if last:
                del self._live[pending.session_id]
            else:
                self._live[pending.session_id] = (early, ingesting - 1)
        if last:
            early.settle()
            with self._lock:
                self._over[pending.session_id] = early.figures()
                while len(self._over) > KEPT_SESSIONS:
                    self._over.popitem(last=False)

    def figures(self, session_id: int) -> EarlyFigures | None:
        """The pairs compared early in the session (so far, while its runs ingest), or None when none were here."""
        with self._lock:
            live = self._live.get(session_id)
            if live is None:
                return self._over.get(session_id)
        return live[0].figures()

    def close(self) -> None:
        with self._lock:
            live = [early for early, _ in self._live.values()]
            self._live.clear()
        for early in live:
            early.stopped = True  # the server is stopping: what is not cached is computed after its next start
            early.settle()
