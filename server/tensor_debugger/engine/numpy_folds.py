"""The numpy reference of a pair's statistics (`pair_accumulator.PairAccumulator`; `fused.py` is the fast path): a
block's values folded into `PairSums` and `LargestDifferences` slice by slice, one way per family of values: real
values in float64, finite ones without masks (`finite`) and any others with NaN and Inf counted (`general`), complex
values in complex128, and integers past 2**52 with their differences exact (`integers`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.elementwise import abs_diff, integer_differences, largest, within_tolerance
from tensor_debugger.engine.largest_differences import LargestDifferences, Where
from tensor_debugger.engine.pair_sums import PairSums
from tensor_debugger.engine.scaled_sums import Scaled, products, real_dot, sum_squares
from tensor_debugger.engine.tolerances import Tolerance

SLICE = 1 << 16  # elements per step: 512 KiB of float64 per temporary
_EXACT_FLOAT = 1 << 52  # integers of at most this magnitude, and their differences, are exact in float64


class NumpyFolds:
    """Folds flat blocks into `sums` and `largest` with numpy, under `tolerance` (or, `exact`, any difference a
    mismatch: the caller counts those)."""

    def __init__(self, sums: PairSums, largest: LargestDifferences, tolerance: Tolerance, exact: bool) -> None:
        self.sums = sums
        self.largest = largest
        self.tol = tolerance
        self.exact = exact

    def reals(self, flat_a: NDArray[Any], flat_b: NDArray[Any], where: Where) -> None:
        """Real values of any dtype, of the flat block `where` says (its offset 0).

        Slices small enough for the float64 temporaries to stay in cache, in buffers reused from slice to slice;
        offsets keep the argmax exact."""
        origin, block, shape, _ = where
        n = flat_a.size
        buffers = _Buffers(min(n, SLICE))
        with np.errstate(over="ignore", invalid="ignore"):  # overflow gives inf, as it should
            for start in range(0, n, SLICE):
                stop = min(start + SLICE, n)
                a64, b64 = buffers.a[: stop - start], buffers.b[: stop - start]
                np.copyto(a64, flat_a[start:stop], casting="unsafe")  # exact: all real dtypes here fit float64's range
                np.copyto(b64, flat_b[start:stop], casting="unsafe")
                where = (origin, block, shape, start)
                norm_a, norm_b = real_dot(a64, a64), real_dot(b64, b64)
                if math.isfinite(norm_a) and math.isfinite(norm_b):  # NaN and Inf propagate into sums of squares
                    self.finite(a64, b64, norm_a, norm_b, buffers, where)
                else:  # some NaN or Inf (or squares past float64's range)
                    self.general(a64, b64, where)

    def complex(self, flat_a: NDArray[Any], flat_b: NDArray[Any], where: Where) -> None:
        """Values of which either side is complex, in complex128, of the flat block `where` says (its offset 0)."""
        origin, block, shape, _ = where
        for start in range(0, flat_a.size, SLICE):
            a128 = np.asarray(flat_a[start : start + SLICE], dtype=np.complex128)
            b128 = np.asarray(flat_b[start : start + SLICE], dtype=np.complex128)
            self.general(a128, b128, (origin, block, shape, start))

    def integers(self, a: NDArray[Any], b: NDArray[Any], where: Where) -> None:
        """Flat integer blocks with values past 2**52 (float64 would round them and their differences): the
        differences exactly, the sums from them in float64."""
        origin, block_shape, shape, _ = where
        n = a.size
        buffers = _Buffers(min(n, SLICE))
        for start in range(0, n, SLICE):
            stop = min(start + SLICE, n)
            xa, xb = a[start:stop], b[start:stop]
            a64, b64 = buffers.a[: stop - start], buffers.b[: stop - start]
            np.copyto(a64, xa, casting="unsafe")
            np.copyto(b64, xb, casting="unsafe")
            norm_a, norm_b = real_dot(a64, a64), real_dot(b64, b64)
            exact = (integer_differences(xa, xb), xa, xb)
            self.finite(a64, b64, norm_a, norm_b, buffers, (origin, block_shape, shape, start), exact)

    def finite(
        self,
        a64: NDArray[Any],
        b64: NDArray[Any],
        norm_a: float,
        norm_b: float,
        buffers: _Buffers,
        where: Where,
        exact: tuple[NDArray[Any], NDArray[Any], NDArray[Any]] | None = None,
    ) -> None:
        """The common case, no NaN or Inf on either side: fewer passes, no masks, nothing allocated. `exact`: for
        integers past float64's precision, their exact |a - b| and the values themselves, which the largest
        difference and the worst elements are taken from."""
        sums, found = self.sums, self.largest
        n = a64.size
        diff = buffers.diff[:n]
        if exact is None:
            np.subtract(a64, b64, out=diff)
            np.abs(diff, out=diff)
            local = int(np.argmax(diff))
            top = exact_top = float(diff[local])
        else:
            np.copyto(diff, exact[0], casting="unsafe")  # rounded to the nearest float64
            local = int(np.argmax(exact[0]))
            top, exact_top = float(diff[local]), int(exact[0][local])
        found.consider_max(exact_top, False, local, where)
        if found.top and exact_top > found.floor():
            if exact is None:
                found.offer(diff, a64, b64, None, where)
            else:
                found.offer(*exact, None, where)
        sums.valid += n
        sums.sum_abs += float(diff.sum())
        sums.sum_sq += sum_squares(diff, real_dot(diff, diff)) if top > 0 else Scaled()
        ref = np.abs(a64, out=buffers.ref[:n])
        low = float(ref.min())
        scratch = buffers.scratch[:n]
        # Elements outside atol + rtol * |a|: none when even the largest difference is within the smallest bound
        # (rounding is monotonic, so every element's bound is at least that one).
        if not self.exact and top > self.tol.smallest_bound(low):
            if self.tol.ulp:
                scratch[:] = self.tol.bound(ref)
            else:
                np.multiply(ref, self.tol.rtol, out=scratch)
                scratch += self.tol.atol
            outside = np.greater(diff, scratch, out=buffers.flags[:n])
            sums.mismatched += int(np.count_nonzero(outside))
        if low > 0:
            np.divide(diff, ref, out=scratch)
            sums.rel_count += n
            sums.sum_rel += float(scratch.sum())
            sums.max_rel = max(sums.max_rel, float(scratch.max()))
        else:
            nonzero = ref > 0
            if nonzero.any():
                rel = diff[nonzero] / ref[nonzero]
                sums.rel_count += rel.size
                sums.sum_rel += float(rel.sum())
                sums.max_rel = max(sums.max_rel, float(rel.max()))
        dot, scaled_a, scaled_b = products(a64, b64, norm_a, norm_b)
        sums.dot += dot
        sums.norm_a += scaled_a
        sums.norm_b += scaled_b
        sums.histogram(diff, top, buffers.flags[:n])

    def general(self, a64: NDArray[Any], b64: NDArray[Any], where: Where) -> None:
        """Any values: NaN and Inf counted, complex values by magnitude of the difference."""
        sums, found = self.sums, self.largest
        n = a64.size
        nan_a, nan_b = np.isnan(a64), np.isnan(b64)
        inf_a, inf_b = np.isinf(a64), np.isinf(b64)
        sums.nan_a += int(nan_a.sum())
        sums.nan_b += int(nan_b.sum())
        sums.inf_a += int(inf_a.sum())
        sums.inf_b += int(inf_b.sum())
        any_nan = nan_a | nan_b
        sums.nan_one += int(np.count_nonzero(nan_a ^ nan_b))
        diff = abs_diff(a64, b64, any_nan)  # NaN where either is, 0 where equal (infinities too)
        valid = ~any_nan
        n_valid = int(valid.sum())
        sums.valid += n_valid
        abs_a = np.abs(a64)
        if not self.exact:
            close = within_tolerance(a64, b64, self.tol, False, diff)
            sums.mismatched += int(n - np.count_nonzero(close))  # NaN is never within: a mismatch
        if found.top:
            found.offer(diff, a64, b64, any_nan, where)
        local = largest(diff) or 0  # a NaN is the largest difference there is
        is_nan = bool(np.isnan(diff[local]))
        found.consider_max(math.inf if is_nan else float(diff[local]), is_nan, local, where)
        if n_valid:
            d = diff[valid]
            sums.sum_abs += float(d.sum())
            with np.errstate(over="ignore"):
                sums.sum_sq += sum_squares(d, real_dot(d, d))
            ref = abs_a[valid]
            nonzero = (ref > 0) & np.isfinite(ref)
            if nonzero.any():
                with np.errstate(invalid="ignore"):
                    rel = d[nonzero] / ref[nonzero]
                sums.rel_count += int(nonzero.sum())
                sums.sum_rel += float(rel.sum())
                sums.max_rel = max(sums.max_rel, float(np.nanmax(rel)) if rel.size else 0.0)
            finite = valid & ~inf_a & ~inf_b
            sums.unequal_inf += int(np.count_nonzero((inf_a | inf_b) & valid & (diff > 0)))
            fa, fb = a64[finite], b64[finite]
            with np.errstate(over="ignore"):
                dot, norm_a, norm_b = products(fa, fb, real_dot(np.conj(fa), fa), real_dot(np.conj(fb), fb))
            sums.dot += dot
            sums.norm_a += norm_a
            sums.norm_b += norm_b
            sums.histogram(d, float(d.max()), np.empty(d.size, dtype=bool))


def past_float64(values: NDArray[Any]) -> bool:
    """Whether 64-bit integers hold a value past 2**52 in magnitude, where float64 rounds them or their differences."""
    if values.dtype.itemsize < 8 or values.size == 0:
        return False
    return int(values.max()) > _EXACT_FLOAT or int(values.min()) < -_EXACT_FLOAT


class _Buffers:
    """Temporaries of one block, reused by each of its slices."""

    def __init__(self, size: int) -> None:
        self.a, self.b, self.diff, self.ref, self.scratch = (np.empty(size) for _ in range(5))
        self.flags = np.empty(size, dtype=bool)
