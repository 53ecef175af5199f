"""Computing a session's pending pairs: set up in batches, compared as one stream of blocks, written back in batches.

Pairs are set up `SETUP_BATCH` at a time with a few queries per batch, and their results are written a batch per
transaction. One pair at a time cost about 3 ms of queries and ORM work in the thread that feeds the comparison;
for tensors of 1 MiB that was more than comparing them (measured: 256 such pairs took 1.0 s, 0.69 s of it there).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.engine.metrics import PairStats
from tensor_debugger.engine.streaming import PairJob, compare_stream
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.models import ComparisonResultRecord, PairRecord, SessionRecord, TensorRecord

if TYPE_CHECKING:
    from tensor_debugger.comparisons import Comparisons

ProgressCallback = Callable[[int, int], None]  # (pairs done, pairs to do)
SETUP_BATCH = 64  # pairs set up per round of queries
FLUSH_SECONDS = 0.1  # results are written at most this often (the first at once), so the API's progress stays live
FLUSH_RESULTS = 256  # or when this many are waiting


@dataclass(frozen=True)
class PendingPair:
    """A pair being computed, and what its result is stored under."""

    pair_id: int
    key: str  # the cache key (see `comparisons.cache_key`)
    digests_a: tuple[str, ...]
    digests_b: tuple[str, ...]
    dtypes: tuple[str, str]  # of the first tensor on each side: they choose the tolerance
    alignment_key: str  # the alignment's steps as JSON
    tolerance: Tolerance


def compute_pending(
    comparisons: Comparisons, session_id: int | None = None, progress: ProgressCallback | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> int:
    """Compute every pending pair (of one session, or all), in execution order; returns how many pairs were
    settled (all of them unless `should_stop` said to stop). Identical comparisons pending together are computed
    once."""
    with comparisons.sessions() as db:
        query = select(PairRecord.id).where(PairRecord.status == "pending")
        if session_id is not None:
            query = query.where(PairRecord.session_id == session_id)
        todo = list(db.scalars(query.order_by(PairRecord.session_id, PairRecord.position)))
    done = 0
    waiting: dict[str, list[int]] = {}  # cache key in flight -> pairs with the same key, settled with it

    def settled(count: int) -> None:
        nonlocal done
        done += count
        if count and progress is not None:
            progress(done, len(todo))

    def jobs() -> Iterator[PairJob[PendingPair]]:
        for start in range(0, len(todo), SETUP_BATCH):
            ready, finished = set_up(comparisons, todo[start : start + SETUP_BATCH])
            settled(finished)
            for job in ready:
                if should_stop is not None and should_stop():
                    return
                if job.key.key in waiting:  # the same comparison is already computing: no second pass
                    waiting[job.key.key].append(job.key.pair_id)
                else:
                    waiting[job.key.key] = []
                    yield job

    writer = ResultWriter(comparisons)
    with comparisons.lock:  # one computation at a time per process: the pool is already parallel
        try:
            for work, result in compare_stream(jobs(), comparisons.pool):
                pair_ids = [work.pair_id, *waiting.pop(work.key)]
                writer.add(work, result, pair_ids)
                settled(len(pair_ids))
        finally:
            writer.flush()
    return done


def set_up(comparisons: Comparisons, pair_ids: Sequence[int]) -> tuple[list[PairJob[PendingPair]], int]:
    """The comparisons that `pair_ids` need, in their order, and how many of them were settled without one: no
    longer pending, a cached result (its verdict given now), or views that cannot be built (the pair says why)."""
    jobs: list[PairJob[PendingPair]] = []
    hits: list[tuple[int, str, ComparisonResultRecord]] = []
    failed: list[tuple[int, str]] = []
    with comparisons.sessions() as db:
        found = {p.id: p for p in db.scalars(select(PairRecord).where(PairRecord.id.in_(pair_ids)))}
        pairs = [found[i] for i in pair_ids if i in found and _wants_result(found[i])]
        tensors = {t.id: t for t in db.scalars(select(TensorRecord).where(
            TensorRecord.id.in_({i for p in pairs for i in (*p.a_tensor_ids, *p.b_tensor_ids)})))}
        sessions = {s.id: s for s in db.scalars(select(SessionRecord).where(
            SessionRecord.id.in_({p.session_id for p in pairs})))}
        keyed = []
        for pair in pairs:
            if any(i not in tensors for i in (*pair.a_tensor_ids, *pair.b_tensor_ids)):
                continue  # deleted meanwhile, with its run: so is the pair
            a, b = [tensors[i] for i in pair.a_tensor_ids], [tensors[i] for i in pair.b_tensor_ids]
            keyed.append((pair, a, b, *comparisons.key(sessions[pair.session_id], pair, a, b)))
        cached = {r.cache_key: r for r in db.scalars(select(ComparisonResultRecord).where(
            ComparisonResultRecord.cache_key.in_({k[3] for k in keyed})))}
        for pair, a, b, key, tol, exact in keyed:
            if key in cached:
                hits.append((pair.id, key, cached[key]))
                continue
            try:
                view_a, view_b, _ = comparisons.views_of(pair, a, b)
            except Exception as exc:  # a missing array: the pair says so, work goes on
                failed.append((pair.id, f"{type(exc).__name__}: {exc}"))
                continue
            work = PendingPair(pair.id, key, tuple(t.digest for t in a), tuple(t.digest for t in b),
                               (a[0].dtype, b[0].dtype), json.dumps((pair.alignment or {}).get("steps", [])), tol)
            jobs.append(PairJob(work, view_a, view_b, tol, exact))
    if hits or failed:
        with comparisons.sessions.begin() as db:
            for pair_id, key, record in hits:
                _settle(comparisons, db, [pair_id], key, record)
            for pair_id, message in failed:
                _fail(db, pair_id, message)
    return jobs, len(pair_ids) - len(jobs)


class ResultWriter:
    """Results of computed pairs, stored in the cache and given to their pairs a batch per transaction."""

    def __init__(self, comparisons: Comparisons) -> None:
        self._comparisons = comparisons
        self._waiting: list[tuple[PendingPair, PairStats | Exception, list[int]]] = []
        self._written = -math.inf  # when the last batch was written

    def add(self, work: PendingPair, result: PairStats | Exception, pair_ids: list[int]) -> None:
        self._waiting.append((work, result, pair_ids))
        if len(self._waiting) >= FLUSH_RESULTS or time.monotonic() - self._written >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        if not self._waiting:
            return
        try:
            self._write()
        except IntegrityError:  # another process stored one of these meanwhile: a second pass finds and uses it
            self._write()
        self._waiting.clear()
        self._written = time.monotonic()

    def _write(self) -> None:
        comparisons = self._comparisons
        with comparisons.sessions.begin() as db:
            keys = {work.key for work, result, _ in self._waiting if isinstance(result, PairStats)}
            records = {r.cache_key: r for r in db.scalars(select(ComparisonResultRecord).where(
                ComparisonResultRecord.cache_key.in_(keys)))}
            for work, result, pair_ids in self._waiting:
                if isinstance(result, Exception):  # a corrupt chunk: the pair says so, work goes on
                    for pair_id in pair_ids:
                        _fail(db, pair_id, f"{type(result).__name__}: {result}")
                elif work.key not in records:
                    records[work.key] = ComparisonResultRecord(
                        cache_key=work.key, digests_a=list(work.digests_a), digests_b=list(work.digests_b),
                        alignment_key=work.alignment_key, rtol=work.tolerance.rtol, atol=work.tolerance.atol,
                        stats=result.to_json(),
                    )
                    db.add(records[work.key])
            db.flush()  # their ids, for the pairs
            for work, result, pair_ids in self._waiting:
                if isinstance(result, PairStats):
                    _settle(comparisons, db, pair_ids, work.key, records[work.key], work)


def _wants_result(pair: PairRecord) -> bool:
    return pair.status == "pending" and pair.alignment is not None and pair.summary is None


def _settle(comparisons: Comparisons, db: DbSession, pair_ids: list[int], key: str,
            record: ComparisonResultRecord, work: PendingPair | None = None) -> None:
    """Give `record`'s verdict to those of `pair_ids` that still want it. A pair replanned while it computed is
    gone; one re-aligned or given other tolerances meanwhile has another key now, and waits for its own."""
    status = "pass" if PairStats.from_json(record.stats).passed else "fail"
    for pair_id in pair_ids:
        pair = db.get(PairRecord, pair_id)
        if pair is None or not _wants_result(pair):
            continue
        if work is not None:
            session = db.get_one(SessionRecord, pair.session_id)
            if comparisons.key_of(session, pair, work.digests_a, work.digests_b, work.dtypes)[0] != key:
                continue
        pair.result_id, pair.status = record.id, status


def _fail(db: DbSession, pair_id: int, message: str) -> None:
    pair = db.get(PairRecord, pair_id)
    if pair is not None:
        pair.status, pair.error = "error", message[:2000]
