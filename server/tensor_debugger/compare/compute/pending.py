"""Computing a session's pending pairs: set up in batches, compared as one stream of blocks, written back in batches.

Pairs are set up `SETUP_BATCH` at a time with a few queries per batch, and their results are written a batch per
transaction. One pair at a time cost about 3 ms of queries and ORM work in the thread that feeds the comparison;
for tensors of 1 MiB that was more than comparing them (measured: 256 such pairs took 1.0 s, 0.69 s of it there).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Select, func, insert, or_, select
from sqlalchemy.exc import IntegrityError

from tensor_debugger.compare.compute.chunk_loop import chunk_pairs
from tensor_debugger.compare.compute.profiles import ErrorProfile, profile_views, stored_profiles
from tensor_debugger.compare.context import CompareContext
from tensor_debugger.compare.planning.current import CurrentPairs
from tensor_debugger.compare.planning.sides import alignment_key, views_of
from tensor_debugger.engine.alignment import replicas_of, stored_steps
from tensor_debugger.engine.metrics import PairStats
from tensor_debugger.engine.streaming import PairJob, compare_stream
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.engine.views import View
from tensor_debugger.errors import is_outage
from tensor_debugger.store.claims import claimable
from tensor_debugger.store.models import ComparisonResultRecord, PairRecord

ProgressCallback = Callable[[int, int], None]  # (pairs done, pairs to do)
SETUP_BATCH = 64  # pairs set up per round of queries
FLUSH_SECONDS = 0.1  # results are written at most this often (the first at once), so the API's progress stays live
FLUSH_RESULTS = 256  # or when this many are waiting
# Passes at writing a batch of results: each pass that fails found a result another process stored meanwhile (a
# Dask worker, a replica), which the next pass uses; several processes storing a batch's other keys each take one
WRITE_ATTEMPTS = 8
OTHERS_POLL_SECONDS = 0.2  # how often a session's computation looks again at pairs another process holds
T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplicaViews:
    """A replicated pair's aligned views (dim 0: the rank), read again along the rank where the pair fails."""

    a: View
    b: View
    exact: bool


@dataclass(frozen=True)
class PendingPair:
    """A pair being computed, and what its result is stored under."""

    pair_id: int
    key: str  # the cache key (see `context.cache_key`)
    digests_a: tuple[str, ...]
    digests_b: tuple[str, ...]
    alignment_key: str  # the alignment's steps as JSON, as the key hashed them (`sides.alignment_key`)
    tolerance: Tolerance
    replicas: ReplicaViews | None = None  # where one side's shards are replicas (alignment.py: stacked)


def rank_profile(work: PendingPair, result: PairStats | Exception) -> ErrorProfile | None:
    """A failing replicated pair's error profile along the rank (aligned dim 0), kept with its result: which ranks'
    copies differ (pair_reports.py). None for other pairs, or where reading again failed (those ranks stay unknown)."""
    if work.replicas is None or not isinstance(result, PairStats) or result.passed:
        return None
    try:
        profile = profile_views(work.replicas.a, work.replicas.b, 0, work.tolerance, work.replicas.exact)
    except Exception:
        log.exception("the ranks of replicated pair %d could not be read again", work.pair_id)
        return None
    return profile


class Tally:
    """How many pairs a computation has settled of those pending when it began, told to `progress` as they come,
    and whether it was asked to stop (`should_stop`)."""

    def __init__(
        self,
        context: CompareContext,
        session_id: int | None,
        progress: ProgressCallback | None,
        should_stop: Callable[[], bool] | None,
        pair_ids: Sequence[int] | None = None,
    ) -> None:
        with context.sessions() as db:
            self.total = db.scalar(pending_query(session_id, select(func.count()), pair_ids)) or 0
        self.done = 0
        self._progress = progress
        self._should_stop = should_stop

    def settled(self, count: int) -> None:
        self.done += count
        if count and self._progress is not None:
            self._progress(self.done, max(self.total, self.done))

    def stopping(self) -> bool:
        return self._should_stop is not None and self._should_stop()


