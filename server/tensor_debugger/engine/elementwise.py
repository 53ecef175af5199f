"""Element-wise differences of two aligned blocks, with the rules every statistic follows (engine/pair_accumulator.py
folds them; the heatmap, the value inspector and the error profiles read them), so that what a page shows of an
element is what the pair's statistics counted:

- |candidate - reference| is float64 (its magnitude for complex values); a NaN on either side makes it NaN; equal
  values differ by zero (equal infinities included); integers and bools differ exactly (64-bit values past float64's
  2**53 included), then rounded to float64.
- An element is within the tolerance when |difference| <= the tolerance's bound at |reference| (atol + rtol *
  |reference|, or its ULPs: Tolerance.bound), except that an infinite reference is within it only of itself, and equal
  values are within any tolerance; NaN never is. Exact pairs (integers, bools) are within only where equal.
- The largest difference: a NaN outranks every number; on ties, the first in C order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.tolerances import Tolerance


def wide_dtype(a: NDArray[Any], b: NDArray[Any]) -> type[np.floating[Any]] | type[np.complexfloating[Any, Any]]:
    """What the statistics compute a pair's values in: complex128 where either side is complex, else float64."""
    return np.complex128 if a.dtype.kind == "c" or b.dtype.kind == "c" else np.float64


def integer_differences(a: NDArray[Any], b: NDArray[Any]) -> NDArray[Any]:
    """|a - b| of integer (or bool) vectors, exactly: uint64 (the difference of two 64-bit integers is below 2**64,
    and wrapping subtraction of the larger minus the smaller gives it), or Python ints for int64 against uint64
    values that neither 64-bit type holds both of."""
    wide: np.dtype[Any]
    if a.dtype.kind == "i" and b.dtype.kind == "i":
        wide = np.dtype(np.int64)
    elif a.dtype.kind != "i" and b.dtype.kind != "i":
        wide = np.dtype(np.uint64)
    else:
        signed, unsigned = (a, b) if a.dtype.kind == "i" else (b, a)
        if signed.size == 0 or int(signed.min()) >= 0:
            wide = np.dtype(np.uint64)
        elif int(unsigned.max()) < 1 << 63:
            wide = np.dtype(np.int64)
        else:
            return np.asarray(np.abs(a.astype(object) - b.astype(object)), dtype=object)
    x, y = a.astype(wide), b.astype(wide)
    ux, uy = x.view(np.uint64), y.view(np.uint64)
    return np.where(x >= y, ux - uy, uy - ux)


def is_integer_pair(a: NDArray[Any], b: NDArray[Any]) -> bool:
    return a.dtype.kind in "iub" and b.dtype.kind in "iub"


def nan_mask(a: NDArray[Any], b: NDArray[Any]) -> NDArray[Any]:
    """Where either side is NaN (never for integers)."""
    if is_integer_pair(a, b):
        return np.zeros(np.broadcast_shapes(a.shape, b.shape), dtype=bool)
    return np.asarray(np.isnan(a) | np.isnan(b))


def abs_diff(a: NDArray[Any], b: NDArray[Any], nan: NDArray[Any] | None = None) -> NDArray[Any]:
    """|b - a| per element, float64, by the statistics' rules (the module's docstring). `nan`: `nan_mask(a, b)`,
    where the caller has it already."""
    if is_integer_pair(a, b):
        return np.asarray(integer_differences(a, b)).astype(np.float64)
    wide = wide_dtype(a, b)
    x, y = np.asarray(a, dtype=wide), np.asarray(b, dtype=wide)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(x - y)
    diff[x == y] = 0.0  # equal infinities are equal
    diff[nan_mask(x, y) if nan is None else nan] = np.nan
    return np.asarray(diff, dtype=np.float64)


def signed_diff(a: NDArray[Any], b: NDArray[Any]) -> NDArray[Any]:
    """b - a per element (float64; complex128 for complex values), whose magnitude is `abs_diff`: zero where equal
    (equal infinities included), NaN where either side is NaN; integers' from their exact difference."""
    magnitude = abs_diff(a, b)
    if is_integer_pair(a, b):
        sign = np.greater(b, a).astype(np.float64) - np.less(b, a)
        return np.asarray(sign * magnitude)
    wide = wide_dtype(a, b)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.asarray(b, dtype=wide) - np.asarray(a, dtype=wide)
    diff[magnitude == 0] = 0
    diff[np.isnan(magnitude)] = np.nan
    return diff


