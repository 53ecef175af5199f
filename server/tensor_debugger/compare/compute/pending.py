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
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Select, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.compute.chunk_loop import chunk_pairs
from tensor_debugger.compare.reports.profiles import profile_views
from tensor_debugger.engine.alignment import replicas_of
from tensor_debugger.engine.metrics import PairStats
from tensor_debugger.engine.streaming import PairJob, compare_stream
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.engine.views import View
from tensor_debugger.errors import is_outage
from tensor_debugger.store.catalog import lock_sessions_of_pairs
from tensor_debugger.store.claims import claimable
from tensor_debugger.store.models import ComparisonResultRecord, PairRecord, SessionRecord, TensorRecord

if TYPE_CHECKING:
    from tensor_debugger.compare.planning.plan import Comparisons

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
    key: str  # the cache key (see `comparisons.cache_key`)
    digests_a: tuple[str, ...]
    digests_b: tuple[str, ...]
    alignment_key: str  # the alignment's steps as JSON, as the key hashed them (`Comparisons.alignment_key`)
    tolerance: Tolerance
    replicas: ReplicaViews | None = None  # where one side's shards are replicas (alignment.py: stacked)


def rank_profiles(work: PendingPair, result: PairStats | Exception) -> dict[str, Any] | None:
    """A failing replicated pair's error profile along the rank (aligned dim 0), kept with its result: which ranks'
    copies differ (pair_reports.py). None for other pairs, or where reading again failed (those ranks stay unknown)."""
    if work.replicas is None or not isinstance(result, PairStats) or result.passed:
        return None
    try:
        profile = profile_views(work.replicas.a, work.replicas.b, 0, work.tolerance, work.replicas.exact)
    except Exception:
        log.exception("the ranks of replicated pair %d could not be read again", work.pair_id)
        return None
    return {"0": asdict(profile)}


class Tally:
    """How many pairs a computation has settled of those pending when it began, told to `progress` as they come,
    and whether it was asked to stop (`should_stop`)."""

    def __init__(
        self,
        comparisons: Comparisons,
        session_id: int | None,
        progress: ProgressCallback | None,
        should_stop: Callable[[], bool] | None,
        pair_ids: Sequence[int] | None = None,
    ) -> None:
        with comparisons.sessions() as db:
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
    comparisons: Comparisons,
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
    tally = Tally(comparisons, session_id, progress, should_stop, pair_ids)
    settled, stopping = tally.settled, tally.stopping
    waiting: dict[str, list[int]] = {}  # cache key in flight -> pairs with the same key, settled with it

    def jobs() -> Iterator[PairJob[PendingPair]]:
        while not stopping():
            claimed = comparisons.claims.claim_pairs(session_id, SETUP_BATCH, pair_ids)
            if not claimed:
                if session_id is None or pair_ids is not None or not left_to_settle(comparisons, session_id):
                    return
                time.sleep(OTHERS_POLL_SECONDS)
                continue
            outages = comparisons.claims.outages_met
            ready, finished = set_up(comparisons, claimed)
            settled(finished)
            for n, job in enumerate(ready):
                if stopping():
                    return
                if comparisons.claims.outages_met != outages:  # a comparison met an outage: the rest wait with it
                    comparisons.claims.hold_pairs([j.key.pair_id for j in ready[n:]])
                    break
                if job.key.key in waiting:  # the same comparison is already computing: no second pass
                    waiting[job.key.key].append(job.key.pair_id)
                else:
                    waiting[job.key.key] = []
                    yield job

    writer = ResultWriter(comparisons)
    with comparisons.lock:  # one computation at a time per process: the pool is already parallel
        try:
            for work, result in compare_stream(jobs(), comparisons.pool, comparisons.workers + 1, on_tick=writer.tick):
                same = [work.pair_id, *waiting.pop(work.key)]  # not `pair_ids`: jobs() still claims among those
                writer.add(work, result, same)
                settled(len(same))
        finally:
            writer.flush()
            comparisons.claims.release_pairs()  # those not settled (stopped, or failed midway): free for others
    return tally.done


def pending_query(session_id: int | None, query: Select[T], pair_ids: Sequence[int] | None = None) -> Select[T]:
    query = query.select_from(PairRecord).where(PairRecord.status == "pending")
    if pair_ids is not None:
        query = query.where(PairRecord.id.in_(pair_ids))
    return query if session_id is None else query.where(PairRecord.session_id == session_id)