def compute_pending(
    context: CompareContext,
    session_id: int | None = None,
    progress: ProgressCallback | None = None,
    should_stop: Callable[[], bool] | None = None,
    pair_ids: Sequence[int] | None = None,
) -> int:
    """Compute the pending pairs (of one session, or all, or those of `pair_ids`) that no other process holds,
    claiming them a batch at a time in execution order (store/claims.py); returns how many pairs this call settled.
    Identical comparisons pending together are computed once. For one session without `pair_ids`, pairs another
    process holds are then waited for (taken over should its claim expire), so that the session is settled on return
    unless `should_stop` said to stop."""
    tally = Tally(context, session_id, progress, should_stop, pair_ids)
    settled, stopping = tally.settled, tally.stopping
    waiting: dict[str, list[int]] = {}  # cache key in flight -> pairs with the same key, settled with it

    def jobs() -> Iterator[PairJob[PendingPair]]:
        while not stopping():
            claimed = context.claims.claim_pairs(session_id, SETUP_BATCH, pair_ids)
            if not claimed:
                if session_id is None or pair_ids is not None or not left_to_settle(context, session_id):
                    return
                time.sleep(OTHERS_POLL_SECONDS)
                continue
            outages = context.claims.outages_met
            ready, finished = set_up(context, claimed)
            settled(finished)
            for n, job in enumerate(ready):
                if stopping():
                    return
                if context.claims.outages_met != outages:  # a comparison met an outage: the rest wait with it
                    context.claims.hold_pairs([j.key.pair_id for j in ready[n:]])
                    break
                if job.key.key in waiting:  # the same comparison is already computing: no second pass
                    waiting[job.key.key].append(job.key.pair_id)
                else:
                    waiting[job.key.key] = []
                    yield job

    writer = ResultWriter(context)
    with context.lock:  # one computation at a time per process: the pool is already parallel
        try:
            for work, result in compare_stream(jobs(), context.pool, context.workers + 1, on_tick=writer.tick):
                same = [work.pair_id, *waiting.pop(work.key)]  # not `pair_ids`: jobs() still claims among those
                writer.add(work, result, same)
                settled(len(same))
        finally:
            writer.flush()
            context.claims.release_pairs()  # those not settled (stopped, or failed midway): free for others
    return tally.done


def pending_query(session_id: int | None, query: Select[T], pair_ids: Sequence[int] | None = None) -> Select[T]:
    query = query.select_from(PairRecord).where(PairRecord.status == "pending")
    if pair_ids is not None:
        query = query.where(PairRecord.id.in_(pair_ids))
    return query if session_id is None else query.where(PairRecord.session_id == session_id)


def left_to_settle(context: CompareContext, session_id: int) -> bool:
    """Whether pairs of the session are still pending that this process does not hold: held by another process's
    lease, or free again (another process let them go between this one's claim that found none and this look)."""
    query = pending_query(session_id, select(PairRecord.id)).where(
        or_(PairRecord.claimed_by != context.claims.owner, claimable(PairRecord, time.time()))
    )
    with context.sessions() as db:
        return db.scalar(query.limit(1)) is not None


def set_up(context: CompareContext, pair_ids: Sequence[int]) -> tuple[list[PairJob[PendingPair]], int]:
    """The comparisons that `pair_ids` need, in their order, and how many of them were settled without one: no
    longer pending, a cached result (its verdict given now), or views that cannot be built (the pair says why)."""
    jobs: list[PairJob[PendingPair]] = []
    hits: list[tuple[int, str]] = []
    failed: list[tuple[int, str, Exception]] = []
    with context.sessions() as db:
        current = CurrentPairs.by_id(context, db, pair_ids)
        keyed = [(pair_id, *wanted) for pair_id in pair_ids if (wanted := current.wanted(pair_id)) is not None]
        cached = set(
            db.scalars(
                select(ComparisonResultRecord.cache_key).where(
                    ComparisonResultRecord.cache_key.in_({key for _, key, _, _ in keyed})
                )
            )
        )
        outage: Exception | None = None
        for pair_id, key, tol, exact in keyed:
            if key in cached:
                hits.append((pair_id, key))
            elif outage is not None:  # the store or database did not answer the pair before: nor would it here
                failed.append((pair_id, key, outage))
            else:
                try:
                    jobs.append(pair_job(context, current, pair_id, key, tol, exact))
                except Exception as exc:  # a missing array: the pair says so, work goes on (an outage: it waits)
                    failed.append((pair_id, key, exc))
                    outage = exc if is_outage(exc) else None
    if outage is not None:
        context.claims.outage_met()
    if hits or failed:
        with context.sessions.begin() as db:
            current = CurrentPairs.locked(context, db, [pair_id for pair_id, _ in hits] + [f[0] for f in failed])
            records = {
                r.cache_key: r
                for r in db.scalars(
                    select(ComparisonResultRecord).where(ComparisonResultRecord.cache_key.in_({key for _, key in hits}))
                )
            }
            for pair_id, key in hits:
                current.settle(pair_id, key, records[key])
            for pair_id, key, cause in failed:
                current.fail(pair_id, key, cause)
    return jobs, len(pair_ids) - len(jobs)


