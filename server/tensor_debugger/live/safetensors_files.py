"""A captured tensor as a safetensors file of a trace folder, in the dtype codes ingest reads."""

from __future__ import annotations

import functools
import json
import struct
from pathlib import Path

import torch

from tensor_debugger.ingest.safetensors_files import SAFETENSORS_DTYPES
from tensor_debugger.ingest.writer import WritePools
from tensor_debugger.live.writer import Job, Sink
from tensor_debugger.store.dtypes import torch_to_storage

WRITE_CHUNK_BYTES = 16 * 1024 * 1024  # written to a file this much at a time


@functools.cache
def safetensors_codes() -> dict[torch.dtype, str]:
    """torch dtype -> safetensors' code: the table ingest reads with (`safetensors_files.SAFETENSORS_DTYPES`), turned
    round, so that whatever capture writes, ingest reads."""
    return {
        getattr(torch, name): code for code, name in SAFETENSORS_DTYPES.items() if hasattr(torch, name) and code != "F4"
    }  # F4 counts 4-bit values; torch's float4 tensor, byte pairs


def write_safetensors(path: Path, tensor: torch.Tensor, chunk_bytes: int = WRITE_CHUNK_BYTES) -> None:
    """`tensor` as a safetensors file holding the one key "data", copied to the host a chunk at a time."""
    code = safetensors_codes().get(tensor.dtype)
    if code is None:
        raise TypeError(f"dtype {tensor.dtype} cannot be captured")
    flat = tensor.detach().reshape(-1)
    nbytes = flat.numel() * flat.element_size()
    header = json.dumps({"data": {"dtype": code, "shape": list(tensor.shape), "data_offsets": [0, nbytes]}})
    encoded = header.encode() + b" " * (-len(header) % 8)
    step = max(1, chunk_bytes // max(1, flat.element_size()))
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded)
        for start in range(0, flat.numel(), step):
            f.write(torch_to_storage(flat[start : start + step]).data)  # to the host, raw bits


class FileSink(Sink):
    """Writes each tensor as the safetensors file the recorder named, in the trace folder (to be uploaded)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def write(self, job: Job, pools: WritePools) -> None:
        write_safetensors(self.folder / job.name, job.host)
