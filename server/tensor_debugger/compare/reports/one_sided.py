"""The candidate's tensors without partner just before a first divergence: an op the candidate runs and the
reference does not (an extra scale, a cast) has no pair, so the first pair to fail is the one after it."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.reports.pair_report import PairReport
from tensor_debugger.store.models import TensorRecord, UnmatchedRecord


def candidate_only_before(db: DbSession, session_id: int, item: PairReport, previous: PairReport | None) -> list[str]:
    """The candidate's tensors without partner in the reference (allowed or not) that it recorded after
    `previous`'s (the pair before `item` in execution order; None: from the run's start) and before `item`'s, in
    the candidate's order, each "name (file:line)" where an op capture recorded its caller."""
    extra = db.scalars(
        select(UnmatchedRecord).where(
            UnmatchedRecord.session_id == session_id,
            UnmatchedRecord.run_id == item.b.run_id,
            UnmatchedRecord.other_run_id == item.a.run_id,
        )
    ).all()
    if not extra:
        return []
    ids = {i for u in extra for i in u.tensor_ids} | set(item.b.tensor_ids)
    ids |= set(previous.b.tensor_ids) if previous is not None else set()
    rows: dict[int, tuple[int, str | None]] = {
        tensor_id: (position, source)
        for tensor_id, position, source in db.execute(
            select(TensorRecord.id, TensorRecord.position, TensorRecord.source).where(TensorRecord.id.in_(ids))
        )
    }
    upper = _first(rows, item.b.tensor_ids)
    lower = _first(rows, previous.b.tensor_ids) if previous is not None else -1
    found = []
    for u in extra:
        position = _first(rows, u.tensor_ids)
        if lower < position < upper:
            source = rows[u.tensor_ids[0]][1] if u.tensor_ids and u.tensor_ids[0] in rows else None
            found.append((position, f"{u.name} ({source})" if source else u.name))
    return [name for _, name in sorted(found)]


def _first(rows: dict[int, tuple[int, str | None]], tensor_ids: Sequence[int]) -> int:
    """The earliest position of the tensors `tensor_ids` (a logical tensor's shards) in their run."""
    return min((rows[i][0] for i in tensor_ids if i in rows), default=-1)
