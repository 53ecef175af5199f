"""The run page's table, and the name a run is shown by.

A run's tensors are listed in execution order: a tensor that is paired takes its pair's position in the session,
the others follow by layer and name. Each links to its pair (the first, in an explored session)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Protocol

from sqlalchemy import or_, select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.engine.names import natural_key
from tensor_debugger.store import catalog
from tensor_debugger.store.models import PairRecord, RunRecord, TensorRecord


class NamedRun(Protocol):
    label: str
    role: str
    sources: list[str]


def run_title(run: NamedRun) -> str:
    """What the run is called on the pages: its label, or, where that is still the default (its role), the file or
    folder it was uploaded from ("ref.zip", "outputs/"; "a.pth and 3 more files")."""
    if run.label != run.role or not run.sources:
        return run.label
    tops = {PurePosixPath(s).parts[0] for s in run.sources if PurePosixPath(s).parts}
    if len(tops) == 1 and len(run.sources) > 1:
        return f"{tops.pop()}/"
    folder = "/" if run.sources[0].endswith("/") else ""
    first = (PurePosixPath(run.sources[0]).name or run.sources[0]) + folder
    more = len(run.sources) - 1
    return first if not more else f"{first} and {more} more file{'s' if more > 1 else ''}"


@dataclass(frozen=True)
class TensorRow:
    tensor: TensorRecord
    pair_id: int | None
    pair_position: int | None


def run_rows(db: DbSession, run: RunRecord, search: str = "") -> list[TensorRow]:
    """The run's tensors in execution order, each with its pair; `search` keeps the names containing it."""
    tensors = catalog.list_tensors(db, run.id)
    pairs = db.execute(
        select(
            PairRecord.id,
            PairRecord.position,
            PairRecord.run_a_id,
            PairRecord.run_b_id,
            PairRecord.a_tensor_ids,
            PairRecord.b_tensor_ids,
        )
        .where(or_(PairRecord.run_a_id == run.id, PairRecord.run_b_id == run.id))
        .order_by(PairRecord.position)
    ).all()
    first_pair: dict[int, tuple[int, int]] = {}
    for pair_id, position, run_a_id, run_b_id, a_ids, b_ids in pairs:
        ours = (a_ids if run_a_id == run.id else []) + (b_ids if run_b_id == run.id else [])
        for tensor_id in ours:
            first_pair.setdefault(int(tensor_id), (pair_id, position))
    needle = search.strip().lower()
    rows = [
        TensorRow(t, *first_pair.get(t.id, (None, None))) for t in tensors if not needle or needle in t.name.lower()
    ]

    def order(row: TensorRow) -> tuple[int, int, float, tuple[tuple[int, int | str], ...]]:
        paired = row.pair_position is not None
        layer = row.tensor.layer if row.tensor.layer is not None else float("inf")
        return (0 if paired else 1, row.pair_position or 0, layer, natural_key(row.tensor.name))

    return sorted(rows, key=order)
