"""What lies before a candidate's first divergence, from what the session stores, by the rules `find_divergence`
answers with (engine/op_alignment.crossed, engine/lowered.py, engine/capture_order.py): ops of its module call that
paired by content across call indices (their pairs' strategies), where the candidate's lower precision begins (its
tensors' dtypes against the reference's), the candidate's tensors recorded where the reference records their
partners only after it (the two runs' orders), and the reference's tensor that holds what the candidate's holds
there (content hashes); and what only find_divergence, holding the models, can check of it. A session made by two
plain `capture(level="op")` calls says them too."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.planning.op_pairs import settled_by
from tensor_debugger.compare.reports.compare_report import (
    CrossedOps,
    HeldBefore,
    LoweredFirst,
    ModelCheck,
    RecordedEarly,
)
from tensor_debugger.compare.reports.pair_report import PairReport
from tensor_debugger.engine.capture_order import (
    early_before,
    held_before,
    holds_one_value,
    is_module_input,
)
from tensor_debugger.engine.lowered import Recorded, first_lowered, least_precise, lowered
from tensor_debugger.engine.op_alignment import crossed
from tensor_debugger.engine.tolerances import real_float
from tensor_debugger.store.models import TensorRecord

_ROOT_OUTPUT = re.compile(r"^[^./#]+(#\d+)?_outputs")  # the model's own outputs: "Net_outputs", "Net#2_outputs_1"


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


def recorded_early(
    db: DbSession, mine: Sequence[PairReport], at: int, out_of_step: Collection[int]
) -> list[RecordedEarly]:
    """The candidate's tensors just before `mine[at]` (a first divergence among one candidate's pairs `mine`, in
    execution order) that pair with tensors the reference records only after it (`engine/capture_order.
    early_before`, as find_divergence finds them; the pairs of ops out of step, by id, count as unpaired); [] where
    it is no captured tensor. The candidate's rows up to it are read (names, positions, lines)."""
    item = mine[at]
    if item.module_path is None:
        return []
    paired = {i: p for p in mine if p.id not in out_of_step for i in p.b.tensor_ids}
    upper = db.scalar(select(func.max(TensorRecord.position)).where(TensorRecord.id.in_(item.b.tensor_ids)))
    if upper is None:
        return []
    order: list[str] = []
    lines = _CallLines()
    for tensor_id, name, source, module_path, place in db.execute(
        select(TensorRecord.id, TensorRecord.name, TensorRecord.source, TensorRecord.module_path, TensorRecord.place)
        .where(TensorRecord.run_id == item.b.run_id, TensorRecord.position <= upper)
        .order_by(TensorRecord.position)
    ):
        pair = paired.get(tensor_id)
        logical = pair.b.name if pair is not None else name  # a tensor's shards: one name
        if logical not in lines.of:
            order.append(logical)
            lines.add(logical, source, module_path, place)
    if item.b.name not in lines.of:
        return []
    pairs = [p for p in mine if p.id not in out_of_step]
    reference_lines = _CallLines()
    for p in pairs:
        reference_lines.add(p.a.name, p.a.source, p.module_path, p.place)
    found = early_before(
        order,
        item.b.name,
        {p.b.name: p.a.name for p in pairs},
        {p.a.name: p.position for p in pairs},
        item.position,
        lines.of,
        reference_lines.of,
    )
    return [RecordedEarly(*e) for e in found]


class _CallLines:
    """Each tensor's line, added in its run's order: its own (an op's caller, the line that passed a module's
    input), or for a module call's output, which the capture stores none for, the line that called the module (its
    inputs'), as find_divergence names it."""

    def __init__(self) -> None:
        self.of: dict[str, str] = {}
        self._called: dict[str, str] = {}  # a module call's line, from its first input with one

    def add(self, name: str, source: str | None, module_path: str | None, place: str | None) -> None:
        if source and module_path is not None and place is not None and place.startswith("inputs"):
            self._called.setdefault(module_path, source)
        elif not source and module_path is not None and place is not None and place.startswith("outputs"):
            source = self._called.get(module_path)
        self.of[name] = source or ""


