"""A module's captured output of another shape on each side, where each side calls that module as often: a
divergence, as `find_divergence` judges it (a convolution given the other's stride makes a shorter sequence, a
router's top-2 weights against a port's top-1). Where one side calls the module more often (a block run row by row
and concatenated), its calls face none of each other's: no divergence, not compared. An input of another shape stays
not compared: it was made by an output before it, or given by the user (two captures fed other inputs)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.reports.pair_report import PairReport
from tensor_debugger.store.models import UnmatchedRecord
from tensor_debugger.store.reports import PairStatus

# a module call's input or output by its tensor's name: "Net.rows.f#2_inputs_args_0" -> "Net.rows.f#2"
_MODULE_PLACE = re.compile(r"^([^/]+?)_(?:inputs_(?:args|kwargs)_.+|outputs(?:_.+)?)$")


def reshaped_pairs(db: DbSession, session_id: int, mine: Sequence[PairReport]) -> set[int]:
    """The ids of the pairs of `mine` (one candidate's) that are a module's output whose two shapes differ, left
    incomparable, where the inputs of that module call were recorded, compared and pass on both sides (else what
    differs may have come in with them: an input of another shape, or one not compared, names nothing here), and
    neither side records a call of that module the other lacks."""
    inputs: dict[str, list[PairReport]] = {}
    for p in mine:
        if p.module_path is not None and "/" not in p.module_path and (p.place or "").startswith("inputs"):
            inputs.setdefault(p.module_path, []).append(p)
    found = [
        p
        for p in mine
        if p.status == PairStatus.INCOMPARABLE
        and p.module_path is not None
        and "/" not in p.module_path
        and (p.place or "").startswith("outputs")
        and p.a.shape != p.b.shape
        and inputs.get(p.module_path)
        and all(i.status == PairStatus.PASS for i in inputs[p.module_path])
    ]
    if not found:
        return set()
    runs = {p.a.run_id for p in found} | {p.b.run_id for p in found}
    unmatched = db.scalars(
        select(UnmatchedRecord.name).where(
            UnmatchedRecord.session_id == session_id,
            UnmatchedRecord.run_id.in_(runs),
            UnmatchedRecord.other_run_id.in_(runs),  # this candidate's, not another's against the reference
        )
    )
    split = {_module(call[1]) for name in unmatched if (call := _MODULE_PLACE.match(name))}
    return {p.id for p in found if _module(p.module_path or "") not in split}


def _module(path: str) -> str:
    """A module call's path without its call index and the model's class name (a port's may differ):
    "Net.rows.f#2" -> "rows.f"."""
    return re.sub(r"#\d+$", "", path).partition(".")[2]
