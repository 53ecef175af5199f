"""Writing stored arrays without Zarr's event loop: each chunk Blosc-encoded (or kept raw) and written in the
calling thread.

The write-side twin of `chunk_reader`. Zarr 3 writes a chunk by building a full chunk of fill values, copying the
new values into it, encoding it on a thread of its own through its asyncio event loop, and writing a temporary
file that is then renamed. Ingest writes every chunk exactly once, whole, into an array that no one reads until
its run is committed (a killed ingest leaves only orphans that recovery deletes), so a `ChunkWriter` encodes each
chunk straight from the block it is handed and writes the final file at once, releasing the GIL for both. The
bytes are the ones Zarr would write: the same codec, with the settings Zarr gives it for this array, or for an
array stored raw (no compressor) the chunk's values as they are.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.store.direct_writes import write_chunk_file
from tensor_debugger.store.layout import ArrayLayout


def _shuffle(name: str) -> int:
    """numcodecs' constant for Blosc's `name`d shuffle (numcodecs is imported by what encodes, when it does)."""
    from numcodecs import Blosc

    shuffles: dict[str, int] = {"noshuffle": Blosc.NOSHUFFLE, "shuffle": Blosc.SHUFFLE, "bitshuffle": Blosc.BITSHUFFLE}
    return shuffles[name]


class ChunkWriter:
    """Writes regions of one array that start on chunk boundaries (numpy basic indexing, step-1 slices)."""

    def __init__(self, layout: ArrayLayout, folder: Path, direct: bool = True) -> None:
        """`layout` (the array's zarr.json, as Zarr wrote it) must be `readable`; `direct`: write large chunk files
        around the page cache where the file system allows it (`direct_writes`)."""
        if not layout.readable:
            raise ValueError(f"array at {folder} is not in a layout a ChunkWriter writes")
        self.shape = layout.shape
        self.dtype = layout.dtype
        self.chunks = layout.chunks
        self._layout = layout
        self._folder = folder
        self._fill = np.asarray(layout.fill_value, dtype=self.dtype)
        self._zero_fill = not self._fill.tobytes().strip(b"\0")  # the fill value's bytes are zeros (0, 0.0, False)
        codec = layout.blosc
        self._codec: Any = None  # raw chunks
        if codec is not None:
            from numcodecs import Blosc  # here, not at the top: what writes raw chunks or reads needs none

            self._codec = Blosc(
                cname=codec.cname,
                clevel=codec.clevel,
                shuffle=_shuffle(codec.shuffle),
                blocksize=codec.blocksize,
                typesize=codec.typesize,
            )
        self._made: set[Path] = set()
        self._direct = direct

    def __setitem__(self, region: tuple[slice, ...], values: NDArray[Any]) -> None:
        for coords, data, size in self.encoded(region, values):
            self._write(coords, data, size)

    def encoded(self, region: tuple[slice, ...], values: NDArray[Any]) -> Iterator[tuple[tuple[int, ...], Any, int]]:
        """The chunks of `region` set to `values`, one at a time, each encoded as its file holds it: (coords, bytes,
        size), where the file is the bytes extended with zeros to `size` bytes when they are fewer (else 0)."""
        if len(region) != len(self.shape) or any(s.step not in (None, 1) for s in region):
            raise ValueError(f"a ChunkWriter writes step-1 regions of all {len(self.shape)} dimensions")
        bounds = [s.indices(d)[:2] for s, d in zip(region, self.shape, strict=True)]
        if any(start % c for (start, _), c in zip(bounds, self.chunks, strict=True)):
            raise ValueError(f"region {region} does not start on a chunk boundary of {self.chunks}")
        values = np.asarray(values, dtype=self.dtype).reshape(tuple(stop - start for start, stop in bounds))
        if values.size == 0:
            return
        grid = [range(start // c, (stop - 1) // c + 1) for (start, stop), c in zip(bounds, self.chunks, strict=True)]
        for coords in itertools.product(*grid):
            origin = [i * c for i, c in zip(coords, self.chunks, strict=True)]
            part = values[
                tuple(
                    slice(o - lo, min(o + c, hi) - lo)
                    for (lo, hi), o, c in zip(bounds, origin, self.chunks, strict=True)
                )
            ]
            if (
                self._codec is None
                and self._zero_fill
                and part.flags.c_contiguous
                and part.shape[1:] == self.chunks[1:]
            ):
                # raw, short in its first dimension only (the last chunk of a tensor, most often): the chunk's
                # bytes are the part's, then zeros, which the file's end gives when it is extended (no padded copy)
                yield coords, part.reshape(-1), self._layout.chunk_bytes
                continue
            if part.shape != self.chunks or not part.flags.c_contiguous:
                # an edge chunk (stored whole, padded with the fill value, as Zarr does) or a strided view
                whole = np.full(self.chunks, self._fill, dtype=self.dtype)
                whole[tuple(slice(0, n) for n in part.shape)] = part
                part = whole
            flat = part.reshape(-1)
            yield coords, flat if self._codec is None else self._codec.encode(flat), 0

    def _write(self, coords: tuple[int, ...], data: Any, size: int = 0) -> None:
        """Write `data` as the chunk file at `coords`, extended with zeros to `size` bytes where it is shorter."""
        path = self._folder / self._layout.chunk_key(coords)
        if path.parent not in self._made:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._made.add(path.parent)
        write_chunk_file(path, chunk_view(data), size, self._direct)


def chunk_view(data: Any) -> memoryview:
    """The bytes of an encoded chunk (`ChunkWriter.encoded`'s: a numpy array or what the codec returned)."""
    return memoryview(data).cast("B") if not isinstance(data, np.ndarray) else memoryview(data.view(np.uint8).data)