def held_before_of(db: DbSession, item: PairReport) -> HeldBefore | None:
    """The reference's last tensor recorded before `item` (a first divergence) that holds, bit for bit, what the
    candidate's holds there (content hashes of one kind equal: `engine/capture_order.held_before`), with its line;
    None where none does, where the candidate's holds one value (`holds_one_value`), or where it is no captured
    tensor (a dump's order is its files', not execution's)."""
    if item.module_path is None or len(item.a.tensor_ids) != 1 or len(item.b.tensor_ids) != 1:
        return None
    theirs = db.get(TensorRecord, item.b.tensor_ids[0])
    at = db.scalar(select(TensorRecord.position).where(TensorRecord.id == item.a.tensor_ids[0]))
    if theirs is None or at is None or holds_one_value(theirs.numel, theirs.min, theirs.max, theirs.nan_count):
        return None
    hashes = _hashes(theirs.digest, theirs.sketch)
    if not hashes:
        return None
    # the rows of one hash before it (few), then the rule picks the last
    found = db.execute(
        select(TensorRecord.name, TensorRecord.digest, TensorRecord.sketch, TensorRecord.source)
        .where(
            TensorRecord.run_id == item.a.run_id,
            TensorRecord.position < at,
            # what a hash covers, in columns: most rows are left out before their summaries' JSON is read
            TensorRecord.numel == theirs.numel,
            TensorRecord.dtype == theirs.dtype,
            TensorRecord.min == theirs.min,
            TensorRecord.max == theirs.max,
            or_(
                TensorRecord.digest.in_(hashes),
                TensorRecord.sketch["hash"].as_string().in_(hashes),
                TensorRecord.sketch["fold64"].as_string().in_(hashes),
            ),
        )
        .order_by(TensorRecord.position)
    ).all()
    held = held_before([r.name for r in found], {r.name: _hashes(r.digest, r.sketch) for r in found}, hashes)
    if held is None:
        return None
    return HeldBefore(item.b.name, held, next(r.source for r in found if r.name == held) or "")


def outputs_agree(db: DbSession, mine: Sequence[PairReport], missing: Sequence[str]) -> bool:
    """Whether every one of the reference model's own outputs (its root module call's, in one candidate's pairs
    `mine`) paired with a bit-identical one of the candidate's (content hashes of one kind equal), as find_divergence
    says it; False where any has no partner (among `missing`, the reference's tensors without one), or none was
    recorded."""
    if any(_ROOT_OUTPUT.match(name) for name in missing):
        return False
    own = [
        p
        for p in mine
        if p.module_path is not None
        and "." not in p.module_path
        and "/" not in p.module_path
        and (p.place or "").startswith("outputs")
        and len(p.a.tensor_ids) == len(p.b.tensor_ids) == 1
    ]
    if not own:
        return False
    ids = [i for p in own for i in (p.a.tensor_ids[0], p.b.tensor_ids[0])]
    hashes = {
        row.id: _hashes(row.digest, row.sketch)
        for row in db.execute(
            select(TensorRecord.id, TensorRecord.digest, TensorRecord.sketch).where(TensorRecord.id.in_(ids))
        )
    }
    return all(hashes.get(p.a.tensor_ids[0], frozenset()) & hashes.get(p.b.tensor_ids[0], frozenset()) for p in own)


def model_checks(item: PairReport, first_changed: str | None, lowered: LoweredFirst | None) -> list[ModelCheck]:
    """What only find_divergence can check of `item`, a captured op's or module's output that is a first
    divergence: where a pair before it differs within tolerance (`first_changed`), whether its module's outputs
    differ by its own doing (a replay of the module on the reference's inputs); where none does (its inputs agree
    bit for bit), whether its module's parameters or buffers differ; where the candidate computes in a lower
    precision (`lowered`), whether the difference is beyond its rounding (the precision floor). [] for a module's
    input (made by another module) and a dump's tensor."""
    if item.module_path is None or is_module_input(item.a.name):
        return []
    checks = [ModelCheck.GROWN if first_changed is not None else ModelCheck.STATE]
    return checks + ([ModelCheck.FLOOR] if lowered is not None else [])


def _hashes(digest: str, sketch: dict[str, Any] | None) -> frozenset[str]:
    """A row's content hashes, each "<kind>:<hex>": its digest (not a summary row's "none:" placeholder) and its
    summary's hashes."""
    found = {digest} if not digest.startswith("none:") else set()
    if sketch is not None:
        found |= {h for h in (sketch.get("hash"), sketch.get("fold64")) if isinstance(h, str)}
    return frozenset(found)


def _dtypes(db: DbSession, run_id: int) -> Sequence[str]:
    """The dtypes a run's tensors hold, each once."""
    return db.scalars(select(TensorRecord.dtype).where(TensorRecord.run_id == run_id).distinct()).all()
