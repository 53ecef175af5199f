"""A safetensors file opened as a tensor file: its header checked as safetensors checks it, each tensor read at its
byte range of the file (or, in a compressed archive member, from zipfile's stream).
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

from tensor_debugger.errors import FileProblem
from tensor_debugger.ingest.archives import Span
from tensor_debugger.ingest.block_readers import (
    BlockReader,
    BufferPool,
    Leaf,
    RawReader,
    StreamReader,
    TensorFile,
    buffer_pool,
    open_fd,
)
from tensor_debugger.ingest.byte_ranges import open_range
from tensor_debugger.ingest.file_words import first_line, where
from tensor_debugger.ingest.shapes import BadShape, check_shape
from tensor_debugger.store.dtypes import LogicalDtype, parse_dtype

SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
    "F4": "float4_e2m1fn_x2", "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
    "C64": "complex64",
}  # fmt: skip


def open_safetensors(path: Path, label: str, buffers: int | BufferPool, span: Span | None) -> TensorFile:
    """Open the safetensors file at `path` (or its `span`); raises FileProblem."""
    if span is None:
        from safetensors import safe_open

        opener: Callable[..., Any] = safe_open  # typed in later safetensors releases, not in 0.7
        try:
            with opener(str(path), framework="np") as handle:  # validates header, offsets and file size
                keys = list(handle.keys())
        except Exception as exc:  # safetensors raises its own SafetensorError and others
            raise FileProblem(label, f"not a readable safetensors file ({first_line(exc)})") from None
        header, data_start = _safetensors_header(path, label)
    else:  # safetensors reads only whole files: the same checks on the byte range
        try:
            with open_range(path, span) as source:
                header, data_start = _checked_safetensors_header(source, span.size)
        except (ValueError, OSError, struct.error, TypeError, KeyError) as exc:
            raise FileProblem(label, f"not a readable safetensors file ({first_line(exc)})") from None
        keys = sorted(header)  # in safe_open's order
    base = span.offset if span is not None else 0
    stack = ExitStack()
    fd = open_fd(path, stack)
    pool = buffer_pool(buffers)  # one for the file: its tensors are copied one after another
    leaves, skipped = _safetensors_leaves(
        header, keys, label, lambda shape, dtype, begin: RawReader(fd, base + data_start + begin, shape, dtype, pool)
    )
    return TensorFile(leaves, skipped, stack)


def _safetensors_leaves(
    header: dict[str, Any],
    keys: list[str],
    label: str,
    reader: Callable[[tuple[int, ...], LogicalDtype, int], BlockReader],
) -> tuple[list[Leaf], list[FileProblem]]:
    """The leaves of a safetensors file in the order of `keys`, each read by `reader(shape, dtype, data offset)`."""
    leaves: list[Leaf] = []
    skipped: list[FileProblem] = []
    for key in keys:
        entry = header[key]
        name = SAFETENSORS_DTYPES.get(str(entry.get("dtype")))
        if name is None:
            skipped.append(FileProblem(where(label, (key,)), f"unsupported dtype {entry.get('dtype')!r}; skipped"))
            continue
        dtype = parse_dtype(name)
        try:
            shape = check_shape(entry["shape"])
        except BadShape as exc:
            raise FileProblem(label, f"refused: tensor {key!r} is {exc}") from None
        begin, end = (int(x) for x in entry["data_offsets"])
        if end - begin != math.prod(shape) * dtype.itemsize:
            raise FileProblem(label, f"tensor {key!r}: data size does not match its shape and dtype")
        leaves.append(Leaf((key,), shape, dtype, reader(shape, dtype, begin)))
    return leaves, skipped


def _safetensors_header(path: Path, label: str) -> tuple[dict[str, Any], int]:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    if not isinstance(header, dict):
        raise FileProblem(label, "safetensors header is not an object")
    return header, 8 + length


_SAFETENSORS_HEADER_LIMIT = 100 * 1024 * 1024  # safetensors' own limit


def _checked_safetensors_header(f: IO[bytes], size: int) -> tuple[dict[str, Any], int]:
    """The header of the safetensors file `f` of `size` bytes, checked as safetensors checks it: a JSON object of
    entries with a dtype, a shape and data offsets that tile the data after the header exactly. Raises
    ValueError."""
    (length,) = struct.unpack("<Q", f.read(8))
    if length > min(size - 8, _SAFETENSORS_HEADER_LIMIT):
        raise ValueError(f"header length {length} is past the file's {size} bytes or too large")
    header = json.loads(f.read(length))
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    header.pop("__metadata__", None)
    ranges = []
    for key, entry in header.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("shape"), list):
            raise ValueError(f"tensor {key!r} has no shape")
        offsets = entry.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(x, int) for x in offsets)):
            raise ValueError(f"tensor {key!r} has no data offsets")
        if not all(isinstance(d, int) and d >= 0 for d in entry["shape"]):
            raise ValueError(f"tensor {key!r} has shape {entry['shape']!r}")
        ranges.append((offsets[0], offsets[1], key))
    position = 0
    for begin, end, key in sorted(ranges):
        if begin != position or end < begin:
            raise ValueError(f"tensor {key!r}: its data offsets [{begin}, {end}] do not follow the tensor before")
        position = end
    if 8 + length + position != size:
        raise ValueError(f"the data ends at {8 + length + position} bytes, the file at {size}")
    return header, 8 + length


def packed_safetensors(
    stream: IO[bytes], label: str, buffers: int | BufferPool, size: int
) -> tuple[list[Leaf], list[FileProblem]]:
    """The tensors of a compressed safetensors member of `size` bytes, read from zipfile's `stream`."""
    try:
        header, data_start = _checked_safetensors_header(stream, size)
    except (ValueError, OSError, struct.error, TypeError, KeyError, EOFError, zlib.error) as exc:
        raise FileProblem(label, f"not a readable safetensors file ({first_line(exc)})") from None
    pool = buffer_pool(buffers)

    # safe_open's order (by name), as from a file: their data is in that order when they share a dtype (safetensors
    # writes by dtype size, then name); a tensor behind the stream costs decompressing from the start again
    def reader(shape: tuple[int, ...], dtype: LogicalDtype, begin: int) -> BlockReader:
        return StreamReader(stream, data_start + begin, shape, dtype, pool, label)

    return _safetensors_leaves(header, sorted(header), label, reader)
