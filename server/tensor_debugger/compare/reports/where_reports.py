"""`where` as reports show it: the aligned dimensions that confine a failing pair's error (engine/where.py, stored
with its result), each with its name where the session names the pair's dimensions (engine/dimension_names.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tensor_debugger.engine.dimension_names import dimension_names


@dataclass(frozen=True)
class StoredSpan:
    """One entry of a result's stored `where` (engine.where.ErrorSpan.to_json)."""

    dim: int
    size: int
    ranges: list[list[int]]


@dataclass(frozen=True)
class StoredWhere:
    """The `where` of a result's stored statistics, decoded alone (null: none stored)."""

    where: list[StoredSpan] | None = None


@dataclass(frozen=True)
class WhereEntry:
    """An aligned dimension (`dim`, of `size`, named `name` or null) along which a failing pair's error is confined
    to the inclusive index `ranges` that hold 99% of its squared error."""

    dim: int
    name: str | None
    size: int
    ranges: list[list[int]]


def named_where(
    spans: Sequence[StoredSpan] | Sequence[Mapping[str, Any]] | None,
    dims: Mapping[str, str] | None,
    names: Sequence[str],
    aligned_shape: Sequence[int] | None,
) -> list[WhereEntry] | None:
    """The stored spans with the dimension names the session's `dims` gives a pair named `names` (its name, both
    tensors') of `aligned_shape`; None where none is stored."""
    if spans is None:
        return None
    labels = dimension_names(dims, names, len(aligned_shape)) if aligned_shape is not None else None
    entries = []
    for span in spans:
        item = span if isinstance(span, Mapping) else vars(span)
        dim = int(item["dim"])
        entries.append(
            WhereEntry(dim, labels[dim] if labels else None, int(item["size"]), [list(r) for r in item["ranges"]])
        )
    return entries
