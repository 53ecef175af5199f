"""What a tensor file's leaves are read through, block by block: positioned reads of a byte range into pooled
buffers (`RawReader`), an array with numpy indexing (`ArrayReader`), or a decompressing stream read in order
(`StreamReader`)."""

from __future__ import annotations

import math
import mmap
import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.chunking import Region, region_flat_range, region_shape
from tensor_debugger.errors import FileProblem
from tensor_debugger.store.direct_writes import ALIGN
from tensor_debugger.store.dtypes import LogicalDtype


class BlockReader(Protocol):
    def read(self, region: Region) -> NDArray[Any]:
        """The region's values in the storage dtype, C-contiguous."""

    def done(self, region: Region) -> None:
        """The region has been copied; its resources may be given back."""


@dataclass(frozen=True)
class Leaf:
    key_path: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: LogicalDtype
    reader: BlockReader


@dataclass
class TensorFile:
    """The leaves of one opened file, and what in it was not a tensor. Close it to unmap the file."""

    leaves: list[Leaf]
    skipped: list[FileProblem] = field(default_factory=list)
    _stack: ExitStack = field(default_factory=ExitStack)

    def close(self) -> None:
        self.leaves.clear()
        self._stack.close()

    def __enter__(self) -> TensorFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def aligned_buffer(nbytes: int) -> NDArray[Any]:
    """`nbytes` bytes that start on a boundary of `ALIGN` (numpy's large arrays start 16 bytes past a page): a block
    read into it lies where a direct write can take its chunks from (store/direct_writes.py), without a copy."""
    whole = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = -int(whole.__array_interface__["data"][0]) % ALIGN
    return whole[start : start + nbytes]


class BufferPool:
    """Byte buffers that finished blocks give back, shared by the readers of one file and capped, so that memory
    stays at a few blocks however many tensors the file holds: new memory costs this VM a page fault per 4 KiB,
    and a zeroed bytearray one more pass (measured: about 9% of a bfloat16 ingest's samples were there)."""

    def __init__(self, keep: int = 4) -> None:
        self._keep = keep  # as many as the writer holds blocks at once (WritePools.buffers)
        self._free: list[NDArray[Any]] = []
        self.made = 0  # buffers allocated (not taken from the kept ones)

    def take(self, nbytes: int) -> NDArray[Any]:
        """The smallest kept buffer of at least `nbytes` bytes, else a new one."""
        fitting = [i for i, b in enumerate(self._free) if b.size >= nbytes]
        if not fitting:
            self.made += 1
            return aligned_buffer(nbytes)
        return self._free.pop(min(fitting, key=lambda i: self._free[i].size))  # by position: arrays have no ==

    def give(self, buffer: NDArray[Any]) -> None:
        self._free.append(buffer)
        if len(self._free) > self._keep:
            self._free.pop(min(range(len(self._free)), key=lambda i: self._free[i].size))

    @property
    def held(self) -> int:
        """Bytes kept for later blocks."""
        return sum(b.size for b in self._free)


def buffer_pool(buffers: int | BufferPool) -> BufferPool:
    """`buffers` itself when a pool (shared with the files read before), else a new pool keeping that many."""
    return buffers if isinstance(buffers, BufferPool) else BufferPool(buffers)


class _PooledReader:
    """C-order values at `offset` of a file, read region by region into buffers of the file's `BufferPool`, which
    `done` gives back. A subclass says how to fill a buffer from a position (`_fill`)."""

    def __init__(self, offset: int, shape: tuple[int, ...], dtype: LogicalDtype, pool: BufferPool) -> None:
        self._offset = offset
        self._shape = shape
        self._dtype = dtype
        self._pool = pool
        self._lent: dict[tuple[tuple[int, int], ...], NDArray[Any]] = {}

    def read(self, region: Region) -> NDArray[Any]:
        start, stop = region_flat_range(self._shape, region)
        size = self._dtype.itemsize
        nbytes = (stop - start) * size
        buffer = self._pool.take(nbytes)
        self._lent[_bounds(region)] = buffer
        self._fill(buffer.data[:nbytes], self._offset + start * size)  # a 1-D uint8 buffer: its bytes, in order
        return buffer[:nbytes].view(self._dtype.numpy_storage).reshape(region_shape(region))

    def done(self, region: Region) -> None:
        buffer = self._lent.pop(_bounds(region), None)
        if buffer is not None:
            self._pool.give(buffer)

    def _fill(self, view: memoryview, position: int) -> None:
        """Fill all of `view` with the file's bytes from `position` on."""
        raise NotImplementedError


class RawReader(_PooledReader):
    """Values in an open file, read with os.pread (no mapping, no whole-file read)."""

    def __init__(self, fd: int, offset: int, shape: tuple[int, ...], dtype: LogicalDtype, pool: BufferPool) -> None:
        super().__init__(offset, shape, dtype, pool)
        self._fd = fd

    def _fill(self, view: memoryview, position: int) -> None:
        got = 0
        while got < len(view):
            n = os.preadv(self._fd, [view[got:]], position + got)
            if n == 0:
                raise OSError("file ended before the tensor's data did")
            got += n


