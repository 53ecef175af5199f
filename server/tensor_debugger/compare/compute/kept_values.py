"""A side's kept blocks (`lockstep_pairs.Half.kept`) read as a `Lockstep`'s block computations need them: the
chunk loop's pieces and whole chunks for a pair block's statistics, the values of a block of `where.locate_error`.
Each raises ValueError where the blocks kept do not hold what is asked (the pair is then read back from the store)."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.compare.compute.chunk_loop import Pieces
from tensor_debugger.compare.compute.lockstep_pairs import Half
from tensor_debugger.store.chunk_reader import ChunkReader
from tensor_debugger.store.dtypes import storage_to_compute


def stretches(half: Half, start: int, stop: int) -> list[NDArray[Any]]:
    """(under the lock) The kept bytes of flat values [start, stop) of one side, as the stretches of its blocks."""
    itemsize = half.dtype.numpy_storage.itemsize
    parts = [
        k.values[(max(start, k.start) - k.start) * itemsize : (min(stop, k.stop) - k.start) * itemsize]
        for k in half.kept
        if k.start < stop and k.stop > start
    ]
    if sum(p.size for p in parts) != (stop - start) * itemsize:
        raise ValueError("values outside the blocks kept")
    return parts


def block_values(half: Half, parts: list[NDArray[Any]], shape: tuple[int, ...]) -> NDArray[Any]:
    """A block's values as a view reads them (`storage_to_compute`: bfloat16 widened exactly), in `shape`."""
    joined = parts[0] if len(parts) == 1 else np.concatenate(parts)
    stored = joined.view(half.dtype.numpy_storage).reshape(shape)
    return storage_to_compute(stored, half.dtype)


def chunk_pieces(half: Half, reader: ChunkReader, start: int, stop: int) -> tuple[Pieces, list[NDArray[Any]]]:
    """(under the lock) The pieces of flat values [start, stop) of one side and each piece's whole chunk as
    `chunk_bytes` bytes of values: a view of the kept block, or for the last chunk of a row (shorter in memory than
    in its file) a padded copy; the loop reads only the piece's values of it."""
    pieces = reader.flat_pieces(start, stop)
    if pieces is None:
        raise ValueError("chunks are not ranges of the flat array")
    itemsize = half.dtype.numpy_storage.itemsize
    chunk_bytes = reader.chunk_bytes
    held: list[NDArray[Any]] = []
    position = start
    for _, skip, count in pieces:
        first = position - skip  # the chunk's first value
        kept = next((k for k in half.kept if k.start <= first < k.stop), None)
        if kept is None or position + count > kept.stop:
            raise ValueError("a chunk outside the blocks kept")
        offset = (first - kept.start) * itemsize
        whole = kept.values[offset : offset + chunk_bytes]
        if whole.size == chunk_bytes:
            held.append(whole)
        else:
            padded = np.zeros(chunk_bytes, dtype=np.uint8)
            padded[: whole.size] = whole
            held.append(padded)
        position += count
    return pieces, held
