"""Open one tensor file (.pth/.pt/.bin, .safetensors, .npy) and list its leaves, each readable block by block.

Reading never loads a whole tensor: PyTorch zip files (pth_files.py), safetensors and .npy data are read with
positioned reads at their byte offsets, without torch (importing it takes about a second). A file stored
uncompressed in an archive is read the same way, at its `Span` of the archive (byte_ranges.py). Only what pth_files.py
leaves to torch (the legacy format, sparse or quantized tensors, unknown globals) is loaded with
`torch.load(weights_only=True, mmap=True)`, its pages dropped once copied.
"""

from __future__ import annotations

import ast
import json
import math
import pickle
import re
import struct
import tempfile
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from tensor_debugger.engine.chunking import Region, region_flat_range
from tensor_debugger.errors import FileProblem, NotATensor
from tensor_debugger.ingest.archives import Packed, Span
from tensor_debugger.ingest.block_readers import (
    ArrayReader,
    BlockReader,
    BufferPool,
    FortranReader,
    Leaf,
    RawReader,
    StreamReader,
    TensorFile,
    open_fd,
)
from tensor_debugger.ingest.byte_ranges import open_range
from tensor_debugger.ingest.mapped_pages import PageReleaser
from tensor_debugger.ingest.pickle_budget import PickleTooLarge, check_pickles, check_reach
from tensor_debugger.ingest.pth_files import NeedsTorch, PthTensor, read_pth
from tensor_debugger.ingest.shapes import BadShape, check_shape
from tensor_debugger.store.dtypes import LogicalDtype, from_numpy, from_torch, parse_dtype, torch_to_storage

if TYPE_CHECKING:
    import torch

TORCH_SUFFIXES = frozenset({".pth", ".pt", ".bin"})
TENSOR_SUFFIXES = TORCH_SUFFIXES | {".safetensors", ".npy"}

SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
    "F4": "float4_e2m1fn_x2", "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
    "C64": "complex64",
}  # fmt: skip


def is_tensor_file(path: Path) -> bool:
    return path.suffix.lower() in TENSOR_SUFFIXES


def open_tensor_file(
    path: Path,
    label: str,
    buffers: int | BufferPool = 4,
    span: Span | None = None,
    packed: Packed | None = None,
    scratch: Path | None = None,
) -> TensorFile:
    """Open `path` (with `span`, the tensor file that is that byte range of it; with `packed`, the compressed
    member of the zip at `path`); `label` is how errors name the file to the user, and gives its extension.
    Raises FileProblem. `buffers`: how many read buffers that finished blocks give back are kept for later ones
    (the blocks a writer holds at once), or the pool to take them from, shared with the files read before
    (an ingest's: new buffers for every file cost a page fault per 4 KiB read into them, 1,600 for a 6 MB tensor)."""
    suffix = (Path(label).suffix if span is not None or packed is not None else path.suffix).lower()
    if packed is not None:
        return _open_packed(path, label, buffers, packed, suffix, scratch)
    if suffix in TORCH_SUFFIXES:
        try:
            return _open_pth(path, label, buffers, span)
        except NeedsTorch:  # legacy format, other globals (refused or not), compressed storages: torch decides
            return _open_torch(path, label, span)
    if suffix == ".safetensors":
        return _open_safetensors(path, label, buffers, span)
    if suffix == ".npy":
        return _open_npy(path, label, buffers, span)
    raise FileProblem(label, f"not a tensor file (unknown extension {suffix or 'none'!r})")


def _pool(buffers: int | BufferPool) -> BufferPool:
    return buffers if isinstance(buffers, BufferPool) else BufferPool(buffers)


# --- PyTorch ---------------------------------------------------------------------------------------------


