"""Where inside a failing pair the error is: along each aligned dimension, the fewest indices that hold `SHARE` of
the squared error, as inclusive index ranges; a dimension across which the error spreads everywhere is left out.

Computed for failing pairs only, in a second pass over their blocks once the statistics said fail: a pair that
passes is read once. Per block, the squared |difference| is summed per index of every dimension (one vector per
dimension, the size of that dimension), so memory stays that of the shape's sides, not of the tensor.

Differences that are not finite (a NaN on either side, an infinity against a finite value, or a square that
overflows) outweigh any finite error: where a pair has any, the mass is their count per index instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.chunking import Region, iter_blocks, plan_chunks
from tensor_debugger.engine.error_spans import ErrorSpan
from tensor_debugger.engine.views import View

if TYPE_CHECKING:
    from tensor_debugger.engine.fused import Kernel

SHARE = 0.99  # the share of the squared error the kept indices hold
# A dimension is "everywhere" (left out) when holding SHARE takes more than this fraction of its indices, or more
# than MAX_RANGES separate ranges (the error is then scattered, not confined)
EVERYWHERE = 0.5
MAX_RANGES = 16
WHERE_BLOCK_BYTES = 8 * 1024 * 1024  # of float64 per side read at once
SLAB_BYTES = 1024 * 1024  # of a block's float64 squares computed at once (`block_masses`)


class WhereAccumulator:
    """Per index of every dimension of `shape`: the sum of squared finite differences and the count of
    non-finite ones, folded block by block (blocks may be folded in any order)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        self.squares = [np.zeros(d) for d in shape]
        self.nonfinite = [np.zeros(d, dtype=np.int64) for d in shape]

    def add(self, a: NDArray[Any], b: NDArray[Any], origin: Sequence[int], kernel: Kernel | None = None) -> None:
        """Fold a block of both sides whose first element sits at `origin` (aligned coordinates)."""
        squares, nonfinite = block_masses(a, b, kernel)
        self.fold(squares, nonfinite, origin)

    def fold(self, squares: list[NDArray[Any]], nonfinite: list[NDArray[Any]], origin: Sequence[int]) -> None:
        for dim, (sq, nf) in enumerate(zip(squares, nonfinite, strict=True)):
            start = origin[dim]
            self.squares[dim][start : start + len(sq)] += sq
            self.nonfinite[dim][start : start + len(nf)] += nf

    def spans(self) -> list[ErrorSpan]:
        """The dimensions that confine the error, in dimension order (none where it is everywhere)."""
        use_counts = any(int(nf.sum()) for nf in self.nonfinite)
        spans = []
        for dim, size in enumerate(self.shape):
            mass = self.nonfinite[dim].astype(np.float64) if use_counts else self.squares[dim]
            ranges = confine(mass)
            if ranges is not None:
                spans.append(ErrorSpan(dim, size, ranges))
        return spans


