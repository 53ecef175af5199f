"""Some pairs as they are now (`CurrentPairs`): whether each still wants the result of a comparison, and giving it
that result or the error met computing it."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.context import CompareContext
from tensor_debugger.compare.planning.sides import pair_key, settled_status
from tensor_debugger.engine.metrics import PairStats
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.errors import is_outage
from tensor_debugger.store.catalog import lock_sessions_of_pairs
from tensor_debugger.store.layout import MissingChunkError
from tensor_debugger.store.models import ComparisonResultRecord, PairRecord, SessionRecord, TensorRecord


class CurrentPairs:
    """Some pairs as they are now, with their tensors and sessions (three queries), to tell whether each still
    wants the result of a comparison: replanning may have deleted a pair, or given its id (SQLite reuses row ids)
    to another pair; re-aligning or new tolerances change its key."""

    def __init__(self, context: CompareContext, db: DbSession, pairs: Sequence[PairRecord]) -> None:
        self._context = context
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
    def by_id(cls, context: CompareContext, db: DbSession, pair_ids: Sequence[int]) -> CurrentPairs:
        if not pair_ids:  # results of no pair yet (compared while their runs ingest): nothing to read
            return cls(context, db, [])
        return cls(context, db, db.scalars(select(PairRecord).where(PairRecord.id.in_(set(pair_ids)))).all())

    @classmethod
    def locked(cls, context: CompareContext, db: DbSession, pair_ids: Sequence[int]) -> CurrentPairs:
        """`by_id`, read once their sessions are locked (`catalog.lock_sessions`), to give them verdicts: a plan
        cannot then delete them and give their ids to other pairs before the verdicts are written."""
        if pair_ids:
            lock_sessions_of_pairs(db, pair_ids)
        return cls.by_id(context, db, pair_ids)

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
        """The pair's cache key, tolerance and exactness now (see `sides.pair_key`), whatever its status."""
        pair, a, b = self.sides(pair_id)
        return pair_key(self.session(pair), pair, a, b, self._context.top)

    def sides(self, pair_id: int) -> tuple[PairRecord, list[TensorRecord], list[TensorRecord]]:
        pair = self.pairs[pair_id]
        return pair, [self.tensors[i] for i in pair.a_tensor_ids], [self.tensors[i] for i in pair.b_tensor_ids]

    def session(self, pair: PairRecord) -> SessionRecord:
        return self.sessions[pair.session_id]

    def settle(self, pair_id: int, key: str, record: ComparisonResultRecord) -> None:
        """Give `record` (the result for `key`) to the pair if that is still its key."""
        if self.key(pair_id) == key:
            pair, a, _ = self.sides(pair_id)
            pair.result_id = record.id
            pair.status, pair.error = settled_status(pair, a, PairStats.from_json(record.stats).passed)
            pair.claimed_by = pair.claimed_until = None

    def _missing_chunk(self, pair_id: int, exc: MissingChunkError) -> str:
        """The pair's error for a chunk missing from one of its tensors' arrays: the chunk, the tensor and its run
        named (the run's row read on this rare path only)."""
        _, a, b = self.sides(pair_id)
        for tensor in (*a, *b):
            if tensor.store_key and f"/{tensor.store_key}/" in exc.chunk:
                return (
                    f"the stored chunk {exc.chunk} of tensor {tensor.name} in run {tensor.run.label} is missing: "
                    "the data dir is damaged"
                )
        return str(exc)

    def fail(self, pair_id: int, key: str, exc: Exception) -> None:
        """What `exc` says of the pair, if `key` (what failed to compute) is still its key: an outage (the store or
        the database did not answer) leaves it pending, held for a backoff and tried again, its `error` saying
        what it waits for; anything else (a missing array, a corrupt chunk) is its verdict, "error"."""
        if self.key(pair_id) != key:
            return
        pair = self.pairs[pair_id]
        message = f"{type(exc).__name__}: {exc}"[:2000]
        if isinstance(exc, MissingChunkError):
            message = self._missing_chunk(pair_id, exc)[:2000]
        if is_outage(exc):
            pair.error = f"waiting to be tried again: {exc}"[:2000]
            hold = self._context.claims.outage_hold()
            pair.claimed_by, pair.claimed_until = hold["claimed_by"], hold["claimed_until"]
            return
        pair.status, pair.error = "error", message
        pair.claimed_by = pair.claimed_until = None