def _open_pth(path: Path, label: str, buffers: int | BufferPool, span: Span | None) -> TensorFile:
    """A PyTorch zip file read without torch (pth_files.py); NeedsTorch where torch.load must read it."""
    base = span.offset if span is not None else 0
    try:
        obj = read_pth(path, span)
    except (PickleTooLarge, BadShape) as exc:
        raise FileProblem(label, f"refused: {_refusal(exc)}") from None
    except (
        zipfile.BadZipFile,
        pickle.UnpicklingError,
        EOFError,
        OSError,
        ValueError,
        struct.error,
        KeyError,
        IndexError,
        TypeError,
        AttributeError,
        MemoryError,
        OverflowError,
        UnicodeDecodeError,
        RecursionError,
    ) as exc:
        raise FileProblem(label, _unreadable_pth(path, span, exc)) from None
    stack = ExitStack()
    fd = open_fd(path, stack)
    pool = _pool(buffers)
    leaves: list[Leaf] = []
    skipped: list[FileProblem] = []
    for key_path, value in _flatten_plain(obj, ()):
        if isinstance(value, PthTensor):
            reader: BlockReader
            if value.contiguous:
                reader = RawReader(fd, base + value.data_offset, value.shape, value.dtype, pool)
            else:
                reader = ArrayReader(_strided_view(path, value, base))
            leaves.append(Leaf(key_path, value.shape, value.dtype, reader))
        elif isinstance(value, np.ndarray):
            leaves.append(Leaf(key_path, (), from_numpy(value.dtype), ArrayReader(value)))
        else:
            skipped.append(NotATensor(_where(label, key_path), f"not a tensor ({type(value).__name__}); skipped"))
    return TensorFile(leaves, skipped, stack)


def _strided_view(path: Path, tensor: PthTensor, base: int) -> np.ndarray:
    """A non-contiguous tensor (a view sharing its storage) as a read-only strided view of the mapped file (unmapped
    once the leaves are dropped, when the file is closed); `base`: where the .pth file starts in `path`."""
    storage = tensor.dtype.numpy_storage
    count = tensor.storage_bytes // storage.itemsize
    mapped = np.memmap(path, dtype=storage, mode="r", offset=base + tensor.data_offset, shape=(count,))
    return np.lib.stride_tricks.as_strided(
        mapped, tensor.shape, tuple(s * storage.itemsize for s in tensor.strides), writeable=False
    )


_PLAIN_SCALARS: dict[type, str] = {bool: "bool", int: "int64", float: "float64", complex: "complex128"}


