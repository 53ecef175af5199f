"""Summary statistics of one tensor, accumulated chunk by chunk in float64.

min, max, mean and std are over finite values only (NaN and Inf are counted, never folded in); mean and std
are None where their float64 sums overflow (values near 1e308; the compiled kernel sums 2048 values at a time,
numpy more, so a block may overflow in one and not the other). Complex tensors summarise their magnitudes; bools
count as 0 and 1. A tensor with no finite value has no min, max, mean or std.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.fused import Kernel
from tensor_debugger.store.dtypes import LogicalDtype, storage_to_compute


@dataclass(frozen=True)
class TensorSummary:
    numel: int
    nan_count: int
    inf_count: int
    min: float | None
    max: float | None
    mean: float | None
    std: float | None  # population standard deviation


_SLICE = 1 << 17  # elements per step: 1 MiB of float64 temporaries

# Finite values of a stretch: (count, mean, sum of squared deviations from it, minimum, maximum)
Part = tuple[int, float, float, float, float]


@dataclass
class BlockSummary:
    """What one block adds to a tensor's summary, computed on its own (on any thread): its counts and the parts
    that `SummaryAccumulator.fold` merges, in their order. Folding blocks in the tensor's order gives the same
    floats whichever threads computed them, and the same as folding every stretch as it was computed."""

    numel: int = 0
    nan: int = 0
    inf: int = 0
    parts: list[Part] = field(default_factory=list)


def summarise_stored(stored: NDArray[Any], logical: LogicalDtype, kernel: Kernel) -> BlockSummary:
    """Stored values (bit patterns for bfloat16 and float8): in one compiled pass where `kernel` (the engine
    instance's statistics path) has a loop for the dtype and the block is finite, else with numpy on their compute
    values."""
    part = kernel.summary(stored, logical.name) if stored.size else None
    if part is None:
        return summarise(storage_to_compute(stored, logical))
    return BlockSummary(stored.size, 0, 0, [(int(part.count), part.mean, part.m2, part.min, part.max)])


def summarise_folded(stored: NDArray[Any], logical: LogicalDtype, kernel: Kernel) -> tuple[BlockSummary, int | None]:
    """`summarise_stored` of a contiguous block and the "fold64" sum of its bytes from its first word
    (`Kernel.fold64`): in one compiled pass where `kernel` has a loop for the dtype (the same summary as
    `summarise_stored`'s, bit for bit), else the fold in its own compiled pass; the sum None where the kernel is not
    in use."""
    fused = kernel.sketch(stored, logical.name) if stored.size else None
    if fused is None:
        flat = stored.reshape(-1)
        return summarise_stored(stored, logical, kernel), kernel.fold64(flat.view(np.uint8)) if flat.size else 0
    part, fold = fused
    if part is None:  # a NaN or an Inf (or an overflow): numpy counts and skips them
        return summarise(storage_to_compute(stored, logical)), fold
    return BlockSummary(stored.size, 0, 0, [(int(part.count), part.mean, part.m2, part.min, part.max)]), fold


def summarise(values: NDArray[Any]) -> BlockSummary:
    """Compute values (see `dtypes.storage_to_compute`), a slice at a time so that the float64 temporaries stay
    small and in cache."""
    block = BlockSummary()
    flat = values.reshape(-1)
    if flat.size <= _SLICE:
        _summarise_slice(flat, block)
        return block
    for start in range(0, flat.size, _SLICE):
        _summarise_slice(flat[start : start + _SLICE], block)
    return block


def _summarise_slice(values: NDArray[Any], block: BlockSummary) -> None:
    block.numel += values.size
    if values.size == 0:
        return
    if values.dtype.kind == "c":  # magnitudes: NaN and Inf are counted among them below, once
        values = np.abs(values)
    with np.errstate(over="ignore", invalid="ignore"):
        total = float(np.add.reduce(values, dtype=np.float64))
    if values.dtype.kind == "f" and not np.isfinite(total):
        # Only now look for NaN and Inf: a finite sum proves there are none (they would propagate).
        nan = np.isnan(values)
        inf = np.isinf(values)
        block.nan += int(np.count_nonzero(nan))
        block.inf += int(np.count_nonzero(inf))
        values = values[~(nan | inf)]
        if values.size == 0:
            return
        with np.errstate(over="ignore"):
            total = float(np.add.reduce(values, dtype=np.float64))
    n = values.size
    with np.errstate(over="ignore", invalid="ignore"):  # values near float64's limit overflow: see result()
        mean = total / n
        centred = values.astype(np.float64)
        centred -= mean
        m2 = float(np.einsum("i,i->", centred, centred))  # not BLAS: its threads spin on the cores ingest needs
    block.parts.append((n, mean, m2, float(values.min()), float(values.max())))


class SummaryAccumulator:
    """Chan et al.'s parallel update of count, mean and M2, so chunks may arrive in any order and size."""

    def __init__(self) -> None:
        self.numel = 0
        self.nan = 0
        self.inf = 0
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.lo = np.inf
        self.hi = -np.inf

    def add_stored(self, stored: NDArray[Any], logical: LogicalDtype, kernel: Kernel) -> None:
        """Fold in stored values (see `summarise_stored`)."""
        self.fold(summarise_stored(stored, logical, kernel))

    def add(self, values: NDArray[Any]) -> None:
        """Fold in compute values (see `summarise`)."""
        self.fold(summarise(values))

    def fold(self, block: BlockSummary) -> None:
        """Fold in a block summarised apart (`summarise_stored`, `summarise`)."""
        self.numel += block.numel
        self.nan += block.nan
        self.inf += block.inf
        for part in block.parts:
            self._merge(*part)

    def _merge(self, n: int, mean: float, m2: float, lo: float, hi: float) -> None:
        """Fold in `n` finite values with this mean, sum of squared deviations from it, minimum and maximum."""
        self.lo = min(self.lo, lo)
        self.hi = max(self.hi, hi)
        count = self.count + n
        delta = mean - self.mean
        # Python floats (every part's are: `summarise_stored`, `summarise`): an overflow gives inf or nan, never a
        # warning, so no np.errstate (a third of this call's time, once per summary of a capture)
        self.mean += delta * n / count
        self.m2 += m2 + delta * delta * self.count * n / count
        self.count = count

    def result(self) -> TensorSummary:
        if self.count == 0:
            return TensorSummary(self.numel, self.nan, self.inf, None, None, None, None)
        std = float(np.sqrt(self.m2 / self.count))
        return TensorSummary(self.numel, self.nan, self.inf, self.lo, self.hi, _finite(self.mean), _finite(std))


def _finite(value: float) -> float | None:
    """None where float64 overflowed (values near 1e308), so no Infinity reaches JSON."""
    return value if np.isfinite(value) else None
