"""A PyTorch file (.pth/.pt/.bin) opened as a tensor file: read without torch where pth_files.py can (each
tensor at its byte offset), and otherwise (the legacy format, sparse or quantized tensors, unknown globals) loaded with
`torch.load(weights_only=True, mmap=True)` after its pickles are checked (pickle_budget.py), its pages dropped once
copied.
"""

from __future__ import annotations

import pickle
import re
import struct
import warnings
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.chunking import Region, region_flat_range
from tensor_debugger.errors import FileProblem, NotATensor
from tensor_debugger.ingest.archives import Span
from tensor_debugger.ingest.block_readers import (
    ArrayReader,
    BlockReader,
    BufferPool,
    Leaf,
    RawReader,
    TensorFile,
    buffer_pool,
    open_fd,
)
from tensor_debugger.ingest.byte_ranges import open_range
from tensor_debugger.ingest.file_words import first_line, where
from tensor_debugger.ingest.mapped_pages import PageReleaser
from tensor_debugger.ingest.pickle_budget import PickleTooLarge, check_pickles, check_reach
from tensor_debugger.ingest.pth_files import NeedsTorch, PthTensor, read_pth
from tensor_debugger.ingest.shapes import BadShape, check_shape
from tensor_debugger.store.dtypes import from_numpy, from_torch, torch_to_storage

if TYPE_CHECKING:
    import torch

SUFFIXES = frozenset({".pth", ".pt", ".bin"})


def open_torch_file(path: Path, label: str, buffers: int | BufferPool, span: Span | None) -> TensorFile:
    """Open the PyTorch file at `path` (or its `span`); raises FileProblem."""
    try:
        return _open_pth(path, label, buffers, span)
    except NeedsTorch:  # legacy format, other globals (refused or not), compressed storages: torch decides
        return _open_torch(path, label, span)


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
    pool = buffer_pool(buffers)
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
            skipped.append(NotATensor(where(label, key_path), f"not a tensor ({type(value).__name__}); skipped"))
    return TensorFile(leaves, skipped, stack)


def _strided_view(path: Path, tensor: PthTensor, base: int) -> NDArray[Any]:
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

    def read(self, region: Region) -> NDArray[Any]:
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
            raise MemoryError(first_line(exc)) from None
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
        named = where(label, key_path)
        if not isinstance(value, torch.Tensor):
            skipped.append(NotATensor(named, f"not a tensor ({type(value).__name__}); skipped"))
            continue
        try:
            check_shape(tuple(value.shape))  # torch allows more dimensions than a stored array may have
        except BadShape as exc:
            raise FileProblem(label, f"refused: {_refusal(exc)}") from None
        problem = _unsupported_tensor(value)
        if problem:
            skipped.append(FileProblem(named, problem))
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
    """Why a .pth file could not be read, in words a user can act on, from its first bytes; then, where those do
    not say it all, the reader's own error, for the record (for an empty or truncated file, one reason: the
    reader's words there, "[Errno 22] Invalid argument" or a miniz error, add nothing a user could act on)."""
    size = span.size if span is not None else path.stat().st_size
    head = _head(path, span)
    if size == 0:
        return "not a readable PyTorch file: empty (0 bytes)"
    if head.startswith(b"PK") and _zip_directory_reads(path, span):  # what it holds is wrong, not its directory
        why = "a zip archive (torch.save's format) whose contents are damaged or inconsistent"
    elif head.startswith(b"PK") and not isinstance(exc, pickle.UnpicklingError):  # torch.save's format since 1.6
        return (
            f"not a readable PyTorch file: truncated or damaged: a zip archive of {size} bytes whose directory "
            "cannot be read (was it copied whole?)"
        )
    elif head.startswith(b"PK"):
        why = f"a zip archive of {size} bytes"
    elif head[:1] == b"\x80":  # a pickle: the legacy format, or one torch.save did not write
        why = "a pickle torch.save did not write, or a damaged legacy-format file"
    else:
        why = f"neither a zip archive (torch.save's format) nor a pickle: it starts with {head!r}"
    if isinstance(exc, pickle.UnpicklingError):  # torch's own words advise weights_only=False: never repeated
        detail = re.search(r"(Unsupported operand \d+|Unsupported [^\n.]+)", str(exc))
        refusal = detail.group(1) if detail else "refused"
        return f"not a readable PyTorch file: {why} (the weights-only unpickler: {refusal}); nothing in it was executed"
    return f"not a readable PyTorch file: {why} ({type(exc).__name__}: {first_line(exc)})"


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
