"""Reading stored arrays without Zarr's event loop: chunk files read and Blosc-decoded in the calling thread.

Zarr 3 reads every chunk through its asyncio event loop and hands each decode to a thread of its own; on two cores
that machinery costs more CPU than the decoding itself (measured: 1.2 GB/s of float32 per CPU-second through Zarr,
about 3 GB/s reading and decoding the files directly). Comparisons read whole chunks, many times, so for arrays in
the layouts this store writes (a local folder, a regular chunk grid, little-endian bytes and one Blosc codec or
none) a `ChunkReader` reads the chunk files itself and decodes each whole chunk straight into its place in the
result (a raw chunk is read straight there), releasing the GIL while it reads and decodes. Anything else is read
through Zarr, as before.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.store.layout import ArrayLayout, missing_chunk


@functools.cache
def _blosc() -> Any:
    """The Blosc codec chunks are decoded with (its settings are read from each chunk's header); numcodecs is
    imported on the first chunk read, not by what only reads the metadata database."""
    from numcodecs import Blosc

    return Blosc()


_BUFFERS = threading.local()  # one growing byte buffer per thread for the compressed bytes of a chunk


class ReadCounter:
    """Chunks read (not metadata), so tests and benchmarks can see what a computation touched."""

    def __init__(self) -> None:
        self.chunks = 0
        self._lock = threading.Lock()

    def add(self, chunks: int) -> None:
        with self._lock:
            self.chunks += chunks


def _split_axis(shape: tuple[int, ...], chunks: tuple[int, ...]) -> int | None:
    """The axis a chunk covers part of, where every chunk is a range of the flat array in C order: chunks of size 1
    before it and whole dimensions after it. None for any other chunk shape."""
    axis = len(shape) - 1
    while axis > 0 and chunks[axis] == shape[axis]:
        axis -= 1
    return None if any(c != 1 for c in chunks[:axis]) else axis


class ChunkReader:
    """Reads any region of one array (numpy basic indexing with step-1 slices) from its chunk files."""

    def __init__(self, layout: ArrayLayout, folder: Path, counter: ReadCounter, open_array: Callable[[], Any]) -> None:
        """`layout` must be `readable`; `folder` is where the chunks are (for an array in object storage, its key:
        store/object_chunks.py); `open_array` opens the Zarr array, for the rare region this reader leaves to Zarr
        (slices with steps)."""
        if not layout.readable:
            raise ValueError(f"array at {folder} is not in a layout a ChunkReader reads")
        self.shape = layout.shape
        self.dtype = layout.dtype
        self.chunks = layout.chunks
        self._folder = folder
        self._layout = layout
        self._fill = np.asarray(layout.fill_value, dtype=self.dtype)
        self._counter = counter
        self._open_array = open_array
        self.logical: str | None = layout.attributes.get("logical_dtype")  # as ingest wrote it (bfloat16...)
        self.chunk_bytes = layout.chunk_bytes  # decoded size of one (whole) chunk
        self._split = _split_axis(self.shape, self.chunks)
        self._folder_bytes = os.fsencode(folder)
        self.raw = layout.raw  # chunk files hold the values as they are, no Blosc frame

    @property
    def flat_chunks(self) -> bool:
        """Whether every chunk is a range of the flat array in C order (as this store writes them): `flat_pieces`
        serves only those."""
        return self._split is not None

    def count_reads(self, chunks: int) -> None:
        """Count chunks read without this reader (compare/chunk_loop reads its files itself)."""
        self._counter.add(chunks)

    def flat_pieces(self, start: int, stop: int) -> list[tuple[bytes, int, int]] | None:
        """The chunk files that hold the C-order flat values [start, stop) of the array, in order, each as (path,
        values of the decoded chunk before the piece, values in the piece); None where chunks are not ranges of
        the flat array (a chunk shape other than (1, ..., 1, c, whole trailing dimensions), which this store
        never writes)."""
        axis = self._split
        if axis is None:
            return None
        trailing = math.prod(self.shape[axis + 1 :])
        rows, per_chunk = self.shape[axis], self.chunks[axis]
        tail = (0,) * (len(self.shape) - axis - 1)
        pieces = []
        position = start
        while position < stop:
            lead, row = divmod(position // trailing, rows)
            chunk = row // per_chunk
            first_row = chunk * per_chunk
            end = (lead * rows + first_row + min(per_chunk, rows - first_row)) * trailing  # past the chunk's values
            count = min(stop, end) - position
            coords = tuple(int(i) for i in np.unravel_index(lead, self.shape[:axis])) + (chunk,) + tail
            key = self._layout.chunk_key(coords).encode()
            pieces.append((self._folder_bytes + b"/" + key, (row - first_row) * trailing + position % trailing, count))
            position += count
        return pieces

    def __getitem__(self, region: tuple[slice, ...]) -> NDArray[Any]:
        if len(region) != len(self.shape) or any(s.step not in (None, 1) for s in region):
            if self._layout.every_chunk_written:
                self._check_present(region)
            return np.asarray(self._open_array()[region])
        bounds = [s.indices(d)[:2] for s, d in zip(region, self.shape, strict=True)]
        out = np.empty(tuple(max(0, stop - start) for start, stop in bounds), dtype=self.dtype)
        if out.size == 0:
            return out
        grid = [range(start // c, (stop - 1) // c + 1) for (start, stop), c in zip(bounds, self.chunks, strict=True)]
        every = list(itertools.product(*grid))
        decode = self._decoder(every)
        scratch: NDArray[Any] | None = None
        count = 0
        for coords in every:
            origin = [i * c for i, c in zip(coords, self.chunks, strict=True)]
            inner = tuple(
                slice(max(lo, o) - o, min(hi, o + c) - o)
                for (lo, hi), o, c in zip(bounds, origin, self.chunks, strict=True)
            )
            target = out[
                tuple(
                    slice(o + s.start - lo, o + s.stop - lo)
                    for (lo, _), o, s in zip(bounds, origin, inner, strict=True)
                )
            ]
            whole = all(s.stop - s.start == c for s, c in zip(inner, self.chunks, strict=True))
            count += 1
            if whole and target.flags.c_contiguous:
                decode(coords, target)  # straight into place: no copy
                continue
            if scratch is None:
                scratch = np.empty(self.chunks, dtype=self.dtype)
            decode(coords, scratch)
            target[...] = scratch[inner]
        self._counter.add(count)  # like the store: a chunk never written counts as a read too
        return out

    def _check_present(self, region: tuple[Any, ...]) -> None:
        """Raise `missing_chunk` for the first chunk file of `region` (slices with steps, which Zarr reads and would
        fill) that is not there: a stat per chunk the region touches, on this rare path only."""
        if len(region) != len(self.shape) or not all(isinstance(s, slice) for s in region):
            return
        touched = [
            sorted({i // c for i in range(*s.indices(d))})
            for s, d, c in zip(region, self.shape, self.chunks, strict=True)
        ]
        for coords in itertools.product(*touched):
            path = self._folder / self._layout.chunk_key(coords)
            if not self._present(path):
                raise missing_chunk(self._chunk_name(path))

    def _present(self, path: Path) -> bool:
        """Whether the chunk at `path` is there (store/object_chunks.py: the object at that key)."""
        return path.exists()

    def _chunk_name(self, path: Path) -> str:
        """The chunk at `path`, as an error names it."""
        return f"file {path}"

    def _decoder(self, every: list[tuple[int, ...]]) -> Callable[[tuple[int, ...], NDArray[Any]], None]:
        """What decodes each chunk of a region (`every` chunk's coordinates) into a whole chunk's array: here, one
        chunk file read at a time (store/object_chunks.py fetches a region's chunk objects at once first)."""
        return self._decode

    def _decode(self, coords: tuple[int, ...], into: NDArray[Any]) -> None:
        """Decode one chunk into `into` (C-contiguous, one whole chunk)."""
        path = self._folder / self._layout.chunk_key(coords)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            if self._layout.every_chunk_written:  # it was written: damage, not values
                raise missing_chunk(f"file {path}") from None
            into[...] = self._fill  # an array from before the marker: never written, the fill value
            return
        if self.raw:
            _read_raw(fd, path, into)
            return
        try:
            size = os.fstat(fd).st_size
            buffer: bytearray | None = getattr(_BUFFERS, "buffer", None)
            if buffer is None or len(buffer) < size:
                buffer = _BUFFERS.buffer = bytearray(max(size, 1 << 20))
            view = memoryview(buffer)[:size]
            _read_exactly(fd, path, view)
        finally:
            os.close(fd)
        decode_frame(view, into, f"chunk file {path}")


def decode_frame(frame: memoryview, into: NDArray[Any], name: str) -> None:
    """Decode the Blosc frame `frame`, one whole chunk, into `into` (C-contiguous); ValueError starting with `name`
    (the chunk file or object) where it is not such a frame."""
    size = len(frame)
    # A Blosc 1 header holds the decoded size (bytes 4-8) and the frame's own length (12-16). Blosc would fill
    # only part of `into` for a smaller size, and decode past the end of the frame (into a buffer's bytes from an
    # earlier chunk), both silently.
    decoded, length = (int.from_bytes(frame[i : i + 4], "little") for i in (4, 12)) if size >= 16 else (-1, -1)
    if decoded != into.nbytes:
        raise ValueError(f"{name} is not a Blosc frame of one chunk ({into.nbytes} bytes)")
    if length != size:
        raise ValueError(f"{name} is cut short or padded: {size} bytes, its Blosc frame {length}")
    try:
        _blosc().decode(frame, out=into.reshape(-1).view(np.uint8))
    except RuntimeError as exc:  # numcodecs says only "error during blosc decompression: -1"
        raise ValueError(f"{name} could not be decoded: {exc}") from None


def _read_raw(fd: int, path: Path, into: NDArray[Any]) -> None:
    """Read a raw chunk file, which must be exactly one chunk long, into `into`, and close `fd`."""
    try:
        size = os.fstat(fd).st_size
        if size != into.nbytes:
            raise ValueError(f"chunk file {path} is not one raw chunk ({into.nbytes} bytes): it has {size}")
        _read_exactly(fd, path, into.reshape(-1).view(np.uint8).data)
    finally:
        os.close(fd)


def _read_exactly(fd: int, path: Path, view: memoryview) -> None:
    """Fill `view` (bytes) from `fd`'s position on; OSError naming `path` if the file ends first."""
    size = len(view)
    done = 0
    while done < size:
        got = os.readv(fd, [view[done:]])
        if got == 0:
            raise OSError(f"chunk file {path} ended after {done} of {size} bytes")
        done += got
