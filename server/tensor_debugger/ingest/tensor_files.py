"""Open one tensor file (.pth/.pt/.bin, .safetensors, .npy) and list its leaves, each readable block by block: the
file's format (its extension) picks its module, torch_files.py, safetensors_files.py or npy_files.py.

Reading never loads a whole tensor: PyTorch zip files (pth_files.py), safetensors and .npy data are read with
positioned reads at their byte offsets, without torch (importing it takes about a second). A file stored
uncompressed in an archive is read the same way, at its `Span` of the archive (byte_ranges.py). Only what pth_files.py
leaves to torch (the legacy format, sparse or quantized tensors, unknown globals) is loaded with
`torch.load(weights_only=True, mmap=True)`, its pages dropped once copied.
"""

from __future__ import annotations

import zipfile
from contextlib import ExitStack
from pathlib import Path

from tensor_debugger.errors import FileProblem
from tensor_debugger.ingest.archives import Packed, Span
from tensor_debugger.ingest.block_readers import BufferPool, TensorFile
from tensor_debugger.ingest.npy_files import open_npy, packed_npy
from tensor_debugger.ingest.safetensors_files import open_safetensors, packed_safetensors
from tensor_debugger.ingest.torch_files import SUFFIXES as TORCH_SUFFIXES
from tensor_debugger.ingest.torch_files import open_torch_file

TENSOR_SUFFIXES = TORCH_SUFFIXES | {".safetensors", ".npy"}


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
        return open_torch_file(path, label, buffers, span)
    if suffix == ".safetensors":
        return open_safetensors(path, label, buffers, span)
    if suffix == ".npy":
        return open_npy(path, label, buffers, span)
    raise FileProblem(label, f"not a tensor file (unknown extension {suffix or 'none'!r})")


def _open_packed(
    path: Path, label: str, buffers: int | BufferPool, packed: Packed, suffix: str, scratch: Path | None
) -> TensorFile:
    """A compressed .npy or safetensors member of the zip at `path`, its tensors read through zipfile's stream."""
    stack = ExitStack()
    try:
        archive = stack.enter_context(zipfile.ZipFile(path))
        stream = stack.enter_context(archive.open(packed.name))
        if suffix == ".npy":
            leaves = [packed_npy(stream, label, buffers, scratch, stack)]
        elif suffix == ".safetensors":
            leaves, skipped = packed_safetensors(stream, label, buffers, packed.size)
            return TensorFile(leaves, skipped, stack)
        else:
            raise FileProblem(label, f"not a tensor file read from a compressed member ({suffix!r})")
    except BaseException:
        stack.close()
        raise
    return TensorFile(leaves, [], stack)
