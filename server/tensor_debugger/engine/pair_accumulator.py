"""A pair's statistics (`metrics.PairStats`), accumulated block by block: in float64 (complex128 for complex
values), exactly for integer pairs (`numpy_folds.py`), or by the compiled kernel (`fused.py`); `merge` combines the
partials of blocks done apart. What the blocks add up is in `pair_sums.py`, where the largest differences are in
`largest_differences.py`, and the statistics are finished by `finished_stats.py`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.finished_stats import finished_stats
from tensor_debugger.engine.fused import FusedPartial, Kernel, default_kernel, top_limit
from tensor_debugger.engine.largest_differences import LargestDifferences, Where
from tensor_debugger.engine.metrics import DEFAULT_TOP, PairStats, edges
from tensor_debugger.engine.numpy_folds import SLICE, NumpyFolds, past_float64
from tensor_debugger.engine.pair_sums import PairSums
from tensor_debugger.engine.tolerances import Tolerance


class PairAccumulator:
    """Partial statistics of some blocks; `merge` combines partials (blocks may be done in parallel)."""

    def __init__(self, tolerance: Tolerance, exact: bool, top: int = DEFAULT_TOP, kernel: Kernel | None = None) -> None:
        """`top`: how many worst elements to keep (0 to fused.top_limit()); `kernel`: the statistics path (the
        default kernel where None: fused.default_kernel)."""
        if not 0 <= top <= top_limit():
            raise ValueError(f"the number of worst elements must be 0 to {top_limit()}, got {top}")
        self.tol = tolerance
        self.exact = exact
        self.top = top
        self.kernel = kernel if kernel is not None else default_kernel()
        self.sums = PairSums()
        self.largest = LargestDifferences(top)
        self._numpy = NumpyFolds(self.sums, self.largest, tolerance, exact)

    def add(self, a: NDArray[Any], b: NDArray[Any], origin: tuple[int, ...], shape: tuple[int, ...]) -> None:
        """Fold in one block: `a` and `b` hold the same aligned region (same shape), which starts at `origin`
        of the aligned tensor of shape `shape`."""
        n = a.size
        self.sums.numel += n
        if n == 0:
            return
        if self.exact:
            self.sums.mismatched += int(np.count_nonzero(a != b))
        flat_a, flat_b = a.reshape(-1), b.reshape(-1)
        if a.dtype.kind in "iub" and b.dtype.kind in "iub":
            self.sums.integers = True
            if past_float64(flat_a) or past_float64(flat_b):
                self._numpy.integers(flat_a, flat_b, (origin, a.shape, shape, 0))
                return
        if a.dtype.kind == "c" or b.dtype.kind == "c":
            self._numpy.complex(flat_a, flat_b, (origin, a.shape, shape, 0))
            return
        if self._add_fused(flat_a, flat_b, (origin, a.shape, shape, 0)):
            return
        self._numpy.reals(flat_a, flat_b, (origin, a.shape, shape, 0))

    def add_fused(
        self, part: FusedPartial, origin: tuple[int, ...], block_shape: tuple[int, ...], shape: tuple[int, ...]
    ) -> bool:
        """Fold in a block's statistics as the compiled kernel computed them elsewhere (chunk_loop: read, decoded
        and reduced chunk by chunk), with this accumulator's tolerance and `edges()`, for the block of
        `block_shape` at `origin` of the aligned tensor of shape `shape`: True, or False (nothing folded in) where
        the block holds a NaN or an Inf, which only `add` counts."""
        n = math.prod(block_shape)
        self.sums.numel += n
        if self._fold(part, n, (origin, block_shape, shape, 0)):
            return True
        self.sums.numel -= n
        return False

    def _add_fused(self, a: NDArray[Any], b: NDArray[Any], where: Where) -> bool:
        """The whole block in one pass of the compiled kernel, when it is in use and the block is finite (else
        False, and nothing is folded in)."""
        ulp = bool(self.tol.ulp) and not self.exact  # the kernel tests rtol and atol only: ULPs are counted here
        part = self.kernel.partial(a, b, self.tol.atol, self.tol.rtol, not self.exact and not ulp, edges(), self.top)
        if part is None or not self._fold(part, a.size, where):
            return False
        if ulp:
            for start in range(0, a.size, SLICE):
                x = a[start : start + SLICE].astype(np.float64)
                outside = np.abs(x - b[start : start + SLICE]) > self.tol.bound(np.abs(x))
                self.sums.mismatched += int(np.count_nonzero(outside))
        return True

    def _fold(self, part: FusedPartial, n: int, where: Where) -> bool:
        """Fold in the kernel's statistics of `n` elements: False (nothing folded in) where they are not finite."""
        if not (math.isfinite(part.norm_a) and math.isfinite(part.norm_b)):
            return False
        self.sums.fold_fused(part, n, self.exact)
        self.largest.fold_fused(part, where)
        return True

    def merge(self, other: PairAccumulator) -> None:
        self.sums.merge(other.sums)
        self.largest.merge(other.largest)

    def result(self) -> PairStats:
        return finished_stats(self.sums, self.largest, self.tol)
