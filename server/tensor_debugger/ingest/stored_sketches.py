"""A stored tensor's summary (`engine.summary_compare.Sketch`), made from its blocks in order, as ingest writes them.

Ingest (writer.py) cuts every tensor into the same blocks (`iter_blocks` of its chunk layout, `CHUNKS_PER_BLOCK`
chunks each: contiguous C-order ranges), hashes them in order and folds each block's `summarise_stored` in order.
The summary takes its hash (the BLAKE3 digest), count, NaN and Inf counts, sum, sum of squares (from the folded
count, mean and squared deviations), minimum and maximum from those, and its sample from the blocks as they pass:
the values at `sample_positions(numel)` that fall in each block, in element order. So no tensor is read twice and no
more than a block is held.

A row stored before ingest kept summaries has none: `sketches.read_back_sketch` reads its array back in the same
blocks (`stored_layout` recovers the chunk layout from the stored array's chunks), summarises and samples them the
same way, and so gives the same floats, bit for bit, as ingest would have. (A summary of the whole tensor in one pass,
as a capture computes it, folds in another order: its sum and sum of squares may differ in their last bits.)
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.chunking import ChunkLayout
from tensor_debugger.engine.summary_compare import Sketch, sample_positions
from tensor_debugger.ingest.summary import SummaryAccumulator
from tensor_debugger.store.dtypes import LogicalDtype, storage_to_compute

CHUNKS_PER_BLOCK = 16  # one store write covers this many chunks: fewer, larger writes run faster (writer.py)


@functools.lru_cache(maxsize=1024)
def _positions(numel: int) -> tuple[int, ...]:
    """`sample_positions`, remembered: tensors of a run share a few element counts, and each costs 256 hashes."""
    return tuple(sample_positions(numel))


def sampled_values(stored: NDArray[Any], logical: LogicalDtype) -> list[float]:
    """Stored elements as a summary samples them: their compute values in float64, complex ones' magnitudes (as
    Python floats: `tolist` makes the same ones as `float` of each, at C speed)."""
    values = storage_to_compute(stored, logical)
    if values.dtype.kind == "c":
        values = np.abs(values)
    with np.errstate(invalid="ignore"):  # torch widens a float8 "fnuz" NaN to a signalling NaN: it stays a NaN
        floats: list[float] = values.astype(np.float64).tolist()
        return floats


@dataclass
class SketchSample:
    """The sampled values of one tensor, gathered block by block in element order (`take`)."""

    logical: LogicalDtype
    numel: int
    offset: int = 0  # elements taken so far
    values: list[float] = field(default_factory=list)

    def take(self, block: NDArray[Any]) -> None:
        """The tensor's next block (stored values, any shape): keep its sampled elements."""
        positions = _positions(self.numel)
        start, stop = self.offset, self.offset + block.size
        first, last = bisect.bisect_left(positions, start), bisect.bisect_left(positions, stop)
        if last > first:
            at = np.asarray(positions[first:last], dtype=np.int64) - start
            self.values.extend(sampled_values(block.reshape(-1)[at], self.logical))
        self.offset = stop

    def sketch(self, shape: tuple[int, ...], digest: str, totals: SummaryAccumulator) -> Sketch:
        """The summary, once every block was taken and folded into `totals` in order."""
        if self.offset != self.numel or len(self.values) != len(_positions(self.numel)):
            raise ValueError(f"a summary of {self.numel} elements was given {self.offset}")
        return sketch_of(shape, self.logical.name, digest, totals, self.values)

    def kept(
        self, shape: tuple[int, ...], digest: str, totals: SummaryAccumulator, fold64: str | None = None
    ) -> dict[str, Any]:
        """`sketch` as its row keeps it, `Sketch.to_json(compact=True)`, with `fold64` (the "fold64" hash of the same
        bytes) beside `digest`: held for every tensor of a run until the run's rows are written, so its sample is
        one string, not 256 float objects."""
        return dataclasses.replace(self.sketch(shape, digest, totals), fold64=fold64).to_json(compact=True)


def sketch_of(
    shape: tuple[int, ...], dtype: str, digest: str, totals: SummaryAccumulator, sample: list[float]
) -> Sketch:
    """A Sketch from a tensor's folded summary: sum and sum of squares from its count, mean and squared deviations."""
    count, mean = totals.count, totals.mean
    return Sketch(
        tuple(shape),
        dtype,
        digest,
        math.prod(shape),
        count,
        mean * count if count else 0.0,
        totals.m2 + count * mean * mean if count else 0.0,
        float(totals.lo) if count else None,
        float(totals.hi) if count else None,
        totals.nan,
        totals.inf,
        tuple(sample),
    )


def stored_layout(shape: tuple[int, ...], chunks: tuple[int, ...]) -> ChunkLayout:
    """The chunk layout ingest planned for a stored array of `shape` chunked as `chunks` (`plan_chunks`): its split
    axis is the first whose chunks have size 1 on the axes before and whole trailing dimensions after. Raises
    ValueError for chunks `plan_chunks` does not make."""
    if not shape:
        return ChunkLayout((), (), -1)
    for axis in range(len(shape)):
        before = all(c == 1 for c in chunks[:axis])
        after = tuple(chunks[axis + 1 :]) == tuple(max(1, d) for d in shape[axis + 1 :])
        if before and after:
            return ChunkLayout(tuple(shape), tuple(chunks), axis)
    raise ValueError(f"chunks {chunks} of shape {shape} are not ingest's")
