"""Chunk layout: every stored chunk is one contiguous range of the tensor in C order.

A chunk spans whole trailing dimensions and part of one axis (the "split axis"), with size 1 on the axes before
it. Streaming C-order bytes into the array, hashing them in order, and reading any chunk as a flat range all
follow from that.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

Region = tuple[slice, ...]


@dataclass(frozen=True)
class ChunkLayout:
    shape: tuple[int, ...]
    chunks: tuple[int, ...]  # chunk shape, same rank as `shape`, every entry >= 1
    split_axis: int  # the one axis a chunk covers only part of (or -1 for a 0-d tensor)

    @property
    def chunk_elements(self) -> int:
        return math.prod(self.chunks)


def plan_chunks(shape: tuple[int, ...], itemsize: int, target_bytes: int) -> ChunkLayout:
    """Chunks of about `target_bytes`, shaped (1, ..., 1, c, full trailing dims)."""
    if not shape:
        return ChunkLayout((), (), -1)
    target = max(1, target_bytes // max(1, itemsize))
    for axis in range(len(shape)):
        trailing = math.prod(shape[axis + 1 :])
        if trailing <= target:
            count = max(1, min(shape[axis], target // max(1, trailing)))
            chunks = (1,) * axis + (count,) + tuple(max(1, d) for d in shape[axis + 1 :])
            return ChunkLayout(shape, chunks, axis)
    raise AssertionError("unreachable: the last axis always has trailing size 1")


def iter_blocks(layout: ChunkLayout, chunks_per_block: int) -> Iterator[Region]:
    """Regions of up to `chunks_per_block` consecutive chunks, in C order, aligned to the chunk grid.

    Each region is a contiguous C-order range of the tensor; together they cover it exactly once.
    """
    shape = layout.shape
    if not shape:
        yield ()
        return
    if math.prod(shape) == 0:
        return
    axis = layout.split_axis
    step = layout.chunks[axis] * max(1, chunks_per_block)
    trailing = tuple(slice(0, d) for d in shape[axis + 1 :])
    for lead in _leading_indices(shape[:axis]):
        lead_region = tuple(slice(i, i + 1) for i in lead)
        for start in range(0, shape[axis], step):
            yield lead_region + (slice(start, min(start + step, shape[axis])),) + trailing


def _leading_indices(dims: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    if not dims:
        yield ()
        return
    for i in range(dims[0]):
        for rest in _leading_indices(dims[1:]):
            yield (i, *rest)


def region_shape(region: Region) -> tuple[int, ...]:
    return tuple(s.stop - s.start for s in region)


def region_flat_range(shape: tuple[int, ...], region: Region) -> tuple[int, int]:
    """[start, stop) of a block region from `iter_blocks` as flat C-order element offsets."""
    if not shape:
        return (0, 1)
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    start = sum(s.start * st for s, st in zip(region, strides, strict=True))
    return start, start + math.prod(region_shape(region))
