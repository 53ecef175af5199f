"""A .npy file opened as a tensor file: its header read as numpy's format describes it (never unpickled), its data
read at its byte range of the file (or, in a compressed archive member, from zipfile's stream).
"""

from __future__ import annotations

import ast
import math
import tempfile
import zlib
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

import numpy as np

from tensor_debugger.errors import FileProblem
from tensor_debugger.ingest.archives import Span
from tensor_debugger.ingest.block_readers import (
    ArrayReader,
    BlockReader,
    BufferPool,
    FortranReader,
    Leaf,
    RawReader,
    StreamReader,
    TensorFile,
    buffer_pool,
    open_fd,
)
from tensor_debugger.ingest.byte_ranges import open_range
from tensor_debugger.ingest.file_words import first_line
from tensor_debugger.ingest.shapes import check_shape
from tensor_debugger.store.dtypes import LogicalDtype, from_numpy

_NPY_MAGIC = b"\x93NUMPY"
_NPY_HEADER_LIMIT = 1 << 20  # numpy's own default refuses headers over 10,000 bytes; object arrays are refused


def read_npy_header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    """Shape, Fortran order and dtype from the header of the .npy file `f` (positioned at its start), leaving `f`
    at the first data byte. The format is numpy's published one (numpy.lib.format, versions 1.0 to 3.0): magic,
    version, header length (2 bytes for 1.0, 4 after), then a Python literal dict, read with `ast.literal_eval`."""
    prefix = f.read(8)
    if len(prefix) < 8 or prefix[:6] != _NPY_MAGIC or prefix[6] not in (1, 2, 3) or prefix[7] != 0:
        raise ValueError("not a .npy file (no NUMPY magic of version 1.0 to 3.0)")
    width = 2 if prefix[6] == 1 else 4
    raw_length = f.read(width)
    length = int.from_bytes(raw_length, "little")
    if len(raw_length) != width or length > _NPY_HEADER_LIMIT:
        raise ValueError(f"header length {length} is cut short or over {_NPY_HEADER_LIMIT} bytes")
    raw = f.read(length)
    if len(raw) != length:
        raise ValueError("header is cut short")
    header = ast.literal_eval(raw.decode("utf8" if prefix[6] == 3 else "latin1"))
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise ValueError(f"header is not a dict of descr, fortran_order and shape: {str(header)[:80]!r}")
    shape, fortran = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple):
        raise ValueError(f"shape {str(shape)[:80]!r} is not a tuple of sizes")
    check_shape(shape)  # BadShape, a ValueError
    if not isinstance(fortran, bool):
        raise ValueError(f"fortran_order {fortran!r} is not a bool")
    to_dtype: Callable[[Any], np.dtype[Any]] = np.lib.format.descr_to_dtype  # numpy 2.0's stubs leave it untyped
    return shape, fortran, to_dtype(header["descr"])


def _npy_dtype(dtype: np.dtype[Any], label: str) -> LogicalDtype:
    if dtype.hasobject:
        raise FileProblem(label, "holds Python objects (a pickle); refused, never unpickled")
    try:
        return from_numpy(dtype)
    except ValueError as exc:
        raise FileProblem(label, str(exc)) from None


def open_npy(path: Path, label: str, buffers: int | BufferPool, span: Span | None) -> TensorFile:
    """Open the .npy file at `path` (or its `span`); raises FileProblem."""
    try:
        with open_range(path, span) as f:
            shape, fortran, dtype = read_npy_header(f)
            offset = f.tell()
    except (ValueError, OSError, SyntaxError, TypeError, RecursionError) as exc:
        raise FileProblem(label, f"not a readable .npy file ({first_line(exc)})") from None
    logical = _npy_dtype(dtype, label)
    expected = math.prod(shape) * dtype.itemsize
    actual = (span.size if span is not None else path.stat().st_size) - offset
    if actual < expected:
        raise FileProblem(label, f"truncated: {expected} bytes of data expected, {actual} found")
    base = span.offset if span is not None else 0
    stack = ExitStack()
    reader: BlockReader
    if fortran and len(shape) > 1:
        values = (
            np.memmap(path, dtype=dtype, mode="r", offset=base + offset, shape=tuple(shape), order="F")
            if expected
            else np.empty(tuple(shape), dtype=dtype, order="F")  # nothing to map
        )
        reader = ArrayReader(values)
    else:
        reader = RawReader(open_fd(path, stack), base + offset, tuple(shape), logical, buffer_pool(buffers))
    return TensorFile([Leaf((), tuple(shape), logical, reader)], [], stack)


def packed_npy(
    stream: IO[bytes], label: str, buffers: int | BufferPool, scratch: Path | None, stack: ExitStack
) -> Leaf:
    """The tensor of a compressed .npy member, read from zipfile's `stream` (a Fortran-order one first decompressed
    into a file under `scratch`, or without it into memory)."""
    try:
        shape, fortran, dtype = read_npy_header(stream)
        offset = stream.tell()
    except (ValueError, OSError, SyntaxError, TypeError, RecursionError, EOFError, zlib.error) as exc:
        raise FileProblem(label, f"not a readable .npy file ({first_line(exc)})") from None
    logical = _npy_dtype(dtype, label)
    reader: BlockReader
    if fortran and len(shape) > 1:  # in the file's order: the writer's blocks (C order) are spread all over it
        count = math.prod(shape)
        try:
            if scratch is not None:
                data = _decompressed(stream, count * dtype.itemsize, scratch, stack)
                reader = FortranReader(data, shape, dtype, stack)  # closed before the file is removed
            else:
                values = np.frombuffer(stream.read(count * dtype.itemsize), dtype=dtype, count=count)
                reader = ArrayReader(values.reshape(shape, order="F"))
        except (ValueError, OSError, EOFError, zlib.error) as exc:
            raise FileProblem(label, f"truncated or corrupt ({first_line(exc)})") from None
    else:
        reader = StreamReader(stream, offset, tuple(shape), logical, buffer_pool(buffers), label)
    return Leaf((), tuple(shape), logical, reader)


def _decompressed(stream: IO[bytes], nbytes: int, scratch: Path, stack: ExitStack) -> Path:
    """The next `nbytes` of `stream` in a new file under `scratch` (removed with the file's stack), copied a MiB at a
    time. Raises EOFError where the stream ends before."""
    handle = tempfile.NamedTemporaryFile(dir=scratch, prefix="fortran-", suffix=".raw", delete=False)
    target = Path(handle.name)
    stack.callback(target.unlink, missing_ok=True)
    with handle:
        left = nbytes
        while left > 0:
            piece = stream.read(min(left, 1 << 20))
            if not piece:
                raise EOFError(f"{nbytes - left} bytes of data where {nbytes} were expected")
            handle.write(piece)
            left -= len(piece)
    return target
