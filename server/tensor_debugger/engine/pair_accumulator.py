"""A pair's statistics (`metrics.PairStats`), accumulated block by block: in float64 (complex128 for complex
values), exactly for integer pairs, or by the compiled kernel (`fused.py`); `merge` combines the partials of
blocks done apart."""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.elementwise import abs_diff, integer_differences, largest, within_tolerance
from tensor_debugger.engine.fused import FusedPartial, Kernel, default_kernel, top_limit
from tensor_debugger.engine.metrics import DEFAULT_TOP, EDGES, PairStats, WorstElement, edges, json_number, json_value
from tensor_debugger.engine.scaled_sums import Scaled, cosine, decibels, products, real_dot, sum_squares
from tensor_debugger.engine.tolerances import Tolerance

_SLICE = 1 << 16  # elements per step: 512 KiB of float64 per temporary
# The histogram bins |difference| rounded to float32 against the edges rounded to float32: a display needs no more,
# and the compiled kernel counts twice as many values per instruction so.
_EDGES32 = [float(np.float32(e)) for e in EDGES]
# (block origin in aligned coordinates, block shape, aligned shape, offset of this slice in the flat block)
_Where = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]
# A worst element, ordered as they rank: (0 for a NaN else 1, -|a - b| (0 for a NaN), aligned flat position, aligned
# index, |a - b|, a, b)
_Worst = tuple[int, float, int, tuple[int, ...], float, Any, Any]
_EXACT_FLOAT = 1 << 52  # integers of at most this magnitude, and their differences, are exact in float64


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
        self.worst: list[_Worst] = []  # at most `top`, in rank order
        self.numel = 0
        self.valid = 0  # elements where neither side is NaN
        self.max_abs = -1.0
        self.argmax: tuple[int, ...] | None = None
        self.argmax_flat = -1
        self.sum_abs = 0.0
        self.sum_sq = Scaled()
        self.rel_count = 0
        self.sum_rel = 0.0
        self.max_rel = 0.0
        self.dot = Scaled()
        self.norm_a = Scaled()
        self.norm_b = Scaled()
        self.integers = False  # both sides integers (or bools): differences and values reported as integers
        self.mismatched = 0
        self.nan_a = self.nan_b = self.inf_a = self.inf_b = self.nan_one = 0
        self.unequal_inf = 0
        self.nonzero = 0  # differences above zero (NaN excluded), and of those, how many reach each edge:
        self.at_least = [0] * len(EDGES)  # the histogram follows from these two

    def add(self, a: NDArray[Any], b: NDArray[Any], origin: tuple[int, ...], shape: tuple[int, ...]) -> None:
        """Fold in one block: `a` and `b` hold the same aligned region (same shape), which starts at `origin`
        of the aligned tensor of shape `shape`."""
        n = a.size
        self.numel += n
        if n == 0:
            return
        if self.exact:
            self.mismatched += int(np.count_nonzero(a != b))
        flat_a, flat_b = a.reshape(-1), b.reshape(-1)
        if a.dtype.kind in "iub" and b.dtype.kind in "iub":
            self.integers = True
            if _past_float64(flat_a) or _past_float64(flat_b):
                self._add_integers(flat_a, flat_b, (origin, a.shape, shape, 0))
                return
        if a.dtype.kind == "c" or b.dtype.kind == "c":
            for start in range(0, n, _SLICE):
                a128 = np.asarray(flat_a[start : start + _SLICE], dtype=np.complex128)
                b128 = np.asarray(flat_b[start : start + _SLICE], dtype=np.complex128)
                self._add_general(a128, b128, (origin, a.shape, shape, start))
            return
        if self._add_fused(flat_a, flat_b, (origin, a.shape, shape, 0)):
            return
        # Slices small enough for the float64 temporaries to stay in cache, in buffers reused from slice to slice;
        # offsets keep the argmax exact.
        buffers = _Buffers(min(n, _SLICE))
        with np.errstate(over="ignore", invalid="ignore"):  # overflow gives inf, as it should
            for start in range(0, n, _SLICE):
                stop = min(start + _SLICE, n)
                a64, b64 = buffers.a[: stop - start], buffers.b[: stop - start]
                np.copyto(a64, flat_a[start:stop], casting="unsafe")  # exact: all real dtypes here fit float64's range
                np.copyto(b64, flat_b[start:stop], casting="unsafe")
                where = (origin, a.shape, shape, start)
                norm_a, norm_b = real_dot(a64, a64), real_dot(b64, b64)
                if math.isfinite(norm_a) and math.isfinite(norm_b):  # NaN and Inf propagate into sums of squares
                    self._add_finite(a64, b64, norm_a, norm_b, buffers, where)
                else:  # some NaN or Inf (or squares past float64's range)
                    self._add_general(a64, b64, where)

    def _add_integers(self, a: NDArray[Any], b: NDArray[Any], where: _Where) -> None:
        """Flat integer blocks with values past 2**52 (float64 would round them and their differences): the
        differences exactly, the sums from them in float64."""
        origin, block_shape, shape, _ = where
        n = a.size
        buffers = _Buffers(min(n, _SLICE))
        for start in range(0, n, _SLICE):
            stop = min(start + _SLICE, n)
            xa, xb = a[start:stop], b[start:stop]
            a64, b64 = buffers.a[: stop - start], buffers.b[: stop - start]
            np.copyto(a64, xa, casting="unsafe")
            np.copyto(b64, xb, casting="unsafe")
            norm_a, norm_b = real_dot(a64, a64), real_dot(b64, b64)
            exact = (integer_differences(xa, xb), xa, xb)
            self._add_finite(a64, b64, norm_a, norm_b, buffers, (origin, block_shape, shape, start), exact)

    def add_fused(
        self, part: FusedPartial, origin: tuple[int, ...], block_shape: tuple[int, ...], shape: tuple[int, ...]
    ) -> bool:
        """Fold in a block's statistics as the compiled kernel computed them elsewhere (chunk_loop: read, decoded
        and reduced chunk by chunk), with this accumulator's tolerance and `edges()`, for the block of
        `block_shape` at `origin` of the aligned tensor of shape `shape`: True, or False (nothing folded in) where
        the block holds a NaN or an Inf, which only `add` counts."""
        n = math.prod(block_shape)
        self.numel += n
        if self._fold(part, n, (origin, block_shape, shape, 0)):
            return True
        self.numel -= n
        return False

    def _add_fused(self, a: NDArray[Any], b: NDArray[Any], where: _Where) -> bool:
        """The whole block in one pass of the compiled kernel, when it is in use and the block is finite (else
        False, and nothing is folded in)."""
        ulp = bool(self.tol.ulp) and not self.exact  # the kernel tests rtol and atol only: ULPs are counted here
        part = self.kernel.partial(a, b, self.tol.atol, self.tol.rtol, not self.exact and not ulp, edges(), self.top)
        if part is None or not self._fold(part, a.size, where):
            return False
        if ulp:
            for start in range(0, a.size, _SLICE):
                x = a[start : start + _SLICE].astype(np.float64)
                outside = np.abs(x - b[start : start + _SLICE]) > self.tol.bound(np.abs(x))
                self.mismatched += int(np.count_nonzero(outside))
        return True

    def _fold(self, part: FusedPartial, n: int, where: _Where) -> bool:
        if not (math.isfinite(part.norm_a) and math.isfinite(part.norm_b)):
            return False
        self.valid += n
        self._consider_max(part.max_abs, False, part.argmax, where)
        self.sum_abs += part.sum_abs
        self.sum_sq += Scaled.of(part.sum_sq)  # the kernel declines sums out of the safe range (scaled_sums.py)
        if not self.exact:
            self.mismatched += part.mismatched
        self.rel_count += part.rel_count
        self.sum_rel += part.sum_rel
        self.max_rel = max(self.max_rel, part.max_rel)
        self.dot += Scaled.of(part.dot)
        self.norm_a += Scaled.of(part.norm_a)
        self.norm_b += Scaled.of(part.norm_b)
        self.nonzero += part.nonzero
        self.at_least = [mine + theirs for mine, theirs in zip(self.at_least, part.at_least, strict=True)]
        if part.top_n:
            n_top = part.top_n
            at = np.array(part.top_at[:n_top], dtype=np.int64)
            entries = zip(
                self._positions(at, where), part.top_abs[:n_top], part.top_a[:n_top], part.top_b[:n_top], strict=True
            )
            self._take([(1, -d, flat, index, d, x, y) for (flat, index), d, x, y in entries])
        return True

    def _positions(self, local: NDArray[Any], where: _Where) -> list[tuple[int, tuple[int, ...]]]:
        """(aligned flat position, aligned index) of flat positions `local` of the slice `where` says."""
        origin, block_shape, shape, offset = where
        if not shape:
            return [(0, ())] * local.size
        in_block = np.unravel_index(local + offset, block_shape)
        index = np.stack([o + i for o, i in zip(origin, in_block, strict=True)])
        flat = np.ravel_multi_index(tuple(index), shape)
        return [(int(f), tuple(int(i) for i in column)) for f, column in zip(flat, index.T, strict=True)]

    def _floor(self) -> float:
        """The difference an element must exceed to be among the worst kept (a NaN among them: infinity)."""
        if len(self.worst) < self.top:
            return 0.0
        last = self.worst[-1]
        return math.inf if last[0] == 0 else last[4]

    def _take(self, entries: list[_Worst]) -> None:
        if entries:
            self.worst = heapq.nsmallest(self.top, self.worst + entries)

    def _offer(
        self, diff: NDArray[Any], a64: NDArray[Any], b64: NDArray[Any], nan: NDArray[Any] | None, where: _Where
    ) -> None:
        """Keep the worst of a slice's differences `diff` (NaN where `nan`; a NaN compares false below) and values."""
        floor = self._floor()
        above = np.flatnonzero(diff > floor)
        if above.size > self.top:  # the `top` largest, ties at the last included: ranked exactly by _take
            cut = np.partition(diff[above], above.size - self.top)[above.size - self.top]
            above = above[diff[above] >= cut]
        number = float if diff.dtype.kind in "fc" else int  # exact integer differences stay integers
        entries: list[_Worst] = [
            (1, -number(diff[i]), flat, index, number(diff[i]), a64[i].item(), b64[i].item())
            for i, (flat, index) in zip(above, self._positions(above, where), strict=True)
        ]
        if nan is not None and math.isfinite(floor):
            first = np.flatnonzero(nan)[: self.top]
            entries += [
                (0, 0.0, flat, index, math.nan, a64[i].item(), b64[i].item())
                for i, (flat, index) in zip(first, self._positions(first, where), strict=True)
            ]
        self._take(entries)

    def _add_finite(
        self,
        a64: NDArray[Any],
        b64: NDArray[Any],
        norm_a: float,
        norm_b: float,
        buffers: _Buffers,
        where: _Where,
        exact: tuple[NDArray[Any], NDArray[Any], NDArray[Any]] | None = None,
    ) -> None:
        """The common case, no NaN or Inf on either side: fewer passes, no masks, nothing allocated. `exact`: for
        integers past float64's precision, their exact |a - b| and the values themselves, which the largest
        difference and the worst elements are taken from."""
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
        self._consider_max(exact_top, False, local, where)
        if self.top and exact_top > self._floor():
            if exact is None:
                self._offer(diff, a64, b64, None, where)
            else:
                self._offer(*exact, None, where)
        self.valid += n
        self.sum_abs += float(diff.sum())
        self.sum_sq += sum_squares(diff, real_dot(diff, diff)) if top > 0 else Scaled()
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
            self.mismatched += int(np.count_nonzero(outside))
        if low > 0:
            np.divide(diff, ref, out=scratch)
            self.rel_count += n
            self.sum_rel += float(scratch.sum())
            self.max_rel = max(self.max_rel, float(scratch.max()))
        else:
            nonzero = ref > 0
            if nonzero.any():
                rel = diff[nonzero] / ref[nonzero]
                self.rel_count += rel.size
                self.sum_rel += float(rel.sum())
                self.max_rel = max(self.max_rel, float(rel.max()))
        dot, scaled_a, scaled_b = products(a64, b64, norm_a, norm_b)
        self.dot += dot
        self.norm_a += scaled_a
        self.norm_b += scaled_b
        self._histogram(diff, top, buffers.flags[:n])

    def _add_general(self, a64: NDArray[Any], b64: NDArray[Any], where: _Where) -> None:
        """Any values: NaN and Inf counted, complex values by magnitude of the difference."""
        n = a64.size
        nan_a, nan_b = np.isnan(a64), np.isnan(b64)
        inf_a, inf_b = np.isinf(a64), np.isinf(b64)
        self.nan_a += int(nan_a.sum())
        self.nan_b += int(nan_b.sum())
        self.inf_a += int(inf_a.sum())
        self.inf_b += int(inf_b.sum())
        any_nan = nan_a | nan_b
        self.nan_one += int(np.count_nonzero(nan_a ^ nan_b))
        diff = abs_diff(a64, b64, any_nan)  # NaN where either is, 0 where equal (infinities too)
        valid = ~any_nan
        n_valid = int(valid.sum())
        self.valid += n_valid
        abs_a = np.abs(a64)
        if not self.exact:
            close = within_tolerance(a64, b64, self.tol, False, diff)
            self.mismatched += int(n - np.count_nonzero(close))  # NaN is never within: a mismatch
        if self.top:
            self._offer(diff, a64, b64, any_nan, where)
        local = largest(diff) or 0  # a NaN is the largest difference there is
        is_nan = bool(np.isnan(diff[local]))
        self._consider_max(math.inf if is_nan else float(diff[local]), is_nan, local, where)
        if n_valid:
            d = diff[valid]
            self.sum_abs += float(d.sum())
            with np.errstate(over="ignore"):
                self.sum_sq += sum_squares(d, real_dot(d, d))
            ref = abs_a[valid]
            nonzero = (ref > 0) & np.isfinite(ref)
            if nonzero.any():
                with np.errstate(invalid="ignore"):
                    rel = d[nonzero] / ref[nonzero]
                self.rel_count += int(nonzero.sum())
                self.sum_rel += float(rel.sum())
                self.max_rel = max(self.max_rel, float(np.nanmax(rel)) if rel.size else 0.0)
            finite = valid & ~inf_a & ~inf_b
            self.unequal_inf += int(np.count_nonzero((inf_a | inf_b) & valid & (diff > 0)))
            fa, fb = a64[finite], b64[finite]
            with np.errstate(over="ignore"):
                dot, norm_a, norm_b = products(fa, fb, real_dot(np.conj(fa), fa), real_dot(np.conj(fb), fb))
            self.dot += dot
            self.norm_a += norm_a
            self.norm_b += norm_b
            self._histogram(d, float(d.max()), np.empty(d.size, dtype=bool))

    def _consider_max(self, value: float, is_nan: bool, local: int, where: _Where) -> None:
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

    def _histogram(self, d: NDArray[Any], top: float, flags: NDArray[Any]) -> None:
        """Count |difference| per decade: bin 0 exact zeros, bin 1 everything else below 10**(HIST_LOW + 1), one
        bin per decade after it, the last 10**HIST_HIGH and above (infinity included); differences and edges are
        compared as float32. NaN is never in `d`; `top` is its largest value; `flags` a boolean scratch of its size.

        One pass per decade the differences span, not one per edge: edges above `top` count nothing, and the
        edges are counted downwards until one counts every non-zero difference, as all edges below it do."""
        nonzero = int(np.count_nonzero(np.greater(d, 0.0, out=flags)))  # on booleans: several times faster
        self.nonzero += nonzero
        with np.errstate(over="ignore"):  # past float32's range is infinity: the top bin, as it should be
            d32 = d.astype(np.float32)
            top32 = float(np.float32(top))
        for i in range(bisect.bisect_right(_EDGES32, top32) - 1, -1, -1):
            reached = int(np.count_nonzero(np.greater_equal(d32, np.float32(_EDGES32[i]), out=flags)))
            self.at_least[i] += reached
            if reached == nonzero:
                for j in range(i):
                    self.at_least[j] += nonzero
                break

    def _histogram_counts(self) -> list[int]:
        """[zero, below 10**(HIST_LOW + 1), one per decade, 10**HIST_HIGH and above]: of every valid element."""
        at_least = self.at_least
        counts = [self.valid - self.nonzero, self.nonzero - at_least[0]]
        counts += [at_least[i] - at_least[i + 1] for i in range(len(at_least) - 1)]
        counts.append(at_least[-1])
        return counts

    def merge(self, other: PairAccumulator) -> None:
        for name in (
            "numel",
            "valid",
            "sum_abs",
            "sum_sq",
            "rel_count",
            "sum_rel",
            "dot",
            "norm_a",
            "norm_b",
            "mismatched",
            "nan_a",
            "nan_b",
            "inf_a",
            "inf_b",
            "nan_one",
            "unequal_inf",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_rel = max(self.max_rel, other.max_rel)
        self.integers = self.integers or other.integers
        self.nonzero += other.nonzero
        self.at_least = [mine + theirs for mine, theirs in zip(self.at_least, other.at_least, strict=True)]
        self._take(other.worst)
        if other.argmax is None:
            return
        mine = math.inf if math.isnan(self.max_abs) else self.max_abs
        theirs = math.inf if math.isnan(other.max_abs) else other.max_abs
        if self.argmax is None or theirs > mine or (theirs == mine and other.argmax_flat < self.argmax_flat):
            self.max_abs, self.argmax, self.argmax_flat = other.max_abs, other.argmax, other.argmax_flat

    def result(self) -> PairStats:
        valid = max(self.valid, 1)
        has_nan = self.nan_a + self.nan_b > 0
        if has_nan or self.unequal_inf:
            similarity = snr = math.nan
        else:
            similarity = cosine(self.dot, self.norm_a, self.norm_b)
            snr = decibels(self.norm_a, self.sum_sq)
        mse = self.sum_sq.divided(valid) if self.valid else math.nan
        largest = max(self.max_abs, 0.0) if not math.isnan(self.max_abs) else math.nan
        # integers' differences and values are exact: JSON integers
        number: Callable[[Any], Any] = int if self.integers else _same
        return PairStats(
            numel=self.numel,
            max_abs_diff=number(largest),
            argmax=self.argmax,
            mean_abs_diff=self.sum_abs / valid if self.valid else math.nan,
            max_rel_diff=self.max_rel,
            mean_rel_diff=self.sum_rel / self.rel_count if self.rel_count else 0.0,
            mse=mse,
            rmse=math.sqrt(mse) if not math.isnan(mse) else math.nan,
            cosine=similarity,
            snr_db=snr,
            mismatched=self.mismatched,
            mismatched_fraction=self.mismatched / self.numel if self.numel else 0.0,
            nan_a=self.nan_a,
            nan_b=self.nan_b,
            inf_a=self.inf_a,
            inf_b=self.inf_b,
            nan_one_side=self.nan_one,
            histogram=self._histogram_counts(),
            rtol=self.tol.rtol,
            atol=self.tol.atol,
            ulp=self.tol.ulp,
            ulp_dtype=self.tol.ulp_dtype,
            worst=[
                WorstElement(
                    list(index),
                    json_value(number(x)),
                    json_value(number(y)),
                    json_number(d) if isinstance(d, float) and not self.integers else int(d),
                )
                for _, _, _, index, d, x, y in self.worst
            ],
        )


class _Buffers:
    """Temporaries of one `add`, reused by each of its slices."""

    def __init__(self, size: int) -> None:
        self.a, self.b, self.diff, self.ref, self.scratch = (np.empty(size) for _ in range(5))
        self.flags = np.empty(size, dtype=bool)


def _same(value: Any) -> Any:
    return value


def _past_float64(values: NDArray[Any]) -> bool:
    """Whether 64-bit integers hold a value past 2**52 in magnitude, where float64 rounds them or their differences."""
    if values.dtype.itemsize < 8 or values.size == 0:
        return False
    return int(values.max()) > _EXACT_FLOAT or int(values.min()) < -_EXACT_FLOAT