def _flatten_plain(obj: Any, prefix: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every leaf of a dict/list/tuple nesting, as `_flatten` gives them, without torch: Python scalars become 0-d
    arrays (of torch's dtypes for them), None is dropped."""
    if isinstance(obj, PthTensor):
        yield prefix, obj
    elif isinstance(obj, bool | int | float | complex):
        try:  # Python floats are doubles: keep every bit
            yield prefix, np.asarray(obj, dtype=_PLAIN_SCALARS[type(obj)])
        except OverflowError:
            yield prefix, obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _flatten_plain(value, (*prefix, str(key)))
    elif isinstance(obj, list | tuple):
        for index, value in enumerate(obj):
            yield from _flatten_plain(value, (*prefix, str(index)))
    elif obj is not None:
        yield prefix, obj


class TorchReader:
    def __init__(self, tensor: torch.Tensor, releaser: PageReleaser | None) -> None:
        self._tensor = tensor
        self._releaser = releaser
        self._contiguous = tensor.is_contiguous()

    def read(self, region: Region) -> np.ndarray:
        return torch_to_storage(self._tensor[region] if region else self._tensor)

    def done(self, region: Region) -> None:
        if self._releaser is None:
            return
        t = self._tensor
        base = t.untyped_storage().data_ptr()
        if self._contiguous:
            start, stop = region_flat_range(tuple(t.shape), region)
            offset = (t.storage_offset() + start) * t.element_size()
            self._releaser.release(base + int(offset), (stop - start) * t.element_size())
        elif region_flat_range(tuple(t.shape), region)[1] >= t.numel():
            self._releaser.release(base, t.untyped_storage().nbytes())


def _open_torch(path: Path, label: str, span: Span | None) -> TensorFile:
    import torch

    mmapped = span is None
    try:
        _check_torch_pickles(path, span)
    except PickleTooLarge as exc:
        raise FileProblem(label, f"refused: {exc}") from None
    try:
        # torch warns of pickle protocols it did not write: the file's problem, if any, is said below
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            if span is not None:  # a file in an archive: loaded whole from its byte range (torch maps only files)
                with open_range(path, span) as source:
                    obj = torch.load(source, map_location="cpu", weights_only=True)
            else:
                obj = _load_mapped(path)
    except pickle.UnpicklingError as exc:  # code it would have run, or bytes it could not unpickle
        raise FileProblem(label, _code_refusal(str(exc)) or _unreadable_pth(path, span, exc)) from None
    except RuntimeError as exc:
        if "can't allocate memory" in str(exc):  # torch's allocator, past the process's memory limit
            raise MemoryError(_first_line(exc)) from None
        raise FileProblem(label, _unreadable_pth(path, span, exc)) from None
    except (
        EOFError,
        OSError,
        ValueError,
        struct.error,
        AttributeError,
        KeyError,
        IndexError,
        TypeError,
        MemoryError,
        OverflowError,
        UnicodeDecodeError,
    ) as exc:
        # random bytes can trip the unpickler anywhere (an IndexError on an empty stack, say): all mean the same
        raise FileProblem(label, _unreadable_pth(path, span, exc)) from None
    try:
        check_reach(obj)  # unpickled with its shared references shared: walking them as a tree could take forever
    except PickleTooLarge as exc:
        raise FileProblem(label, f"refused: {exc}") from None
    releaser = PageReleaser(path) if mmapped else None  # a no-op for the legacy format, which is not mapped
    leaves: list[Leaf] = []
    skipped: list[FileProblem] = []
    for key_path, value in _flatten(obj, ()):
        where = _where(label, key_path)
        if not isinstance(value, torch.Tensor):
            skipped.append(NotATensor(where, f"not a tensor ({type(value).__name__}); skipped"))
            continue
        try:
            check_shape(tuple(value.shape))  # torch allows more dimensions than a stored array may have
        except BadShape as exc:
            raise FileProblem(label, f"refused: {_refusal(exc)}") from None
        problem = _unsupported_tensor(value)
        if problem:
            skipped.append(FileProblem(where, problem))
            continue
        leaves.append(Leaf(key_path, tuple(value.shape), from_torch(value.dtype), TorchReader(value, releaser)))
    return TensorFile(leaves, skipped)


_LEGACY_PICKLES = 5  # the legacy format: magic number, protocol version, system info, the object, its storages' keys


def _check_torch_pickles(path: Path, span: Span | None) -> None:
    """Raise PickleTooLarge for a file whose pickles (every data.pkl of a zip, the first pickles of anything else)
    expand past the budget, before torch.load unpickles them: its unpickler hashes a tuple used as a dict key, which
    takes as long as the tuple's tree is large. Bytes that are neither are left to torch.load to refuse."""
    with open_range(path, span) as source:
        if zipfile.is_zipfile(source):
            try:
                with zipfile.ZipFile(source) as archive:
                    for info in archive.infolist():
                        if info.filename.endswith("data.pkl"):
                            with archive.open(info) as raw:
                                check_pickles(raw)
            except (zipfile.BadZipFile, OSError, EOFError, zlib.error, NotImplementedError, RuntimeError):
                return
        else:
            source.seek(0)
            check_pickles(source, _LEGACY_PICKLES)


def _load_mapped(path: Path) -> Any:
    """torch.load of `path`, mapped (the legacy pre-1.6 format cannot be: it loads whole)."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as exc:
        if "zipfile" not in str(exc) and "mmap" not in str(exc):
            raise
        return torch.load(path, map_location="cpu", weights_only=True)


def _flatten(obj: Any, prefix: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every leaf of a dict/list/tuple nesting; Python scalars become 0-d tensors, None is dropped."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, bool | int | float | complex):
        try:  # Python floats are doubles: keep every bit
            yield prefix, torch.tensor(obj, dtype=_scalar_dtypes().get(type(obj)))
        except (OverflowError, RuntimeError):
            yield prefix, obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _flatten(value, (*prefix, str(key)))
    elif isinstance(obj, list | tuple):
        for index, value in enumerate(obj):
            yield from _flatten(value, (*prefix, str(index)))
    elif obj is not None:
        yield prefix, obj


def _scalar_dtypes() -> dict[type, torch.dtype]:
    import torch

    return {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


def _unsupported_tensor(t: torch.Tensor) -> str | None:
    import torch

    if t.layout != torch.strided:
        return f"{t.layout} tensors are not supported; skipped"
    if t.device.type == "meta":
        return "a meta tensor holds no values; skipped"
    try:
        from_torch(t.dtype)
    except ValueError as exc:
        return f"{exc}; skipped"
    return None


def _refusal(exc: PickleTooLarge | BadShape) -> str:
    return f"it holds {exc}" if isinstance(exc, BadShape) else str(exc)


def _code_refusal(message: str) -> str | None:
    """Words for a weights-only unpickler refusal of code the pickle would have run; None for any other refusal."""
    found = re.search(r"(?:Unsupported global: |unsupported )GLOBAL ([\w.]+)", message)
    if found is None:
        return None
    return (
        f"refused: the pickle asks to run code ({found.group(1)}), which weights_only=True does not allow; "
        "nothing in it was executed"
    )


def _unreadable_pth(path: Path, span: Span | None, exc: BaseException) -> str:
    """Why a .pth file could not be read, in words a user can act on, from its first bytes; then the reader's own
    error, for the record."""
    size = span.size if span is not None else path.stat().st_size
    head = _head(path, span)
    if size == 0:
        why = "empty (0 bytes)"
    elif head.startswith(b"PK") and _zip_directory_reads(path, span):  # what it holds is wrong, not its directory
        why = "a zip archive (torch.save's format) whose contents are damaged or inconsistent"
    elif head.startswith(b"PK"):  # a zip archive, torch.save's format since PyTorch 1.6
        why = f"truncated or damaged: a zip archive of {size} bytes whose directory cannot be read (copied whole?)"
    elif head[:1] == b"\x80":  # a pickle: the legacy format, or one torch.save did not write
        why = "a pickle torch.save did not write, or a damaged legacy-format file"
    else:
        why = f"neither a zip archive (torch.save's format) nor a pickle: it starts with {head!r}"
    if isinstance(exc, pickle.UnpicklingError):  # torch's own words advise weights_only=False: never repeated
        detail = re.search(r"(Unsupported operand \d+|Unsupported [^\n.]+)", str(exc))
        refusal = detail.group(1) if detail else "refused"
        return f"not a readable PyTorch file: {why} (the weights-only unpickler: {refusal}); nothing in it was executed"
    return f"not a readable PyTorch file: {why} ({type(exc).__name__}: {_first_line(exc)})"


def _zip_directory_reads(path: Path, span: Span | None) -> bool:
    """Whether the zip archive at `path` (or its `span`) has a directory that lists its members."""
    try:
        with open_range(path, span) as handle, zipfile.ZipFile(handle) as archive:
            return bool(archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return False


def _head(path: Path, span: Span | None) -> bytes:
    """The first 4 bytes of the file, or of its span of an archive (fewer where it is shorter)."""
    with open(path, "rb") as f:
        f.seek(span.offset if span is not None else 0)
        return f.read(min(span.size, 4) if span is not None else 4)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _where(label: str, key_path: tuple[str, ...]) -> str:
    return f"{label}[{']['.join(key_path)}]" if key_path else label


# --- safetensors and .npy: raw byte ranges -------------------------------------------------------------


def _open_safetensors(path: Path, label: str, buffers: int | BufferPool, span: Span | None) -> TensorFile:
    if span is None:
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="np") as handle:  # validates header, offsets and file size
                keys = list(handle.keys())
        except Exception as exc:  # safetensors raises its own SafetensorError and others
            raise FileProblem(label, f"not a readable safetensors file ({_first_line(exc)})") from None
        header, data_start = _safetensors_header(path, label)
    else:  # safetensors reads only whole files: the same checks on the byte range
        try:
            with open_range(path, span) as source:
                header, data_start = _checked_safetensors_header(source, span.size)
        except (ValueError, OSError, struct.error, TypeError, KeyError) as exc:
            raise FileProblem(label, f"not a readable safetensors file ({_first_line(exc)})") from None
        keys = sorted(header)  # in safe_open's order
    base = span.offset if span is not None else 0
    stack = ExitStack()
    fd = open_fd(path, stack)
    pool = _pool(buffers)  # one for the file: its tensors are copied one after another
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
            skipped.append(FileProblem(_where(label, (key,)), f"unsupported dtype {entry.get('dtype')!r}; skipped"))
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
    return shape, fortran, np.lib.format.descr_to_dtype(header["descr"])


def _open_packed(
    path: Path, label: str, buffers: int | BufferPool, packed: Packed, suffix: str, scratch: Path | None
) -> TensorFile:
    """A compressed .npy or safetensors member of the zip at `path`, its tensors read through zipfile's stream."""
    stack = ExitStack()
    try:
        archive = stack.enter_context(zipfile.ZipFile(path))
        stream = stack.enter_context(archive.open(packed.name))
        if suffix == ".npy":
            leaves = [_packed_npy(stream, label, buffers, scratch, stack)]
        elif suffix == ".safetensors":
            leaves, skipped = _packed_safetensors(stream, label, buffers, packed.size)
            return TensorFile(leaves, skipped, stack)
        else:
            raise FileProblem(label, f"not a tensor file read from a compressed member ({suffix!r})")
    except BaseException:
        stack.close()
        raise
    return TensorFile(leaves, [], stack)


def _packed_npy(
    stream: IO[bytes], label: str, buffers: int | BufferPool, scratch: Path | None, stack: ExitStack
) -> Leaf:
    try:
        shape, fortran, dtype = read_npy_header(stream)
        offset = stream.tell()
    except (ValueError, OSError, SyntaxError, TypeError, RecursionError, EOFError, zlib.error) as exc:
        raise FileProblem(label, f"not a readable .npy file ({_first_line(exc)})") from None
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
            raise FileProblem(label, f"truncated or corrupt ({_first_line(exc)})") from None
    else:
        reader = StreamReader(stream, offset, tuple(shape), logical, _pool(buffers), label)
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


def _packed_safetensors(
    stream: IO[bytes], label: str, buffers: int | BufferPool, size: int
) -> tuple[list[Leaf], list[FileProblem]]:
    try:
        header, data_start = _checked_safetensors_header(stream, size)
    except (ValueError, OSError, struct.error, TypeError, KeyError, EOFError, zlib.error) as exc:
        raise FileProblem(label, f"not a readable safetensors file ({_first_line(exc)})") from None
    pool = _pool(buffers)

    # safe_open's order (by name), as from a file: their data is in that order when they share a dtype (safetensors
    # writes by dtype size, then name); a tensor behind the stream costs decompressing from the start again
    def reader(shape: tuple[int, ...], dtype: LogicalDtype, begin: int) -> BlockReader:
        return StreamReader(stream, data_start + begin, shape, dtype, pool, label)

    return _safetensors_leaves(header, sorted(header), label, reader)


def _npy_dtype(dtype: np.dtype[Any], label: str) -> LogicalDtype:
    if dtype.hasobject:
        raise FileProblem(label, "holds Python objects (a pickle); refused, never unpickled")
    try:
        return from_numpy(dtype)
    except ValueError as exc:
        raise FileProblem(label, str(exc)) from None


def _open_npy(path: Path, label: str, buffers: int | BufferPool, span: Span | None) -> TensorFile:
    try:
        with open_range(path, span) as f:
            shape, fortran, dtype = read_npy_header(f)
            offset = f.tell()
    except (ValueError, OSError, SyntaxError, TypeError, RecursionError) as exc:
        raise FileProblem(label, f"not a readable .npy file ({_first_line(exc)})") from None
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
        reader = RawReader(open_fd(path, stack), base + offset, tuple(shape), logical, _pool(buffers))
    return TensorFile([Leaf((), tuple(shape), logical, reader)], [], stack)
