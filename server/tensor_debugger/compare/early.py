"""Comparing while the candidate run still ingests: each candidate tensor, once its array is stored, is compared
with the reference tensor of the same name (the reference run is ready), and the result goes into the cache.

This is ahead of the plan, not instead of it: once the candidate is ready the session is planned as always
(`Comparisons.plan`, every pairing rule and override), and each pair takes the cached result of its key, which is
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from sqlalchemy import select

from tensor_debugger.compare.chunk_loop import chunk_pairs
from tensor_debugger.compare.pending import PendingPair, ResultWriter
from tensor_debugger.compare.plan import Comparisons, cache_key, tensor_ref
from tensor_debugger.engine.alignment import align
from tensor_debugger.engine.names import tensor_name
from tensor_debugger.engine.pairing import LogicalTensor, execution_order, shard_of
from tensor_debugger.engine.streaming import PairJob, compare_stream
from tensor_debugger.ingest.runs import Stored
from tensor_debugger.store.models import ComparisonResultRecord, SessionRecord, TensorRecord

log = logging.getLogger(__name__)
EarlyProgress = Callable[[int, int], None]  # (pairs compared early, of them outside tolerance)


@dataclass(frozen=True)
class EarlyCount:
    compared: int = 0
    failed: int = 0


class EarlyComparisons:
    """A `StoredListener` (ingest/runs.py) for the candidate run's ingest: compares, in a thread of its own, each
    stored tensor with its guessed reference partner, as the ingest goes on."""

    def __init__(
        self,
        comparisons: Comparisons,
        session_id: int,
        reference_run_id: int,
        progress: EarlyProgress | None = None,
        fail_fast: bool = False,
    ) -> None:
        self._comparisons = comparisons
        self._progress = progress
        self._fail_fast = fail_fast
        with comparisons.sessions() as db:
            session = db.get_one(SessionRecord, session_id)
            db.expunge(session)
            self._session = session
            rows = db.scalars(select(TensorRecord).where(TensorRecord.run_id == reference_run_id)).all()
            for row in rows:
                db.expunge(row)
        counts: dict[str, int] = {}
        for row in rows:
            counts[row.name] = counts.get(row.name, 0) + 1
        self._reference = {r.name: r for r in rows if counts[r.name] == 1 and r.has_values}
        ordered = sorted(rows, key=lambda r: execution_order(LogicalTensor(r.name, (tensor_ref(r),))))
        self._order = {r.name: n for n, r in enumerate(ordered)}  # a reference tensor's place in execution order
        self._places: dict[str, list[int]] = {}  # cache key -> the places of the reference tensors it compares
        self._verdicts: dict[int, bool] = {}  # place -> whether its guess passed
        self._stopped = False  # with fail_fast: a guess failed, and every one before it passed
        self._seen: set[str] = set()  # candidate names met (a second one is renamed by the ingest: not guessed)
        self._keys: set[str] = set()  # cache keys queued
        self._queue: queue.Queue[PairJob[PendingPair] | None] = queue.Queue()
        self._count = EarlyCount()
        self._thread = threading.Thread(target=self._run, name="compare-early", daemon=True)
        self._thread.start()

    @property
    def count(self) -> EarlyCount:
        return self._count

    def stored(self, tensors: Sequence[Stored]) -> None:
        try:
            jobs = [job for item in tensors if (job := self._job(item)) is not None]
            if not jobs:
                return
            with self._comparisons.sessions() as db:
                cached = set(
                    db.scalars(
                        select(ComparisonResultRecord.cache_key).where(
                            ComparisonResultRecord.cache_key.in_({j.key.key for j in jobs})
                        )
                    )
                )
        except Exception:  # a guess that cannot be set up is simply not made: the plan computes the pair
            return
        for job in jobs:
            if not self._stopped and job.key.key not in cached and job.key.key not in self._keys:
                self._keys.add(job.key.key)
                self._queue.put(job)

    def settle(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _job(self, item: Stored) -> PairJob[PendingPair] | None:
        entry, key_path, tensor = item
        if entry.module_path is not None and key_path == ("data",):
            key_path = ()  # as the ingest names a trace's tensors (`Ingestor._finish`)
        name = tensor_name(PurePosixPath(entry.relpath), key_path)
        first = name not in self._seen
        self._seen.add(name)
        partner = self._reference.get(name)
        if not first or partner is None or shard_of(name)[1] is not None:
            return None
        alignment = align([tuple(partner.shape)], [tensor.shape])
        if alignment is None:
            return None
        candidate = TensorRecord(
            name=name, store_key=tensor.store_key, digest=tensor.digest, dtype=tensor.dtype.name, has_values=True
        )
        candidate.shape = list(tensor.shape)
        steps = alignment.to_json()
        tol, exact = self._comparisons.tolerance(self._session, partner.dtype, candidate.dtype)
        alignment_key = self._comparisons.alignment_key_of(steps)
        key = cache_key([partner.digest], [candidate.digest], alignment_key, tol, exact, self._comparisons.top)
        view_a, view_b, _ = self._comparisons.aligned_views(steps, [partner], [candidate])
        work = PendingPair(0, key, (partner.digest,), (candidate.digest,), alignment_key, tol)
        self._places.setdefault(key, []).append(self._order[name])
        top = self._comparisons.top
        return PairJob(
            work, view_a, view_b, tol, exact, None if tol.ulp else chunk_pairs(view_a, view_b, exact, top), top
        )

    def _jobs(self) -> Iterator[PairJob[PendingPair]]:
        while not self._stopped and (job := self._queue.get()) is not None:
            yield job

    def _judge(self, key: str, passed: bool) -> None:
        """Record a guess's verdict; with fail_fast, stop once the first in execution order is a failure."""
        for place in self._places[key]:
            self._verdicts[place] = passed
        if not self._fail_fast:
            return
        place = 0
        while self._verdicts.get(place):
            place += 1
        if self._verdicts.get(place) is False:
            self._stopped = True

    def _run(self) -> None:
        writer = ResultWriter(self._comparisons)
        try:
            stream = compare_stream(
                self._jobs(), self._comparisons.pool, self._comparisons.workers + 1, on_tick=writer.tick
            )
            for work, result in stream:
                if isinstance(result, Exception):
                    continue  # not cached: the plan's computation meets it again and the pair says why
                writer.add(work, result, [])
                self._judge(work.key, result.passed)
                self._count = EarlyCount(self._count.compared + 1, self._count.failed + (not result.passed))
                if self._progress is not None:
                    self._progress(self._count.compared, self._count.failed)
            writer.flush()
        except Exception:  # nothing is lost: every pair not cached here is computed after the plan
            log.exception("comparing while ingesting failed; the pairs are compared once the run is ready")
