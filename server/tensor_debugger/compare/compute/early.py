"""Comparing while the candidate run still ingests: each candidate tensor, once its array is stored, is compared
with the reference tensor of the same name (the reference run is ready), and the result goes into the cache.

This is ahead of the plan, not instead of it: once the candidate is ready the session is planned as always
(`plan.plan_session`, every pairing rule and override), and each pair takes the cached result of its key, which is
the same key (digests, alignment, tolerance) for every pair planned as guessed here. A guess the plan does not make
costs only its computation: results are stored under their key and nothing else, so what users see is the same as
when nothing was compared early. Only the plain case is guessed: one tensor of each name on both sides, not a
shard of a tensor split across ranks, with element values, and shapes that align.

With `fail_fast` the guesses stop once one fails and every reference tensor before it (in execution order) has a
passing guess: what comes after is left to the plan, which computes only what it still needs to know where the
first divergence is (`pipeline.compare_runs`).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.compute.chunk_loop import chunk_pairs
from tensor_debugger.compare.compute.pending import FLUSH_SECONDS, PendingPair, ResultWriter
from tensor_debugger.compare.context import CompareContext, cache_key, tensor_ref
from tensor_debugger.compare.planning.sides import aligned_views, alignment_key_of, tolerance
from tensor_debugger.engine.alignment import align
from tensor_debugger.engine.logical_tensors import LogicalTensor, shard_of
from tensor_debugger.engine.op_alignment import op_call
from tensor_debugger.engine.pairing import execution_order
from tensor_debugger.engine.streaming import PairJob, compare_stream
from tensor_debugger.ingest.stored import Stored, StoredNote, note_of
from tensor_debugger.store.models import ComparisonResultRecord, SessionRecord, TensorRecord

log = logging.getLogger(__name__)
EarlyProgress = Callable[[int, int], None]  # (pairs compared early, of them outside tolerance)


@dataclass(frozen=True)
class EarlyCount:
    compared: int = 0
    failed: int = 0


_WRITE = "write"  # queued by `wait_for`: write the results held
_Queued = tuple[PairJob[PendingPair], tuple[int, ...]] | str | None  # a job and the runs it reads; _WRITE; the end


class EarlyEngine:
    """The thread that compares guessed pairs as they are queued and caches each result under its key; shared by
    the CLI's pipeline (`EarlyComparisons`) and the server's uploads (`compare/early_uploads.py`). Each job names
    the runs whose in-flight arrays it reads, so one run's ingest can wait (`wait_for`) for just those."""

    def __init__(self, context: CompareContext, progress: EarlyProgress | None = None) -> None:
        self.context = context
        self._progress = progress
        self._queue: queue.Queue[_Queued] = queue.Queue()
        self._keys: set[str] = set()  # cache keys queued
        self._busy: dict[int, int] = {}  # run id -> jobs queued, running or not yet written that read its arrays
        self._waiters: dict[int, int] = {}  # run id -> threads in `wait_for` it
        self._done = threading.Condition()
        self._over = False  # the thread has ended: nothing queued will run
        self.stopped = False  # no more jobs are taken (fail_fast)
        self._ending = False  # the end mark was taken
        self.count = EarlyCount()
        self._thread = threading.Thread(target=self._run, name="compare-early", daemon=True)
        self._thread.start()

    def enqueue(self, jobs: Sequence[tuple[PairJob[PendingPair], tuple[int, ...]]]) -> None:
        """Queue the jobs whose keys are neither cached nor queued already; each with the runs it reads."""
        if not jobs:
            return
        try:
            with self.context.sessions() as db:
                cached = set(
                    db.scalars(
                        select(ComparisonResultRecord.cache_key).where(
                            ComparisonResultRecord.cache_key.in_({j.key.key for j, _ in jobs})
                        )
                    )
                )
        except Exception:  # a guess that cannot be set up is simply not made: the plan computes the pair
            return
        with self._done:
            for job, runs in jobs:
                if self.stopped or self._over or job.key.key in cached or job.key.key in self._keys:
                    continue
                self._keys.add(job.key.key)
                for run in runs:
                    self._busy[run] = self._busy.get(run, 0) + 1
                self._queue.put((job, runs))

    def wait_for(self, run_id: int) -> None:
        """Return once no queued or running job reads the arrays of `run_id`, and their results are written."""
        with self._done:
            self._waiters[run_id] = self._waiters.get(run_id, 0) + 1
            if self._busy.get(run_id):
                self._queue.put(_WRITE)  # an idle thread holding results of the run writes them now
            try:
                self._done.wait_for(lambda: self._over or not self._busy.get(run_id))
            finally:
                self._waiters[run_id] -= 1

    def settle(self) -> None:
        """Finish what is queued and end the thread."""
        self._queue.put(None)
        self._thread.join()

    def judged(self, work: PendingPair, passed: bool) -> None:
        """A result was cached (override: fail_fast's bookkeeping)."""

    def _batch(
        self, first: tuple[PairJob[PendingPair], tuple[int, ...]], running: dict[str, tuple[int, ...]]
    ) -> Iterator[PairJob[PendingPair]]:
        """The jobs queued from `first` on, taken as the comparisons go: the batch ends when the queue is empty
        (the stream yields a job's result only once it has taken the next job or ended) or at the end mark."""
        item: _Queued = first
        while item is not None and not self.stopped:
            if not isinstance(item, str):  # a waiter's mark: the stream's results are written as they come
                job, runs = item
                running[job.key.key] = runs
                yield job
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
        if item is None:
            self._ending = True

    def _release(self, runs: list[tuple[int, ...]]) -> None:
        with self._done:
            for run in (run for each in runs for run in each):
                self._busy[run] -= 1
            self._done.notify_all()
        runs.clear()

    def _awaited(self, runs: list[tuple[int, ...]]) -> bool:
        """Whether a thread waits (`wait_for`) for one of `runs`."""
        with self._done:
            return any(self._waiters.get(run) for each in runs for run in each)

    def _run(self) -> None:
        """Compare what is queued, batch after batch. Results are written a batch per transaction (`ResultWriter`:
        at once, then at most every FLUSH_SECONDS), and when a run's ingest waits for them (`wait_for`); idle, the
        thread writes what it holds after FLUSH_SECONDS. A job stays busy for `wait_for` until its result is
        written (one transaction per result cost a first compare 32 of them: 0.09 s of CPU)."""
        writer = ResultWriter(self.context)
        running: dict[str, tuple[int, ...]] = {}
        unwritten: list[tuple[int, ...]] = []  # the runs of results not yet written: still busy for `wait_for`

        def write() -> None:
            writer.flush()
            self._release(unwritten)

        try:
            while not self._ending and not self.stopped:
                try:
                    first = self._queue.get(timeout=FLUSH_SECONDS if writer.waiting else None)
                except queue.Empty:
                    first = _WRITE
                if first is None:
                    break
                if isinstance(first, str):  # idle long enough, or a run's ingest waits
                    write()
                    continue
                stream = compare_stream(
                    self._batch(first, running), self.context.pool, self.context.workers + 1, writer.tick
                )
                for work, result in stream:
                    runs = running.pop(work.key, ())
                    if isinstance(result, Exception):
                        self._release([runs])
                        continue  # not cached: the plan's computation meets it again and the pair says why
                    writer.add(work, result, [])
                    unwritten.append(runs)
                    if writer.waiting and self._awaited(unwritten):
                        writer.flush()  # cached before a run waiting on it goes on (to its plan: `wait_for`)
                    if not writer.waiting:  # written (by `add`, `tick` or the line above)
                        self._release(unwritten)
                    self.judged(work, result.passed)
                    self.count = EarlyCount(self.count.compared + 1, self.count.failed + (not result.passed))
                    if self._progress is not None:
                        self._progress(self.count.compared, self.count.failed)
                if not writer.waiting or self._awaited(unwritten):  # written meanwhile (`tick`), or awaited
                    write()
            write()
        except Exception:  # nothing is lost: every pair not cached here is computed after the plan
            log.exception("comparing while ingesting failed; the pairs are compared once the runs are ready")
        finally:
            with self._done:
                self._over = True
                self._done.notify_all()