def left_to_settle(comparisons: Comparisons, session_id: int) -> bool:
    """Whether pairs of the session are still pending that this process does not hold: held by another process's
    lease, or free again (another process let them go between this one's claim that found none and this look)."""
    query = pending_query(session_id, select(PairRecord.id)).where(
        or_(PairRecord.claimed_by != comparisons.claims.owner, claimable(PairRecord, time.time()))
    )
    with comparisons.sessions() as db:
        return db.scalar(query.limit(1)) is not None


def set_up(comparisons: Comparisons, pair_ids: Sequence[int]) -> tuple[list[PairJob[PendingPair]], int]:
    """The comparisons that `pair_ids` need, in their order, and how many of them were settled without one: no
    longer pending, a cached result (its verdict given now), or views that cannot be built (the pair says why)."""
    jobs: list[PairJob[PendingPair]] = []
    hits: list[tuple[int, str]] = []
    failed: list[tuple[int, str, Exception]] = []
    with comparisons.sessions() as db:
        current = CurrentPairs.by_id(comparisons, db, pair_ids)
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
                    jobs.append(current.job(pair_id, key, tol, exact))
                except Exception as exc:  # a missing array: the pair says so, work goes on (an outage: it waits)
                    failed.append((pair_id, key, exc))
                    outage = exc if is_outage(exc) else None
    if outage is not None:
        comparisons.claims.outage_met()
    if hits or failed:
        with comparisons.sessions.begin() as db:
            current = CurrentPairs.locked(comparisons, db, [pair_id for pair_id, _ in hits] + [f[0] for f in failed])
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

    def __init__(self, comparisons: Comparisons) -> None:
        self._comparisons = comparisons
        self._waiting: list[tuple[PendingPair, PairStats | Exception, list[int], dict[str, Any] | None]] = []
        self._written = -math.inf  # when the last batch was written

    def add(self, work: PendingPair, result: PairStats | Exception, pair_ids: list[int]) -> None:
        self._waiting.append((work, result, pair_ids, rank_profiles(work, result)))
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
        with self._comparisons.sessions.begin() as db:
            current = CurrentPairs.locked(self._comparisons, db, [i for _, _, ids, _ in self._waiting for i in ids])
            keys = {work.key for work, result, _, _ in self._waiting if isinstance(result, PairStats)}
            records = {
                r.cache_key: r
                for r in db.scalars(select(ComparisonResultRecord).where(ComparisonResultRecord.cache_key.in_(keys)))
            }
            if any(isinstance(result, Exception) and is_outage(result) for _, result, _, _ in self._waiting):
                self._comparisons.claims.outage_met()
            for work, result, pair_ids, profiles in self._waiting:
                if isinstance(result, Exception):  # a corrupt chunk: the pair says so, work goes on
                    for pair_id in pair_ids:
                        current.fail(pair_id, work.key, result)
                elif work.key not in records:
                    records[work.key] = ComparisonResultRecord(
                        cache_key=work.key,
                        digests_a=list(work.digests_a),
                        digests_b=list(work.digests_b),
                        alignment_key=work.alignment_key,
                        rtol=work.tolerance.rtol,
                        atol=work.tolerance.atol,
                        stats=result.to_json(),
                        profiles=profiles,
                    )
                    db.add(records[work.key])
            db.flush()  # their ids, for the pairs
            for work, result, pair_ids, _ in self._waiting:
                if isinstance(result, PairStats):
                    self._comparisons.claims.outage_over()
                    for pair_id in pair_ids:
                        current.settle(pair_id, work.key, records[work.key])


