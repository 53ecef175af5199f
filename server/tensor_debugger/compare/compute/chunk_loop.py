"""A pair's blocks compared chunk by chunk in compiled code (chunk_loop.c), without the GIL and without arrays.

Reading a block through the views decodes every chunk into a fresh array, and the kernel then reads those arrays
back from memory; between chunks, Python holds the GIL. The loop in chunk_loop.c instead reads each side's chunk
files, decodes each chunk into one small buffer that stays in cache, and hands the kernel the stretch where both
sides' chunks overlap (bench/compare.py; the README's Performance section has the figures). For arrays in object
storage, the block's chunk objects of both sides are fetched first, concurrently (store/object_chunks.py), and the
loop decodes their bytes in memory as it decodes files (bench/cluster.py).

It serves pairs that are compared with tolerances (not exactly) whose two sides are each one stored tensor read
in C order (no alignment, or size-1 dimensions dropped or added, flattening, or rows truncated), stored as float32,
float64, bfloat16 or float16, in the chunk layout ingest writes. Any block the loop does not finish (a chunk never
written, a broken chunk file, a NaN or an Inf) is read through the views instead, which fill, name the broken file,
or count the NaN as before. TENSOR_DEBUGGER_KERNEL=blocks (or =numpy) turns the loop off.
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.chunking import Region
from tensor_debugger.engine.fused import (
    STORED_FLOATS,
    FusedPartial,
    Kernel,
    default_kernel,
    empty_partial,
    load_library,
    partial_type,
)
from tensor_debugger.engine.layouts import Piece, Side
from tensor_debugger.engine.metrics import DEFAULT_TOP, edges
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.engine.views import View, flat_source
from tensor_debugger.store.chunk_reader import ChunkReader
from tensor_debugger.store.object_chunks import ObjectChunkReader

# A side's pieces as flat_pieces gives them: (chunk file path or chunk object key, values before, values in it)
Pieces = list[tuple[bytes, int, int]]

LIBRARY_NAME = "_chunk_loop.so"
BLOSC_HEADER = 16  # bytes: a Blosc 1 frame is never longer than its values plus this
_LARGEST_CHUNK = (1 << 31) - 1 - BLOSC_HEADER  # C-Blosc2 takes sizes as int32
_FAILURES = {
    1: "a chunk file is missing",
    2: "a chunk file could not be read",
    3: "not a Blosc frame of one chunk",
    4: "Blosc could not decode it",
    5: "a dtype the loop does not widen",
    6: "a NaN or an Inf",
}


def _piece_type() -> type[ctypes.Structure]:
    """tdc_piece (engine/layouts.py's Piece): a stretch of one chunk file."""
    return Piece


def _side_type() -> type[ctypes.Structure]:
    """tdc_side (engine/layouts.py's Side): one side's pieces of a block, and the thread's buffers."""
    return Side


@functools.cache
def _library() -> ctypes.CDLL | None:
    library = load_library(Path(__file__).with_name(LIBRARY_NAME), {"tdc_side_size": _side_type()})
    if library is None:
        return None
    library.tdc_pair.restype = ctypes.c_int
    library.tdc_pair.argtypes = [
        ctypes.POINTER(_side_type()),
        ctypes.POINTER(_side_type()),
        ctypes.c_void_p,
        ctypes.c_double,
        ctypes.c_double,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.POINTER(partial_type()),
        ctypes.POINTER(ctypes.c_int),
        ctypes.POINTER(ctypes.c_int64),
    ]
    library.tdc_read.restype = ctypes.c_int
    library.tdc_read.argtypes = [ctypes.POINTER(_side_type()), ctypes.POINTER(ctypes.c_int64)]
    return library


def loop_name(kernel: Kernel | None = None) -> str:
    """Whether comparisons with `kernel` (the default kernel where None) read chunks through the compiled loop:
    "chunk loop", or why not."""
    kernel = kernel if kernel is not None else default_kernel()
    if kernel.path in ("numpy", "blocks"):
        return f"off (TENSOR_DEBUGGER_KERNEL={kernel.path})"
    if kernel.address(np.dtype(np.float32), np.dtype(np.float32)) is None:
        return "off (the compiled kernel is not in use)"
    if _library() is None:
        return f"off (no usable {LIBRARY_NAME} beside {Path(__file__).name})"
    return "chunk loop"


class _Buffers(threading.local):
    """One thread's buffers for one side: the compressed bytes of a chunk, its values, and them widened."""

    def __init__(self) -> None:
        self.compressed = self.decoded = self.widened = np.empty(0, dtype=np.uint8)
        self.pieces: ctypes.Array[ctypes.Structure] | None = None  # the last side's, alive while C reads them

    def side(
        self, pieces: Pieces, chunk_bytes: int, code: str, raw: bool, fetched: list[NDArray[Any]] | None = None
    ) -> ctypes.Structure:
        """The side of `pieces`, their chunks read from their files, or with `fetched` (each piece's chunk object's
        bytes, which the caller keeps alive until C is done) from memory."""
        if self.decoded.size < chunk_bytes:
            self.compressed = np.empty(chunk_bytes + BLOSC_HEADER, dtype=np.uint8)
            self.decoded = np.empty(chunk_bytes, dtype=np.uint8)
        if code in "bh" and self.widened.size < 2 * chunk_bytes:  # 2-byte values as float32
            self.widened = np.empty(2 * chunk_bytes, dtype=np.uint8)
        piece = _piece_type()
        if fetched is None:
            self.pieces = (piece * len(pieces))(*(piece(*p) for p in pieces))
        else:
            self.pieces = (piece * len(pieces))(
                *(piece(*p, data.ctypes.data, data.size) for p, data in zip(pieces, fetched, strict=True))
            )
        return _side_type()(
            ctypes.addressof(self.pieces),
            len(pieces),
            chunk_bytes,
            ord(code),
            int(raw),
            self.compressed.ctypes.data,
            self.decoded.ctypes.data,
            self.widened.ctypes.data,
        )


_BUFFERS = (_Buffers(), _Buffers())  # per thread: side a's and side b's


@dataclass(frozen=True)
class ChunkPairs:
    """Compares blocks of one pair (regions of its aligned shape) in the compiled loop; see `chunk_pairs`."""

    a: ChunkReader
    b: ChunkReader
    codes: tuple[str, str]  # the loop's letters for each side's stored values
    shape: tuple[int, ...]  # the aligned shape that regions are of
    kernel: int  # the address of td_stats_XY_<family> (fused.kernel_address)
    top: int  # worst elements kept per block

    def __call__(self, region: Region, tolerance: Tolerance) -> FusedPartial | None:
        """The statistics of one block (C-contiguous in the aligned shape, as comparisons cut them), or None where
        the loop did not finish it: the caller then reads it through the views."""
        start, stop = self.flat_range(region)
        pieces_a, pieces_b = self.a.flat_pieces(start, stop), self.b.flat_pieces(start, stop)
        assert pieces_a is not None and pieces_b is not None  # `chunk_pairs` checked
        fetching_a, fetching_b = _fetch(self.a, pieces_a), _fetch(self.b, pieces_b)  # both sides' objects at once
        try:
            held_a, held_b = _held(fetching_a), _held(fetching_b)
        except _LeftToViews:
            return None
        out = self._out()
        status = self._loop(pieces_a, pieces_b, (self.a.raw, self.b.raw), held_a, held_b, tolerance, out)
        del held_a, held_b  # the fetched bytes: C is done with them
        if status != 0:
            return None
        self.a.count_reads(len(pieces_a))
        self.b.count_reads(len(pieces_b))
        return out

    def in_memory(
        self, pieces: tuple[Pieces, Pieces], chunks: tuple[list[NDArray[Any]], list[NDArray[Any]]], tolerance: Tolerance
    ) -> FusedPartial | None:
        """The statistics of one block from its chunks' values in memory instead of their files (the block's
        `flat_pieces` on each side, and each piece's whole chunk as `chunk_bytes` bytes of values, as a raw chunk
        file holds them): the same kernel calls over the same stretches as reading the files, so the same
        statistics (compare/compute/lockstep.py). None where the loop did not finish it (a NaN or an Inf)."""
        out = self._out()
        status = self._loop(pieces[0], pieces[1], (True, True), chunks[0], chunks[1], tolerance, out)
        return out if status == 0 else None

    def _out(self) -> FusedPartial:
        return empty_partial(self.top)

    def flat_range(self, region: Region) -> tuple[int, int]:
        """[start, stop) of a block (a region of the aligned shape) as flat C-order offsets."""
        start = int(np.ravel_multi_index(tuple(s.start for s in region), self.shape))
        return start, start + math.prod(s.stop - s.start for s in region)

    def _loop(
        self,
        pieces_a: Pieces,
        pieces_b: Pieces,
        raw: tuple[bool, bool],
        held_a: list[NDArray[Any]] | None,
        held_b: list[NDArray[Any]] | None,
        tolerance: Tolerance,
        out: FusedPartial,
    ) -> int:
        """tdc_pair over the two sides' pieces, read from their files or (`held_*`) from memory, into `out`."""
        library = _library()
        assert library is not None  # `chunk_pairs` checked
        side_a = _BUFFERS[0].side(pieces_a, self.a.chunk_bytes, self.codes[0], raw[0], held_a)
        side_b = _BUFFERS[1].side(pieces_b, self.b.chunk_bytes, self.codes[1], raw[1], held_b)
        failed_side, failed_piece = ctypes.c_int(0), ctypes.c_int64(-1)
        return int(
            library.tdc_pair(
                side_a,
                side_b,
                self.kernel,
                tolerance.atol,
                tolerance.rtol,
                1,
                edges().ctypes.data,
                out,
                failed_side,
                failed_piece,
            )
        )


def chunk_pairs(
    a: View, b: View, exact: bool, top: int = DEFAULT_TOP, kernel: Kernel | None = None
) -> ChunkPairs | None:
    """The compiled loop of `kernel` (the default kernel where None) for a pair of aligned views `a` and `b` (keeping
    `top` worst elements), or None where it does not serve them (see the module's docstring): their blocks are then
    read through the views."""
    kernel = kernel if kernel is not None else default_kernel()
    if exact or a.shape != b.shape or loop_name(kernel) != "chunk loop":
        return None
    reader_a, reader_b = _flat_reader(a), _flat_reader(b)
    if reader_a is None or reader_b is None:
        return None
    code_a, code_b = STORED_FLOATS[reader_a.logical or ""][0], STORED_FLOATS[reader_b.logical or ""][0]
    library, address = _library(), kernel.address(_widened(code_a), _widened(code_b))
    if library is None or address is None or ("h" in (code_a, code_b) and not library.tdc_float16()):
        return None
    if max(reader_a.chunk_bytes, reader_b.chunk_bytes) > _LARGEST_CHUNK:
        return None
    return ChunkPairs(reader_a, reader_b, (code_a, code_b), tuple(a.shape), address, top)


def _fetch(reader: ChunkReader, pieces: Pieces) -> Future[list[Any]] | None:
    """The fetch of `pieces`' chunk objects, started, where `reader`'s array is in object storage; None for files."""
    return reader.fetch_pieces(pieces) if isinstance(reader, ObjectChunkReader) else None


class _LeftToViews(Exception):
    """A block's chunk objects that the loop does not read: one is not there (the fill value), is empty, or could not
    be fetched (the views fetch it again, and name it)."""


def _held(fetching: Future[list[Any]] | None) -> list[NDArray[Any]] | None:
    """The fetched chunk objects' bytes, as arrays over them (None for files); _LeftToViews where the loop leaves the
    block to the views."""
    if fetching is None:
        return None
    try:
        found = fetching.result()
    except OSError:
        raise _LeftToViews from None
    if any(data is None or len(data) == 0 for data in found):
        raise _LeftToViews
    return [np.frombuffer(data, dtype=np.uint8) for data in found]


def _flat_reader(view: View) -> ChunkReader | None:
    """The chunk reader of the one stored tensor whose C-order values are `view`'s, where the loop reads its
    dtype and layout."""
    source = flat_source(view)
    reader = source.array if source is not None else None
    if not isinstance(reader, ChunkReader) or not reader.flat_chunks:
        return None
    stored = STORED_FLOATS.get(reader.logical or "")
    return reader if stored is not None and stored[1] == reader.dtype else None


def _widened(code: str) -> np.dtype[Any]:
    """The dtype the pair kernel reads a side stored as `code` in: float64 as it is, the rest as float32."""
    return np.dtype(np.float64 if code == "d" else np.float32)


def read_chunks(reader: ChunkReader, start: int, stop: int) -> None:
    """Read and decode the chunks holding flat values [start, stop) of `reader`'s array in the compiled loop, into
    the thread's buffer, and nothing else: the benchmark's measure of how fast the store can be read."""
    library = _library()
    pieces = reader.flat_pieces(start, stop)
    if library is None or pieces is None or reader.chunk_bytes > _LARGEST_CHUNK:
        raise RuntimeError(f"the compiled chunk loop cannot read {reader.shape} chunks of {reader.chunks}")
    try:
        held = _held(_fetch(reader, pieces))
    except _LeftToViews:
        raise OSError(f"the chunk objects of values [{start}, {stop}) could not all be fetched") from None
    side = _BUFFERS[0].side(pieces, reader.chunk_bytes, "f", reader.raw, held)
    failed = ctypes.c_int64(-1)
    status = library.tdc_read(side, failed)
    del held
    if status != 0:
        path = pieces[failed.value][0].decode(errors="replace")
        raise OSError(f"chunk file {path}: {_FAILURES.get(status, f'error {status}')}")
    reader.count_reads(len(pieces))
