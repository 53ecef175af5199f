"""PyTorch's zip format read without torch: a pickle of storages plus raw data files, read by offset.

`torch.save` writes a zip archive holding `<name>/data.pkl` (a pickle whose tensors are calls to
`torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)` or `_v3(..., dtype)`, with each storage a
persistent id `("storage", <storage class>, key, location, numel)`) and `<name>/data/<key>` (each storage's bytes,
stored uncompressed). Importing torch to read that takes about a second; this module unpickles `data.pkl` with an
unpickler that knows only the tensor-rebuilding globals that `torch.load(weights_only=True)` accepts, and hands
back each tensor as its storage file's byte offset, shape, strides and dtype.

Anything it does not know (another global, a compressed or big-endian storage, the legacy pre-1.6 format) raises
`NeedsTorch`: the caller then loads the file with `torch.load(weights_only=True)`, which reads what torch supports
and refuses what would run code, with the same words as before. Nothing in a pickle is ever called but the
functions below.
"""

from __future__ import annotations

import math
import pickle
import reprlib
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tensor_debugger.ingest.archives import Span
from tensor_debugger.ingest.byte_ranges import open_range
from tensor_debugger.ingest.pickle_budget import check_pickles, check_reach
from tensor_debugger.ingest.shapes import check_shape
from tensor_debugger.store.dtypes import LogicalDtype, parse_dtype

# torch's typed storage classes, by the dtype their bytes hold (torch/storage.py)
_STORAGE_DTYPES = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
}
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # a zip member's local file header (30 bytes)


class NeedsTorch(Exception):  # noqa: N818 (a signal: read this file with torch.load instead)
    """The file holds something this reader leaves to torch.load."""


@dataclass(frozen=True)
class StorageRef:
    """One storage of the file: where its bytes are, and how many elements of `dtype` (None: an untyped storage,
    whose tensor names its dtype) it holds."""

    key: str
    dtype: str | None
    numel: int


@dataclass(frozen=True)
class PthTensor:
    """A tensor of the file: a strided view of one storage's bytes at `data_offset` in the file."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    dtype: LogicalDtype
    data_offset: int  # bytes from the file's start to the tensor's first element
    storage_bytes: int  # bytes of the storage from that element on

    @property
    def contiguous(self) -> bool:
        """Whether the elements are in C order with no gaps (a plain byte range of the file)."""
        expected, stride = [], 1
        for size in reversed(self.shape):
            expected.append(stride)
            stride *= size
        return all(s == e for s, e, n in zip(self.strides, reversed(expected), self.shape, strict=True) if n > 1)


@dataclass(frozen=True)
class _StorageType:
    dtype: str | None


def _rebuild_v2(storage: StorageRef, offset: int, size: Any, stride: Any, *_: Any) -> _Rebuilt:
    return _Rebuilt(storage, int(offset), tuple(int(s) for s in size), tuple(int(s) for s in stride), None)


def _rebuild_v3(
    storage: StorageRef, offset: int, size: Any, stride: Any, _grad: Any, _hooks: Any, dtype: Any, *_: Any
) -> _Rebuilt:
    if not isinstance(dtype, _TorchDtype):
        raise NeedsTorch(f"tensor dtype {_short(dtype)}")
    return _Rebuilt(storage, int(offset), tuple(int(s) for s in size), tuple(int(s) for s in stride), dtype.name)


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    return data


def _short(obj: Any) -> str:
    """A few characters of `obj`, however large the nesting it heads (a whole repr could take forever)."""
    return reprlib.repr(obj)[:80]


@dataclass(frozen=True)
class _Rebuilt:
    storage: StorageRef
    offset: int  # elements
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str | None  # from _rebuild_tensor_v3; else the storage's


@dataclass(frozen=True)
class _TorchDtype:
    name: str


def _globals() -> dict[tuple[str, str], Any]:
    """The globals a tensor pickle may name, each mapped to a harmless stand-in (never torch's own)."""
    found: dict[tuple[str, str], Any] = {
        ("collections", "OrderedDict"): OrderedDict,
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_v2,
        ("torch._utils", "_rebuild_tensor_v3"): _rebuild_v3,
        ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
        ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
        ("torch", "Size"): tuple,
        ("torch.storage", "UntypedStorage"): _StorageType(None),
    }
    found.update({("torch", name): _StorageType(dtype) for name, dtype in _STORAGE_DTYPES.items()})
    found.update({("torch", d): _TorchDtype(d) for d in _torch_dtype_names()})
    return found


def _torch_dtype_names() -> list[str]:
    from tensor_debugger.store.dtypes import all_dtypes

    return [d.name for d in all_dtypes()]


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: IO[bytes], allowed: dict[tuple[str, str], Any]) -> None:
        super().__init__(file)
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        found = self._allowed.get((module, name))
        if found is None:
            raise NeedsTorch(f"global {module}.{name}")
        return found

    def persistent_load(self, pid: Any) -> StorageRef:
        if not (
            isinstance(pid, tuple)
            and len(pid) == 5
            and pid[0] == "storage"
            and isinstance(pid[1], _StorageType)
            and isinstance(pid[2], str)
        ):
            raise NeedsTorch(f"persistent id {_short(pid)}")
        return StorageRef(pid[2], pid[1].dtype, int(pid[4]))


