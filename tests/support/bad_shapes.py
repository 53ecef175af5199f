"""Tensor files that declare a shape no tensor can have (a negative size, 65 dimensions), in every format the ingest
reads, each written as its library writes it and then given the bad shape."""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

import numpy as np

NEGATIVE = "negative"
TOO_MANY = "65 dimensions"


def _pth(bad: str, legacy: bool) -> bytes:
    import torch

    buffer = io.BytesIO()
    if bad == TOO_MANY:  # torch has no limit of 64: it saves this as it is
        torch.save({"w": torch.zeros([1] * 65)}, buffer, _use_new_zipfile_serialization=not legacy)
        return buffer.getvalue()
    torch.save({"w": torch.zeros(10)}, buffer, _use_new_zipfile_serialization=not legacy)
    size = b"K\n\x85"  # the size (10,): BININT1 10, TUPLE1 (the stride is (1,); the storage's count ends a tuple)
    negative = b"J" + struct.pack("<i", -10) + b"\x85"
    if legacy:
        saved = buffer.getvalue()
        assert saved.count(size) == 1
        return saved.replace(size, negative)
    buffer.seek(0)
    out = io.BytesIO()
    with zipfile.ZipFile(buffer) as saved_zip, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as patched:
        for info in saved_zip.infolist():
            data = saved_zip.read(info)
            if info.filename.endswith("/data.pkl"):
                assert data.count(size) == 1
                data = data.replace(size, negative)
            patched.writestr(info, data)
    return out.getvalue()


def _npy(bad: str) -> bytes:
    shape = "(-10,)" if bad == NEGATIVE else "(" + "1, " * 65 + ")"
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}".encode("latin1")
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"  # numpy pads the header to 64 bytes
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + np.zeros(10, np.float32).tobytes()


def _safetensors(bad: str) -> bytes:
    shape = [-10] if bad == NEGATIVE else [1] * 65
    count = 10 if bad == NEGATIVE else 1
    header = json.dumps({"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 4 * count]}}).encode()
    return struct.pack("<Q", len(header)) + header + bytes(4 * count)


def bad_shape_files(folder: Path, bad: str) -> list[Path]:
    """One file of each format with the `bad` shape: .pth (zip and legacy), .npy and .safetensors, each also as the
    deflated member of a zip (streamed) and as the stored member of a zip (read in place). Returns their paths."""
    made = {
        "zip.pth": _pth(bad, legacy=False),
        "legacy.pth": _pth(bad, legacy=True),
        "plain.npy": _npy(bad),
        "plain.safetensors": _safetensors(bad),
    }
    paths = []
    for name, data in made.items():
        path = folder / name
        path.write_bytes(data)
        paths.append(path)
        for kind, compression in (("deflated", zipfile.ZIP_DEFLATED), ("stored", zipfile.ZIP_STORED)):
            archive = folder / f"{kind}_{name.replace('.', '_')}.zip"
            with zipfile.ZipFile(archive, "w", compression) as z:
                z.writestr(name, data)
            paths.append(archive)
    return paths
