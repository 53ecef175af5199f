"""Where a candidate's lower precision begins: the first of its recorded tensors in a less precise float dtype
where the reference's is not (a port computing its attention scores in bfloat16 by casts of its own, or under
torch.autocast). One rule for `find_divergence` (live/divergence.py, on the two captures' summaries held in memory)
and for a session's first divergence (compare/reports/pair_reports.py, on the runs' stored tensors)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator

from tensor_debugger.engine.tolerances import less_precise

# one of a candidate's tensors, in its order: (name, dtype, the dtype of its namesake in the reference, None where
# the reference recorded none)
Recorded = tuple[str, str, str | None]


def lowered(candidate: Iterable[Recorded], reference_dtypes: Collection[str]) -> Iterator[tuple[str, str]]:
    """The candidate's tensors, in its order, with their dtype, in a dtype the reference did not record there:
    whose namesake in the reference holds another dtype, or that have no namesake while the reference recorded
    that dtype nowhere (`reference_dtypes`: every dtype it recorded)."""
    for name, dtype, theirs in candidate:
        if theirs != dtype if theirs is not None else dtype not in reference_dtypes:
            yield name, dtype


def least_precise(dtypes: Iterable[str], than: str) -> str | None:
    """The least precise float dtype among `dtypes` that is less precise than `than` (`tolerances.less_precise`),
    else None."""
    found: str | None = None
    for dtype in sorted(set(dtypes)):
        if less_precise(dtype, than) and (found is None or less_precise(dtype, found)):
            found = dtype
    return found


def first_lowered(candidate: Iterable[Recorded], reference_dtypes: Collection[str], dtype: str) -> str | None:
    """The first of `lowered`'s tensors in `dtype`."""
    return next((n for n, lower in lowered(candidate, reference_dtypes) if lower == dtype), None)