def guess(
    context: CompareContext, session: SessionRecord, reference: TensorRecord, candidate: TensorRecord
) -> PairJob[PendingPair] | None:
    """The comparison of two same-named tensors under the key the plan gives their pair, or None when their shapes
    do not align (the plan says why)."""
    alignment = align([tuple(reference.shape)], [tuple(candidate.shape)])
    if alignment is None:
        return None
    steps = alignment.to_json()
    tol, exact = tolerance(session, reference.dtype, candidate.dtype)
    alignment_key = alignment_key_of(steps)
    top = context.top
    key = cache_key([reference.digest], [candidate.digest], alignment_key, tol, exact, top)
    view_a, view_b, _ = aligned_views(context.store, steps, [reference], [candidate])
    work = PendingPair(0, key, (reference.digest,), (candidate.digest,), alignment_key, tol)
    kernel = context.kernel
    reduce = None if tol.ulp else chunk_pairs(view_a, view_b, exact, top, kernel)  # the chunk loop knows no ULPs
    return PairJob(work, view_a, view_b, tol, exact, reduce, top, kernel)


def stored_record(note: StoredNote) -> TensorRecord | None:
    """A stored tensor as the row its run will have (name, array, digest), or None for a shard of a tensor split
    across ranks (not guessed)."""
    if shard_of(note.name)[1] is not None:
        return None
    record = TensorRecord(
        name=note.name, store_key=note.store_key, digest=note.digest, dtype=note.dtype, has_values=True
    )
    record.shape = list(note.shape)
    return record