def _data_offset(handle: IO[bytes], info: zipfile.ZipInfo) -> int:
    """Where a stored (uncompressed) member's bytes begin in the file."""
    handle.seek(info.header_offset)
    header = handle.read(_LOCAL_HEADER.size)
    fields = _LOCAL_HEADER.unpack(header)
    if fields[0] != b"PK\x03\x04":
        raise NeedsTorch(f"member {info.filename} has no local header")
    return int(info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10])


def read_pth(path: Path, span: Span | None = None) -> Any:
    """The object `torch.save` wrote to `path` (with `span`, to that byte range of it: a `.pth` stored in an
        archive), with every tensor a `PthTensor` whose `data_offset` counts from the start of the range. Raises
        NeedsTorch for what only torch reads (files that are no zip archive among them: the legacy format, or no
        PyTorch file, which torch.load then names), and PickleTooLarge (a ValueError) for a pickle whose tree is past
    the budget of pickle_budget.py."""
    with open_range(path, span) as source:
        if not zipfile.is_zipfile(source):
            raise NeedsTorch("not a zip archive")
        return _read_zip(source)


def _read_zip(source: IO[bytes]) -> Any:
    with zipfile.ZipFile(source) as archive:
        infos = {info.filename: info for info in archive.infolist()}
        pickles = [name for name in infos if name.endswith("/data.pkl") and name.count("/") == 1]
        if len(pickles) != 1:
            raise NeedsTorch("no single <name>/data.pkl")
        root = pickles[0][: -len("data.pkl")]
        order = infos.get(root + "byteorder")
        if order is not None and archive.read(order).strip() != b"little":
            raise NeedsTorch("big-endian storages")
        with archive.open(pickles[0]) as raw:  # a pickle bomb is refused (PickleTooLarge) before it is unpickled
            check_pickles(raw)
        with archive.open(pickles[0]) as raw:
            obj = _Unpickler(raw, _globals()).load()
    check_reach(obj)  # what `_resolve` and the flatteners walk as a tree, measured again
    offsets: dict[str, int] = {}
    size = source.seek(0, 2)  # the storages must lie inside the file (or the byte range read as one)

    def locate(storage: StorageRef) -> int:
        if storage.key not in offsets:
            info = infos.get(f"{root}data/{storage.key}")
            if info is None:
                raise ValueError(f"storage {storage.key} is missing from the archive")
            if info.compress_type != zipfile.ZIP_STORED:
                raise NeedsTorch(f"storage {storage.key} is compressed")
            offsets[storage.key] = _data_offset(source, info)
            if offsets[storage.key] + info.file_size > size:
                raise ValueError(f"storage {storage.key} reaches past the end of the file")
        return offsets[storage.key]

    return _resolve(obj, locate, {k: v.file_size for k, v in infos.items()}, root)


def _resolve(obj: Any, locate: Callable[[StorageRef], int], sizes: dict[str, int], root: str) -> Any:
    """`obj` with every rebuilt tensor replaced by its PthTensor."""
    if isinstance(obj, _Rebuilt):
        return _tensor(obj, locate(obj.storage), sizes[f"{root}data/{obj.storage.key}"])
    if isinstance(obj, dict):
        return type(obj)((k, _resolve(v, locate, sizes, root)) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return type(obj)(_resolve(v, locate, sizes, root) for v in obj)
    if isinstance(obj, StorageRef | _StorageType | _TorchDtype):
        raise NeedsTorch(f"a bare {type(obj).__name__}")
    return obj


def _tensor(rebuilt: _Rebuilt, start: int, file_size: int) -> PthTensor:
    name = rebuilt.dtype or rebuilt.storage.dtype
    if name is None:
        raise NeedsTorch("an untyped storage without a dtype")
    dtype = parse_dtype(name)
    check_shape(rebuilt.shape)  # BadShape: a negative size would make the tensor end before it begins
    if any(s < 0 for s in rebuilt.strides) or len(rebuilt.strides) != len(rebuilt.shape) or rebuilt.offset < 0:
        raise ValueError(f"tensor of shape {rebuilt.shape} has strides {rebuilt.strides} and offset {rebuilt.offset}")
    last = rebuilt.offset + sum((n - 1) * s for n, s in zip(rebuilt.shape, rebuilt.strides, strict=True))
    if math.prod(rebuilt.shape) and (last + 1) * dtype.itemsize > file_size:
        raise ValueError(f"tensor of shape {rebuilt.shape} reaches past its storage's {file_size} bytes")
    offset_bytes = rebuilt.offset * dtype.itemsize
    return PthTensor(rebuilt.shape, rebuilt.strides, dtype, start + offset_bytes, file_size - offset_bytes)
