"""Two facts of what lies before a candidate's first divergence, from what the session stores, by the rules
`find_divergence` answers with (engine/op_alignment.crossed, engine/lowered.py): ops of its module call that paired
by content across call indices (their pairs' strategies), and where the candidate's lower precision begins (its
tensors' dtypes against the reference's). A session made by two plain `capture(level="op")` calls says them too."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.planning.op_pairs import settled_by
from tensor_debugger.compare.reports.compare_report import CrossedOps, LoweredFirst
from tensor_debugger.compare.reports.pair_report import PairReport
from tensor_debugger.engine.lowered import Recorded, first_lowered, least_precise, lowered
from tensor_debugger.engine.op_alignment import crossed
from tensor_debugger.engine.tolerances import real_float
from tensor_debugger.store.models import TensorRecord


def crossed_before(mine: Sequence[PairReport], at: int) -> list[CrossedOps]:
    """The op pairs before `mine[at]` (one candidate's pairs, in execution order) in its module call that their
    contents paired across call indices, each with both sides' lines; [] where it is no captured tensor."""
    item = mine[at]
    if item.module_path is None:
        return []
    before = mine[:at]
    settled = {(p.a.name, p.b.name): how for p in before if (how := settled_by(p.strategy)) is not None}
    if not settled:
        return []
    sides = {(p.a.name, p.b.name): p for p in before}
    found = crossed(settled, [p.a.name for p in before], item.module_path.partition("/")[0])
    return [CrossedOps(a, sides[a, b].a.source or "", b, sides[a, b].b.source or "") for a, b in found]


def lowered_first(db: DbSession, item: PairReport, mine: Sequence[PairReport]) -> LoweredFirst | None:
    """Where the candidate of `item` (a first divergence among its pairs `mine`) begins to record tensors in a less
    precise float dtype than the reference's (its first float tensor's, in its order: the precision it computes
    in), where the reference's are not (`engine/lowered.py`, with a pair's partner as a tensor's namesake): the
    first such captured tensor, with its line. None where there is none, or the candidate's tensors' order is not
    known (no capture or trace recorded them: a dump's). The candidate's rows are read only where it holds a dtype
    less precise than that."""
    everywhere = set(_dtypes(db, item.a.run_id))
    floats = [d for d in everywhere if real_float(d)]
    than = db.scalars(
        select(TensorRecord.dtype)
        .where(TensorRecord.run_id == item.a.run_id, TensorRecord.dtype.in_(floats))
        .order_by(TensorRecord.position)
        .limit(1)
    ).first()
    if than is None or least_precise(_dtypes(db, item.b.run_id), than) is None:
        return None  # nothing less precise recorded: the candidate's rows are not read
    partner = {i: p.a.dtype for p in mine for i in p.b.tensor_ids}
    rows = db.execute(
        select(TensorRecord.id, TensorRecord.name, TensorRecord.dtype, TensorRecord.module_path, TensorRecord.source)
        .where(TensorRecord.run_id == item.b.run_id)
        .order_by(TensorRecord.position)
    ).all()
    if any(row.module_path is None for row in rows):
        return None
    recorded: list[Recorded] = [(row.name, row.dtype, partner.get(row.id)) for row in rows]
    dtype = least_precise({d for _, d in lowered(recorded, everywhere)}, than)
    name = None if dtype is None else first_lowered(recorded, everywhere, dtype)
    if name is None or dtype is None:
        return None
    source = next(row.source for row in rows if row.name == name)
    return LoweredFirst(name, source or "", dtype)


def _dtypes(db: DbSession, run_id: int) -> Sequence[str]:
    """The dtypes a run's tensors hold, each once."""
    return db.scalars(select(TensorRecord.dtype).where(TensorRecord.run_id == run_id).distinct()).all()
