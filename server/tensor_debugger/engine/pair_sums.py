"""The running sums and counts of a pair's statistics (`pair_accumulator.PairAccumulator`): what every block adds to,
what `merge` adds up, and the decade histogram of |difference| kept as counts per edge."""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.fused import FusedPartial
from tensor_debugger.engine.metrics import EDGES
from tensor_debugger.engine.scaled_sums import Scaled

# The histogram bins |difference| rounded to float32 against the edges rounded to float32: a display needs no more,
# and the compiled kernel counts twice as many values per instruction so.
_EDGES32 = [float(np.float32(e)) for e in EDGES]
# the sums `merge` adds up one to one
_ADDED = (
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
)


class PairSums:
    """Sums and counts of the blocks folded in so far (float64, the dot products and norms scaled: `Scaled`)."""

    def __init__(self) -> None:
        self.numel = 0
        self.valid = 0  # elements where neither side is NaN
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

    def fold_fused(self, part: FusedPartial, n: int, exact: bool) -> None:
        """Add the sums of `n` finite elements as the compiled kernel computed them (its mismatches only where
        `exact` is False: an exact pair counts its own)."""
        self.valid += n
        self.sum_abs += part.sum_abs
        self.sum_sq += Scaled.of(part.sum_sq)  # the kernel declines sums out of the safe range (scaled_sums.py)
        if not exact:
            self.mismatched += part.mismatched
        self.rel_count += part.rel_count
        self.sum_rel += part.sum_rel
        self.max_rel = max(self.max_rel, part.max_rel)
        self.dot += Scaled.of(part.dot)
        self.norm_a += Scaled.of(part.norm_a)
        self.norm_b += Scaled.of(part.norm_b)
        self.nonzero += part.nonzero
        self.at_least = [mine + theirs for mine, theirs in zip(self.at_least, part.at_least, strict=True)]

    def histogram(self, d: NDArray[Any], top: float, flags: NDArray[Any]) -> None:
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

    def histogram_counts(self) -> list[int]:
        """[zero, below 10**(HIST_LOW + 1), one per decade, 10**HIST_HIGH and above]: of every valid element."""
        at_least = self.at_least
        counts = [self.valid - self.nonzero, self.nonzero - at_least[0]]
        counts += [at_least[i] - at_least[i + 1] for i in range(len(at_least) - 1)]
        counts.append(at_least[-1])
        return counts

    def merge(self, other: PairSums) -> None:
        for name in _ADDED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_rel = max(self.max_rel, other.max_rel)
        self.integers = self.integers or other.integers
        self.nonzero += other.nonzero
        self.at_least = [mine + theirs for mine, theirs in zip(self.at_least, other.at_least, strict=True)]
