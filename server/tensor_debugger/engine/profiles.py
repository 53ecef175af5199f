"""Error profiles: per index of one aligned dimension, the largest and the mean |difference| and how many elements
are outside the tolerance, folded block by block (bounded memory) with the statistics' rules: a NaN on either side
makes its index's largest difference NaN, counts as a mismatch and stays out of the mean; equal infinities differ
by zero and are close under any rule; an infinite reference is close only to itself; integers differ exactly (then
rounded to float64): engine/elementwise.py's differences and tolerance test."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.elementwise import abs_diff, nan_mask, within_tolerance
from tensor_debugger.engine.tolerances import Tolerance


class ProfileAccumulator:
    """Folds blocks of an aligned pair into the profile along `dim` of the aligned `shape`."""

    def __init__(self, shape: tuple[int, ...], dim: int, tolerance: Tolerance, exact: bool) -> None:
        if not 0 <= dim < len(shape):
            raise ValueError(f"dim must be 0 to {len(shape) - 1} for a tensor of shape {list(shape)}, got {dim}")
        self.dim, self.tol, self.exact = dim, tolerance, exact
        size = shape[dim]
        self.top = np.full(size, -1.0)  # -1: no element yet
        self.nan = np.zeros(size, dtype=bool)
        self.total = np.zeros(size)
        self.valid = np.zeros(size, dtype=np.int64)
        self.mismatched = np.zeros(size, dtype=np.int64)

    def add(self, a: NDArray[Any], b: NDArray[Any], start: int) -> None:
        """Fold a block whose indices along `dim` start at `start`."""
        if a.size == 0:
            return
        nan = nan_mask(a, b)
        diff = abs_diff(a, b, nan)
        outside = ~within_tolerance(a, b, self.tol, self.exact, diff)
        axes = tuple(i for i in range(a.ndim) if i != self.dim)
        stop = start + a.shape[self.dim]
        clean = np.where(nan, 0.0, diff)
        self.top[start:stop] = np.maximum(self.top[start:stop], clean.max(axis=axes, initial=-1.0))
        self.nan[start:stop] |= nan.any(axis=axes)
        self.total[start:stop] += clean.sum(axis=axes)
        self.valid[start:stop] += (~nan).sum(axis=axes)
        self.mismatched[start:stop] += outside.sum(axis=axes)

    def result(self) -> tuple[list[float], list[float], list[int]]:
        """(largest |difference|, mean |difference|, elements outside the tolerance) per index; NaN where a NaN
        met the index (the largest) or where no element was valid (the mean)."""
        top = [math.nan if n else max(float(t), 0.0) for t, n in zip(self.top, self.nan, strict=True)]
        mean = [float(s) / int(v) if v else math.nan for s, v in zip(self.total, self.valid, strict=True)]
        return top, mean, [int(m) for m in self.mismatched]