def within_tolerance(
    a: NDArray[Any], b: NDArray[Any], tolerance: Tolerance, exact: bool, diff: NDArray[Any] | None = None
) -> NDArray[Any]:
    """Whether each element is within the tolerance, by the statistics' rules (the module's docstring): the
    complement is what they count as mismatched. `diff`: `abs_diff(a, b)`, where the caller has it already."""
    if exact:
        return np.asarray(a == b)
    wide = wide_dtype(a, b)
    x, y = np.asarray(a, dtype=wide), np.asarray(b, dtype=wide)
    magnitude = np.abs(x)
    if diff is None:
        diff = abs_diff(x, y)
    with np.errstate(invalid="ignore"):
        close = np.asarray(diff <= tolerance.bound(magnitude))
    close &= ~np.isinf(x)  # an infinite reference is within a tolerance only of itself ...
    close |= x == y  # ... and equal values are within any (infinities of one sign too); NaN never
    return close


def largest(diff: NDArray[Any]) -> int | None:
    """The flat position of the largest of differences `diff` (`abs_diff`'s), as the statistics' argmax ranks them
    (a NaN first; on ties, the first in C order); None for none."""
    if diff.size == 0:
        return None
    flat = diff.reshape(-1)
    nan = np.isnan(flat)
    return int(np.argmax(nan)) if nan.any() else int(np.argmax(flat))


class CellMaxima:
    """The largest |difference| per cell of a grid over a 2-D slice (max pooling: no spike hides in an average), and
    the sign (-1, 0, 1) of the difference (candidate - reference) that has it, folded from blocks of whole rows.
    A cell is NaN where any of its elements is; complex differences have no sign: theirs is that of their magnitude."""

    def __init__(self, row_edges: Sequence[int], col_edges: Sequence[int]) -> None:
        self.row_edges, self.col_edges = list(row_edges), list(col_edges)
        shape = (len(self.row_edges) - 1, len(self.col_edges) - 1)
        self.cells = np.zeros(shape)
        self.highest = np.full(shape, -np.inf)  # the largest and the smallest signed difference per cell
        self.lowest = np.full(shape, np.inf)
        self.nan = np.zeros(shape, dtype=bool)
        self.col_starts = np.asarray(self.col_edges[:-1])

    def add(self, a: NDArray[Any], b: NDArray[Any], start: int) -> None:
        """Fold the rows `start` to `start + len(a)` of the slice (2-D blocks of both sides, all its columns)."""
        stop = start + a.shape[0]
        signed = signed_diff(a, b)
        diff = np.abs(signed) if signed.dtype.kind == "c" else abs_diff(a, b)
        nan = np.isnan(diff)
        diff = np.where(nan, 0.0, diff)
        real = diff if signed.dtype.kind == "c" else np.where(nan, 0.0, signed)
        for r in range(len(self.row_edges) - 1):
            lo, hi = max(self.row_edges[r], start), min(self.row_edges[r + 1], stop)
            if lo >= hi:
                continue
            rows = slice(lo - start, hi - start)
            self.cells[r] = np.maximum(self.cells[r], np.maximum.reduceat(diff[rows].max(axis=0), self.col_starts))
            part = real[rows]
            self.highest[r] = np.maximum(self.highest[r], np.maximum.reduceat(part.max(axis=0), self.col_starts))
            self.lowest[r] = np.minimum(self.lowest[r], np.minimum.reduceat(part.min(axis=0), self.col_starts))
            self.nan[r] |= np.logical_or.reduceat(nan[rows].any(axis=0), self.col_starts)

    def result(self) -> tuple[NDArray[Any], NDArray[Any]]:
        """(largest |difference| per cell, NaN where any element was NaN; the sign of the difference that has it)."""
        signs = np.where(self.highest >= -self.lowest, np.sign(self.highest), np.sign(self.lowest))
        cells = self.cells.copy()
        cells[self.nan] = np.nan
        return cells, signs