class ResultWriter:
    """Results of computed pairs, stored in the cache and given to their pairs a batch per transaction: when one
    arrives or `tick` is called (between blocks) and the last batch was written `FLUSH_SECONDS` ago or more."""

    def __init__(self, context: CompareContext) -> None:
        self._context = context
        self._waiting: list[tuple[PendingPair, PairStats | Exception, list[int], ErrorProfile | None]] = []
        self._written = -math.inf  # when the last batch was written

    def add(self, work: PendingPair, result: PairStats | Exception, pair_ids: list[int]) -> None:
        self._waiting.append((work, result, pair_ids, rank_profile(work, result)))
        if len(self._waiting) >= FLUSH_RESULTS or (isinstance(result, Exception) and is_outage(result)):
            self.flush()
        else:
            self.tick()

    @property
    def waiting(self) -> int:
        """Results not yet written."""
        return len(self._waiting)

    def tick(self) -> None:
        if self._waiting and time.monotonic() - self._written >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        if not self._waiting:
            return
        for attempt in range(WRITE_ATTEMPTS):
            try:
                self._write()
                break
            except IntegrityError:  # another process stored one of these meanwhile: the next pass finds and uses it
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
        self._waiting.clear()
        self._written = time.monotonic()

    def _write(self) -> None:
        with self._context.sessions.begin() as db:
            current = CurrentPairs.locked(self._context, db, [i for _, _, ids, _ in self._waiting for i in ids])
            keys = {work.key for work, result, _, _ in self._waiting if isinstance(result, PairStats)}
            records = {
                r.cache_key: r
                for r in db.scalars(select(ComparisonResultRecord).where(ComparisonResultRecord.cache_key.in_(keys)))
            }
            if any(isinstance(result, Exception) and is_outage(result) for _, result, _, _ in self._waiting):
                self._context.claims.outage_met()
            new: dict[str, dict[str, Any]] = {}
            for work, result, pair_ids, ranks in self._waiting:
                if isinstance(result, Exception):  # a corrupt chunk: the pair says so, work goes on
                    for pair_id in pair_ids:
                        current.fail(pair_id, work.key, result)
                elif work.key not in records and work.key not in new:
                    new[work.key] = dict(
                        cache_key=work.key,
                        digests_a=list(work.digests_a),
                        digests_b=list(work.digests_b),
                        alignment_key=work.alignment_key,
                        rtol=work.tolerance.rtol,
                        atol=work.tolerance.atol,
                        stats=result.to_json(),
                        profiles=None if ranks is None else stored_profiles({0: ranks}),
                    )
            if new:
                # one INSERT of many rows (every row the same columns, None as JSON's null as the ORM wrote it),
                # then their ids in one SELECT: ORM objects went in one INSERT a row, as SQLite's RETURNING of
                # their ids keeps no order (32 results, 32 statements)
                db.execute(insert(ComparisonResultRecord).execution_options(render_nulls=True), list(new.values()))
                records.update(
                    (r.cache_key, r)
                    for r in db.scalars(
                        select(ComparisonResultRecord).where(ComparisonResultRecord.cache_key.in_(list(new)))
                    )
                )
            for work, result, pair_ids, _ in self._waiting:
                if isinstance(result, PairStats):
                    self._context.claims.outage_over()
                    for pair_id in pair_ids:
                        current.settle(pair_id, work.key, records[work.key])


def pair_job(
    context: CompareContext, current: CurrentPairs, pair_id: int, key: str, tol: Tolerance, exact: bool
) -> PairJob[PendingPair]:
    """The comparison the pair wants (`CurrentPairs.wanted`'s key, tolerance and exactness), its views opened."""
    pair, a, b = current.sides(pair_id)
    view_a, view_b, _ = views_of(context.store, pair, a, b)
    digests_a, digests_b = tuple(t.digest for t in a), tuple(t.digest for t in b)
    replicas = ReplicaViews(view_a, view_b, exact) if replicas_of(stored_steps(pair.alignment)) else None
    work = PendingPair(pair_id, key, digests_a, digests_b, alignment_key(pair), tol, replicas)
    top = context.top
    kernel = context.kernel
    reduce = None if tol.ulp else chunk_pairs(view_a, view_b, exact, top, kernel)  # the chunk loop knows no ULPs
    return PairJob(work, view_a, view_b, tol, exact, reduce, top, kernel)