def block_masses(
    a: NDArray[Any], b: NDArray[Any], kernel: Kernel | None = None
) -> tuple[list[NDArray[Any]], list[NDArray[Any]]]:
    """Per dimension of the block, per index: the sum of squared finite |a - b| and the count of non-finite ones
    (equal values, equal infinities included, differ by zero). The squares are computed a slab of rows at a time
    (`SLAB_BYTES`), so that the block's float64 squares are never in memory at once (8 MiB a block: one per thread
    comparing, kept by the allocator's heaps once freed), with the same sums, bit for bit, as over the whole block:
    a row's sum is the row's alone, and the sums down the rows are carried from slab to slab in the same order.

    With `kernel` (its compiled loop in use), a block of float32 or float64 pairs of two dimensions or more has its
    row and column sums computed in one compiled pass, in the same order (`Kernel.where_sums`: the same floats);
    a block where a square is not finite is then computed here."""
    kind = np.complex128 if a.dtype.kind == "c" or b.dtype.kind == "c" else np.float64
    contiguous = a.flags.c_contiguous and b.flags.c_contiguous and a.shape == b.shape
    if kind is np.complex128 or not contiguous or a.ndim == 0 or (a.ndim > 1 and a.shape[-1] < 2):
        return _whole_block_masses(a, b, kind)  # a last dimension of 1: its sum down the rows is pairwise
    last = a.shape[-1] if a.ndim > 1 else 1
    a2, b2 = a.reshape(-1, last), b.reshape(-1, last)  # views: the rows in order (a 1-D block: one value a row)
    compiled = None if kernel is None or a.ndim == 1 or a.size == 0 else kernel.where_sums(a2, b2)
    if compiled is not None:
        rest = compiled[0].reshape(a.shape[:-1])
        sums = [rest.sum(axis=tuple(i for i in range(rest.ndim) if i != dim)) for dim in range(rest.ndim)]
        return [*sums, compiled[1]], [np.zeros(d, dtype=np.int64) for d in a.shape]
    rows = a2.shape[0]
    step = max(1, SLAB_BYTES // (8 * last))
    scratch = np.empty((min(step, rows), last))
    row_sums = np.empty(rows)  # each row's sum (the last dimension's), as `per_dim_sums` takes them
    down: NDArray[Any] | None = None  # the sums down the rows so far, per index of the last dimension
    bad_rows: NDArray[Any] | None = None  # the counts of non-finite differences, likewise, once one is met
    bad_down: NDArray[Any] | None = None
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        square = _squares(a2[start:stop], b2[start:stop], scratch[: stop - start])
        bad = None if np.isfinite(square.sum()) else _drop_nonfinite(square, a2[start:stop], b2[start:stop])
        if bad is not None:
            if bad_rows is None or bad_down is None:
                bad_rows, bad_down = np.zeros(rows, dtype=np.int64), np.zeros(last, dtype=np.int64)
            bad_rows[start:stop] = bad.sum(axis=-1)
            bad_down += bad.sum(axis=0)
        if a.ndim == 1:
            row_sums[start:stop] = square[:, 0]
            continue
        row_sums[start:stop] = square.sum(axis=-1)
        if down is not None:
            square[0] += down  # the sum down the rows goes on from where the slab before left it
        down = square.sum(axis=0)
    if a.ndim == 1:
        counts = bad_rows if bad_rows is not None else np.zeros(rows, dtype=np.int64)
        return [row_sums], [counts]
    assert down is not None
    rest = row_sums.reshape(a.shape[:-1])
    sums = [rest.sum(axis=tuple(i for i in range(rest.ndim) if i != dim)) for dim in range(rest.ndim)]
    if bad_rows is None or bad_down is None:
        return [*sums, down], [np.zeros(d, dtype=np.int64) for d in a.shape]
    counts = bad_rows.reshape(a.shape[:-1])
    bad_sums = [counts.sum(axis=tuple(i for i in range(counts.ndim) if i != dim)) for dim in range(counts.ndim)]
    return [*sums, down], [*bad_sums, bad_down]


def _squares(a: NDArray[Any], b: NDArray[Any], out: NDArray[Any]) -> NDArray[Any]:
    """|a - b| squared in float64, into `out` (widened as it goes, exactly, a few thousand values at a time)."""
    with np.errstate(invalid="ignore", over="ignore"):
        np.subtract(a, b, out=out, dtype=np.float64)
        np.multiply(out, out, out=out)
    return out


def _drop_nonfinite(square: NDArray[Any], a: NDArray[Any], b: NDArray[Any]) -> NDArray[Any]:
    """Zero the squares that are not finite (equal infinities first: they differ by zero); where they were."""
    with np.errstate(invalid="ignore", over="ignore"):
        square[np.asarray(a, dtype=np.float64) == np.asarray(b, dtype=np.float64)] = 0.0  # equal infinities
    bad: NDArray[Any] = ~np.isfinite(square)
    square[bad] = 0.0
    return bad


def _whole_block_masses(
    a: NDArray[Any], b: NDArray[Any], kind: type[np.generic]
) -> tuple[list[NDArray[Any]], list[NDArray[Any]]]:
    """`block_masses` over the whole block at once (complex values, blocks that are not C-contiguous)."""
    with np.errstate(invalid="ignore", over="ignore"):
        # widened as it goes (exactly, a few thousand values at a time): no widened copy of each side in memory
        diff = np.subtract(a, b, dtype=kind)
        square = (diff * diff.conj()).real if kind is np.complex128 else np.multiply(diff, diff, out=diff)
        if np.isfinite(square.sum()):  # every square finite (they are >= 0): the usual case, no mask
            return per_dim_sums(square), [np.zeros(d, dtype=np.int64) for d in square.shape]
        square[np.asarray(a, dtype=kind) == np.asarray(b, dtype=kind)] = 0.0  # equal infinities
    bad = ~np.isfinite(square)
    square[bad] = 0.0
    return per_dim_sums(square), [s.astype(np.int64) for s in per_dim_sums(bad.astype(np.float64))]


def per_dim_sums(values: NDArray[Any]) -> list[NDArray[Any]]:
    """For every dimension of `values` (C order), the sum over all the others per index of it: two passes over the
    block (the last dimension's sums, and the sums along it), then passes over arrays smaller by the last size."""
    if values.ndim == 0:
        return []
    last = values.shape[-1]
    along_last = values.reshape(-1, last).sum(axis=0)
    if values.ndim == 1:
        return [along_last]
    rest = values.sum(axis=-1)  # shape[:-1]
    sums = [rest.sum(axis=tuple(i for i in range(rest.ndim) if i != dim)) for dim in range(rest.ndim)]
    return [*sums, along_last]


def confine(mass: NDArray[Any]) -> tuple[tuple[int, int], ...] | None:
    """The inclusive index ranges of the fewest indices holding SHARE of `mass` (largest first; ties in index
    order); None where that is everywhere: a dimension of size 1, no mass, more than EVERYWHERE of its indices or
    more than MAX_RANGES ranges."""
    size = len(mass)
    total = float(mass.sum())
    if size <= 1 or not total > 0:
        return None
    order = np.argsort(-mass, kind="stable")
    held = np.cumsum(mass[order])
    count = min(size, int(np.searchsorted(held, SHARE * total, side="left")) + 1)
    if count > EVERYWHERE * size:
        return None
    ranges: list[tuple[int, int]] = []
    for index in sorted(int(i) for i in order[:count]):
        if ranges and ranges[-1][1] == index - 1:
            ranges[-1] = (ranges[-1][0], index)
        else:
            ranges.append((index, index))
    return tuple(ranges) if len(ranges) <= MAX_RANGES else None


def where_regions(shape: tuple[int, ...]) -> list[Region]:
    """The blocks `locate_error` reads (and a cluster's workers, a task each: compare/compute/dask_blocks.py)."""
    return list(iter_blocks(plan_chunks(shape, 8, WHERE_BLOCK_BYTES), 1)) if shape else []


def locate_error(a: View, b: View, pool: Executor | None = None, kernel: Kernel | None = None) -> list[ErrorSpan]:
    """Read both views (same shape) block by block, on `pool`'s threads where given, and say where their error
    is (`WhereAccumulator.spans`; `kernel`: as `block_masses` takes it)."""
    shape = tuple(a.shape)
    if a.shape != b.shape:
        raise ValueError(f"views differ in shape: {list(a.shape)} and {list(b.shape)}")
    accumulator = WhereAccumulator(shape)
    if not shape:
        return []
    regions = where_regions(shape)

    def masses(region: Region) -> tuple[list[NDArray[Any]], list[NDArray[Any]]]:
        return block_masses(a.read(region), b.read(region), kernel)

    parts = pool.map(masses, regions) if pool is not None else map(masses, regions)
    for region, (squares, nonfinite) in zip(regions, parts, strict=True):
        accumulator.fold(squares, nonfinite, [s.start for s in region])
    return accumulator.spans()
