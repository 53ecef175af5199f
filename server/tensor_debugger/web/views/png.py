"""A PNG file from an array of RGB pixels, written with the standard library's zlib (no imaging library): the
signature, an IHDR chunk (8-bit truecolour), one IDAT chunk of the rows (each with filter byte 0) and IEND."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import numpy as np
from numpy.typing import NDArray


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(pixels: NDArray[Any]) -> bytes:
    """`pixels`: height x width x 3, uint8 (red, green, blue)."""
    if pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8:
        raise ValueError(f"a PNG needs height x width x 3 uint8 pixels, got {pixels.shape} {pixels.dtype}")
    height, width = pixels.shape[:2]
    rows = np.zeros((height, 1 + width * 3), dtype=np.uint8)  # filter byte 0 (None) before each row
    rows[:, 1:] = pixels.reshape(height, width * 3)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"".join(
        (
            b"\x89PNG\r\n\x1a\n",
            _chunk(b"IHDR", header),
            _chunk(b"IDAT", zlib.compress(rows.tobytes(), 6)),
            _chunk(b"IEND", b""),
        )
    )