class EarlyComparisons(EarlyEngine):
    """A `StoredListener` (ingest/runs.py) for the candidate run's ingest: compares, in a thread of its own, each
    stored tensor with its guessed reference partner, as the ingest goes on."""

    def __init__(
        self,
        context: CompareContext,
        session_id: int,
        reference_run_id: int,
        progress: EarlyProgress | None = None,
        fail_fast: bool = False,
    ) -> None:
        with context.sessions() as db:
            session = db.get_one(SessionRecord, session_id)
            db.expunge(session)
            self._session = session
            rows = detached_tensors(db, reference_run_id)
        self._reference = pairable_by_name(rows)
        ordered = sorted(rows, key=lambda r: execution_order(LogicalTensor(r.name, (tensor_ref(r),))))
        self._order = {r.name: n for n, r in enumerate(ordered)}  # a reference tensor's place in execution order
        self._places: dict[str, list[int]] = {}  # cache key -> the places of the reference tensors it compares
        self._verdicts: dict[int, bool] = {}  # place -> whether its guess passed
        self._fail_fast = fail_fast
        self._seen: set[str] = set()  # candidate names met (a second one is renamed by the ingest: not guessed)
        super().__init__(context, progress)

    def stored(self, tensors: Sequence[Stored]) -> None:
        try:
            jobs = [(job, ()) for item in tensors if (job := self._job(item)) is not None]
        except Exception:  # a guess that cannot be set up is simply not made: the plan computes the pair
            return
        self.enqueue(jobs)

    def _job(self, item: Stored) -> PairJob[PendingPair] | None:
        candidate = stored_record(note_of(*item))
        if candidate is None:
            return None
        first = candidate.name not in self._seen
        self._seen.add(candidate.name)
        partner = self._reference.get(candidate.name)
        if not first or partner is None:
            return None
        job = guess(self.context, self._session, partner, candidate)
        if job is not None:
            self._places.setdefault(job.key.key, []).append(self._order[candidate.name])
        return job

    def judged(self, work: PendingPair, passed: bool) -> None:
        """Record a guess's verdict; with fail_fast, stop once the first in execution order is a failure."""
        for place in self._places[work.key]:
            self._verdicts[place] = passed
        if not self._fail_fast:
            return
        place = 0
        while self._verdicts.get(place):
            place += 1
        if self._verdicts.get(place) is False:
            self.stopped = True


def detached_tensors(db: DbSession, run_id: int) -> list[TensorRecord]:
    """A run's tensor rows, detached from `db` so that they outlive it."""
    rows = list(db.scalars(select(TensorRecord).where(TensorRecord.run_id == run_id)))
    for row in rows:
        db.expunge(row)
    return rows


def pairable_by_name(rows: Sequence[TensorRecord]) -> dict[str, TensorRecord]:
    """The tensors a same-name guess may pair, by name: those whose name occurs once and that hold values; not a
    captured op's output, whose partner is the op the alignment of its module call's ops faces it with
    (`engine/op_alignment.pair_ops`, in the plan), not the call of the same index."""
    counts = Counter(r.name for r in rows)
    return {r.name: r for r in rows if counts[r.name] == 1 and r.has_values and op_call(r.name) is None}
