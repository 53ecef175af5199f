"""Where a pair's largest differences are (`pair_accumulator.PairAccumulator`): the largest |difference| and its
index, and the `top` worst elements with their values, each placed in the aligned tensor from its block's place."""

from __future__ import annotations

import heapq
import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.fused import FusedPartial

# (block origin in aligned coordinates, block shape, aligned shape, offset of this slice in the flat block)
Where = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]
# A worst element, ordered as they rank: (0 for a NaN else 1, -|a - b| (0 for a NaN), aligned flat position, aligned
# index, |a - b|, a, b)
Worst = tuple[int, float, int, tuple[int, ...], float, Any, Any]


class LargestDifferences:
    """The largest difference seen (a NaN outranks all; on ties the first in C order) and the `top` worst
    elements, in rank order."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.worst: list[Worst] = []  # at most `top`, in rank order
        self.max_abs = -1.0
        self.argmax: tuple[int, ...] | None = None
        self.argmax_flat = -1

    def consider_max(self, value: float, is_nan: bool, local: int, where: Where) -> None:
        """Keep the largest difference seen (a NaN outranks all); on ties, the first in C order."""
        current = math.inf if self.argmax is not None and math.isnan(self.max_abs) else self.max_abs
        if value < current:
            return
        origin, block_shape, shape, offset = where
        in_block = np.unravel_index(offset + local, block_shape)
        index = tuple(int(o + i) for o, i in zip(origin, in_block, strict=True))
        flat = int(np.ravel_multi_index(index, shape)) if shape else 0
        if value > current or (value == current and (self.argmax is None or flat < self.argmax_flat)):
            self.max_abs = math.nan if is_nan else value
            self.argmax, self.argmax_flat = index, flat

    def floor(self) -> float:
        """The difference an element must exceed to be among the worst kept (a NaN among them: infinity)."""
        if len(self.worst) < self.top:
            return 0.0
        last = self.worst[-1]
        return math.inf if last[0] == 0 else last[4]

    def take(self, entries: list[Worst]) -> None:
        if entries:
            self.worst = heapq.nsmallest(self.top, self.worst + entries)

    def offer(
        self, diff: NDArray[Any], a64: NDArray[Any], b64: NDArray[Any], nan: NDArray[Any] | None, where: Where
    ) -> None:
        """Keep the worst of a slice's differences `diff` (NaN where `nan`; a NaN compares false below) and values."""
        floor = self.floor()
        above = np.flatnonzero(diff > floor)
        if above.size > self.top:  # the `top` largest, ties at the last included: ranked exactly by `take`
            cut = np.partition(diff[above], above.size - self.top)[above.size - self.top]
            above = above[diff[above] >= cut]
        number = float if diff.dtype.kind in "fc" else int  # exact integer differences stay integers
        entries: list[Worst] = [
            (1, -number(diff[i]), flat, index, number(diff[i]), a64[i].item(), b64[i].item())
            for i, (flat, index) in zip(above, positions(above, where), strict=True)
        ]
        if nan is not None and math.isfinite(floor):
            first = np.flatnonzero(nan)[: self.top]
            entries += [
                (0, 0.0, flat, index, math.nan, a64[i].item(), b64[i].item())
                for i, (flat, index) in zip(first, positions(first, where), strict=True)
            ]
        self.take(entries)

    def fold_fused(self, part: FusedPartial, where: Where) -> None:
        """The largest difference and the worst elements of a finite block as the compiled kernel found them."""
        self.consider_max(part.max_abs, False, part.argmax, where)
        if part.top_n:
            n_top = part.top_n
            at = np.array(part.top_at[:n_top], dtype=np.int64)
            entries = zip(
                positions(at, where), part.top_abs[:n_top], part.top_a[:n_top], part.top_b[:n_top], strict=True
            )
            self.take([(1, -d, flat, index, d, x, y) for (flat, index), d, x, y in entries])

    def merge(self, other: LargestDifferences) -> None:
        self.take(other.worst)
        if other.argmax is None:
            return
        mine = math.inf if math.isnan(self.max_abs) else self.max_abs
        theirs = math.inf if math.isnan(other.max_abs) else other.max_abs
        if self.argmax is None or theirs > mine or (theirs == mine and other.argmax_flat < self.argmax_flat):
            self.max_abs, self.argmax, self.argmax_flat = other.max_abs, other.argmax, other.argmax_flat


def positions(local: NDArray[Any], where: Where) -> list[tuple[int, tuple[int, ...]]]:
    """(aligned flat position, aligned index) of flat positions `local` of the slice `where` says."""
    origin, block_shape, shape, offset = where
    if not shape:
        return [(0, ())] * local.size
    in_block = np.unravel_index(local + offset, block_shape)
    index = np.stack([o + i for o, i in zip(origin, in_block, strict=True)])
    flat = np.ravel_multi_index(tuple(index), shape)
    return [(int(f), tuple(int(i) for i in column)) for f, column in zip(flat, index.T, strict=True)]
