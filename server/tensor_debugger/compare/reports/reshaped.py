"""A module's captured output of another shape on each side, where each side calls that module as often: a
divergence, as `find_divergence` judges it (a convolution given the other's stride makes a shorter sequence, a
router's top-2 weights against a port's top-1). Where one side calls the module more often (a block run row by row
and concatenated), its calls face none of each other's: no divergence, not compared. An input of another shape stays
not compared: it was made by an output before it, or given by the user (two captures fed other inputs)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.reports.pair_report import PairReport
from tensor_debugger.store.models import TensorRecord, UnmatchedRecord
from tensor_debugger.store.reports import PairStatus


def reshaped_pairs(db: DbSession, session_id: int, mine: Sequence[PairReport]) -> set[int]:
    """The ids of the pairs of `mine` (one candidate's) that are a module's output whose two shapes differ, left
    incomparable, where the inputs of that module call were recorded, compared and pass on both sides (else what
    differs may have come in with them: an input of another shape, or one not compared, names nothing here), and
    neither side records a call of that module the other lacks (each side judged by its own module paths: a port's
    may differ from the reference's)."""
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
    unmatched = db.execute(
        select(UnmatchedRecord.run_id, UnmatchedRecord.tensor_ids).where(
            UnmatchedRecord.session_id == session_id,
            UnmatchedRecord.run_id.in_(runs),
            UnmatchedRecord.other_run_id.in_(runs),  # this candidate's, not another's against the reference
        )
    ).all()
    first_ids = {ids[0]: run for run, ids in unmatched if ids}
    sides = {p.b.tensor_ids[0] for p in found if p.b.tensor_ids}
    paths = _module_paths(db, first_ids.keys() | sides)
    # the module calls each run records that the other lacks, by the tensors' own module paths (a name's text would
    # cut a module called `proj_outputs_head` short at its `_outputs_`)
    split = {(first_ids[i], _module(path)) for i, path in paths.items() if i in first_ids}

    def split_call(p: PairReport) -> bool:
        b_path = paths.get(p.b.tensor_ids[0]) if p.b.tensor_ids else None
        return (p.a.run_id, _module(p.module_path or "")) in split or (
            b_path is not None and (p.b.run_id, _module(b_path)) in split
        )

    return {p.id for p in found if not split_call(p)}


def _module_paths(db: DbSession, ids: Iterable[int]) -> dict[int, str]:
    """The module of each of these tensors that is a module call's input or output (not an op's), by tensor id."""
    rows = db.execute(
        select(TensorRecord.id, TensorRecord.module_path, TensorRecord.place).where(TensorRecord.id.in_(list(ids)))
    )
    return {
        i: path
        for i, path, place in rows
        if path is not None and "/" not in path and (place or "").startswith(("inputs", "outputs"))
    }


def _module(path: str) -> str:
    """A module call's path without its call index and the model's class name (a port's may differ):
    "Net.rows.f#2" -> "rows.f"."""
    return re.sub(r"#\d+$", "", path).partition(".")[2]