def _bounds(region: Region) -> tuple[tuple[int, int], ...]:
    return tuple((s.start, s.stop) for s in region)


class ArrayReader:
    """Any array-like with numpy indexing (a Fortran-ordered .npy memory map)."""

    def __init__(self, array: Any) -> None:
        self._array = array

    def read(self, region: Region) -> NDArray[Any]:
        return np.array(self._array[region] if region else self._array, order="C", copy=True)

    def done(self, region: Region) -> None:
        return None


class FortranReader:
    """The values of a file of raw Fortran-order data (a decompressed .npy member). A region in C order is spread
    over the whole file: where its runs along the first axis (contiguous in the file) are long enough, they are read
    with positioned reads into the block, so the process holds the block and nothing more; shorter runs are read
    through a read-only mapping whose pages are dropped from the process after each block (MADV_DONTNEED: a file's
    large page-cache folios map whole, so a strided read maps most of the file)."""

    MIN_RUN = 4096  # bytes of a run worth a read of its own

    def __init__(self, path: Path, shape: tuple[int, ...], dtype: np.dtype[Any], stack: ExitStack) -> None:
        self._shape = shape
        self._dtype = dtype
        self._fd = open_fd(path, stack)
        self._map: mmap.mmap | None = None
        if math.prod(shape):
            self._map = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
            stack.callback(self._map.close)

    def read(self, region: Region) -> NDArray[Any]:
        if self._map is None:
            return np.empty(self._shape, self._dtype)[region]
        # a region may name fewer axes than the tensor has: the rest are whole
        bounds = [s.indices(n)[:2] for s, n in zip(region, self._shape, strict=False)]
        bounds += [(0, n) for n in self._shape[len(bounds) :]]
        extents = tuple(stop - start for start, stop in bounds)
        run = extents[0] * self._dtype.itemsize
        if run >= self.MIN_RUN:
            return np.ascontiguousarray(self._runs(bounds, extents))
        values = np.frombuffer(self._map, dtype=self._dtype).reshape(self._shape, order="F")
        block = np.array(values[tuple(slice(a, b) for a, b in bounds)], order="C", copy=True)
        del values
        self._map.madvise(mmap.MADV_DONTNEED)
        return block

    def _runs(self, bounds: list[tuple[int, int]], extents: tuple[int, ...]) -> NDArray[Any]:
        """The region in Fortran order, one positioned read per run along the first axis."""
        out = np.empty(extents, self._dtype, order="F")
        flat = out.reshape(-1, order="F").view(np.uint8).data  # the same memory: F order is its own
        run = extents[0] * self._dtype.itemsize
        others = extents[1:]
        strides = np.cumprod((1, *self._shape[:-1]))  # elements between neighbours along each axis, in the file
        for k in range(math.prod(others)):
            index = np.unravel_index(k, others, order="F") if others else ()
            element = bounds[0][0] + sum(
                int(strides[axis + 1]) * (bounds[axis + 1][0] + int(i)) for axis, i in enumerate(index)
            )
            target = flat[k * run : (k + 1) * run]
            got = os.preadv(self._fd, [target], element * self._dtype.itemsize)
            if got != run:
                raise OSError(f"the decompressed data ends early ({got} of {run} bytes)")
        return out

    def done(self, region: Region) -> None:
        return None


def open_fd(path: Path, stack: ExitStack) -> int:
    fd = os.open(path, os.O_RDONLY)
    stack.callback(os.close, fd)
    return fd


class StreamReader(_PooledReader):
    """Values of a decompressing stream (a compressed zip member). Regions are read in the order a writer reads
    them, so the stream only moves forward; a region behind it is still read right (zipfile's stream then
    decompresses again from the start). An error of the stream (corrupt data, a bad checksum) is an OSError naming
    `label`."""

    def __init__(
        self, stream: IO[bytes], offset: int, shape: tuple[int, ...], dtype: LogicalDtype, pool: BufferPool, label: str
    ) -> None:
        super().__init__(offset, shape, dtype, pool)
        self._stream = stream
        self._label = label

    def _fill(self, view: memoryview, position: int) -> None:
        try:
            if self._stream.tell() != position:
                self._stream.seek(position)
            got = 0
            while got < len(view):
                n = self._stream.readinto(view[got:])  # type: ignore[attr-defined]
                if not n:
                    raise OSError("the member ended before the tensor's data did")
                got += n
        except OSError:
            raise
        except Exception as exc:  # zlib.error, zipfile.BadZipFile (a bad CRC), EOFError, lzma and bz2 errors
            raise OSError(f"{self._label}: the compressed member could not be read ({exc})") from None
