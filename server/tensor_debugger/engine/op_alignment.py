"""Align two implementations' lists of ops inside one module: a sequence alignment on each op's key (its name and
its output's shape), so that where one side calls ops the other does not (a fused kernel against the ops it
fuses, an extra cast), the ops both call still face each other and the rest are listed, in place, as one side's
only."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from difflib import SequenceMatcher


def align_ops(a: Sequence[Hashable], b: Sequence[Hashable]) -> list[tuple[int | None, int | None]]:
    """(index in `a`, index in `b`) for each row of the alignment, in order: both where the keys are equal (a
    longest matching subsequence), one None where an op is on one side only (the reference's first where both
    sides have ops between two matches)."""
    rows: list[tuple[int | None, int | None]] = []
    matcher = SequenceMatcher(None, list(a), list(b), autojunk=False)
    for tag, a_start, a_end, b_start, b_end in matcher.get_opcodes():
        if tag == "equal":
            rows.extend(zip(range(a_start, a_end), range(b_start, b_end), strict=True))
            continue
        rows.extend((i, None) for i in range(a_start, a_end))
        rows.extend((None, j) for j in range(b_start, b_end))
    return rows
