"""`where` as reports show it: the aligned dimensions that confine a failing pair's error (engine/where.py, stored
with its result), each with its name where the session names the pair's dimensions (engine/dimension_names.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tensor_debugger.engine.dimension_names import dimension_names
from tensor_debugger.engine.error_spans import ErrorSpan


@dataclass(frozen=True)
class StoredWhere:
    """The `where` of a result's stored statistics, decoded alone (null: none stored)."""

    where: list[ErrorSpan] | None = None


@dataclass(frozen=True)
class WhereEntry:
    """An aligned dimension (`dim`, of `size`, named `name` or null) along which a failing pair's error is confined
    to the inclusive index `ranges` that hold 99% of its squared error."""

    dim: int
    name: str | None
    size: int
    ranges: list[list[int]]


def named_where(
    spans: Sequence[ErrorSpan] | None,
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
        dim = span.dim
        entries.append(WhereEntry(dim, labels[dim] if labels else None, span.size, [list(r) for r in span.ranges]))
    return entries