class CurrentPairs:
    """Some pairs as they are now, with their tensors and sessions (three queries), to tell whether each still
    wants the result of a comparison: replanning may have deleted a pair, or given its id (SQLite reuses row ids)
    to another pair; re-aligning or new tolerances change its key."""

    def __init__(self, comparisons: Comparisons, db: DbSession, pairs: Sequence[PairRecord]) -> None:
        self._comparisons = comparisons
        self.pairs = {p.id: p for p in pairs}
        self.tensors: dict[int, TensorRecord] = {}
        self.sessions: dict[int, SessionRecord] = {}
        if not self.pairs:
            return
        self.tensors = {
            t.id: t
            for t in db.scalars(
                select(TensorRecord).where(
                    TensorRecord.id.in_({i for p in self.pairs.values() for i in (*p.a_tensor_ids, *p.b_tensor_ids)})
                )
            )
        }
        self.sessions = {
            s.id: s
            for s in db.scalars(
                select(SessionRecord).where(SessionRecord.id.in_({p.session_id for p in self.pairs.values()}))
            )
        }

    @classmethod
    def by_id(cls, comparisons: Comparisons, db: DbSession, pair_ids: Sequence[int]) -> CurrentPairs:
        if not pair_ids:  # results of no pair yet (compared while their runs ingest): nothing to read
            return cls(comparisons, db, [])
        return cls(comparisons, db, db.scalars(select(PairRecord).where(PairRecord.id.in_(set(pair_ids)))).all())

    @classmethod
    def locked(cls, comparisons: Comparisons, db: DbSession, pair_ids: Sequence[int]) -> CurrentPairs:
        """`by_id`, read once their sessions are locked (`catalog.lock_sessions`), to give them verdicts: a plan
        cannot then delete them and give their ids to other pairs before the verdicts are written."""
        if pair_ids:
            lock_sessions_of_pairs(db, pair_ids)
        return cls.by_id(comparisons, db, pair_ids)

    def key(self, pair_id: int) -> str | None:
        """The pair's cache key now; None where it wants no result (gone, settled, incomparable, summary-only)."""
        wanted = self.wanted(pair_id)
        return None if wanted is None else wanted[0]

    def wanted(self, pair_id: int) -> tuple[str, Tolerance, bool] | None:
        """`keyed`, where the pair wants a result; else None (see `key`)."""
        pair = self.pairs.get(pair_id)
        if pair is None or pair.status != "pending" or pair.alignment is None or pair.summary is not None:
            return None
        if any(i not in self.tensors for i in (*pair.a_tensor_ids, *pair.b_tensor_ids)):
            return None  # deleted meanwhile, with its run: so is the pair
        return self.keyed(pair_id)

    def keyed(self, pair_id: int) -> tuple[str, Tolerance, bool]:
        """The pair's cache key, tolerance and exactness now (see `Comparisons.key`), whatever its status."""
        pair, a, b = self.sides(pair_id)
        return self._comparisons.key(self.session(pair), pair, a, b)

    def job(self, pair_id: int, key: str, tol: Tolerance, exact: bool) -> PairJob[PendingPair]:
        """The comparison the pair wants (`wanted`'s key, tolerance and exactness), its views opened."""
        pair, a, b = self.sides(pair_id)
        view_a, view_b, _ = self._comparisons.views_of(pair, a, b)
        digests_a, digests_b = tuple(t.digest for t in a), tuple(t.digest for t in b)
        replicas = ReplicaViews(view_a, view_b, exact) if replicas_of((pair.alignment or {}).get("steps", [])) else None
        work = PendingPair(pair_id, key, digests_a, digests_b, self._comparisons.alignment_key(pair), tol, replicas)
        top = self._comparisons.top
        reduce = None if tol.ulp else chunk_pairs(view_a, view_b, exact, top)  # the chunk loop knows no ULPs
        return PairJob(work, view_a, view_b, tol, exact, reduce, top)

    def sides(self, pair_id: int) -> tuple[PairRecord, list[TensorRecord], list[TensorRecord]]:
        pair = self.pairs[pair_id]
        return pair, [self.tensors[i] for i in pair.a_tensor_ids], [self.tensors[i] for i in pair.b_tensor_ids]

    def session(self, pair: PairRecord) -> SessionRecord:
        return self.sessions[pair.session_id]

    def settle(self, pair_id: int, key: str, record: ComparisonResultRecord) -> None:
        """Give `record` (the result for `key`) to the pair if that is still its key."""
        if self.key(pair_id) == key:
            pair = self.pairs[pair_id]
            pair.result_id = record.id
            pair.status = "pass" if PairStats.from_json(record.stats).passed else "fail"
            pair.claimed_by = pair.claimed_until = pair.error = None

    def fail(self, pair_id: int, key: str, exc: Exception) -> None:
        """What `exc` says of the pair, if `key` (what failed to compute) is still its key: an outage (the store or
        the database did not answer) leaves it pending, held for a backoff and tried again, its `error` saying
        what it waits for; anything else (a missing array, a corrupt chunk) is its verdict, "error"."""
        if self.key(pair_id) != key:
            return
        pair = self.pairs[pair_id]
        message = f"{type(exc).__name__}: {exc}"[:2000]
        if is_outage(exc):
            pair.error = f"waiting to be tried again: {exc}"[:2000]
            hold = self._comparisons.claims.outage_hold()
            pair.claimed_by, pair.claimed_until = hold["claimed_by"], hold["claimed_until"]
            return
        pair.status, pair.error = "error", message
        pair.claimed_by = pair.claimed_until = None
