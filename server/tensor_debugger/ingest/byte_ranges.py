"""A byte range of a file read as a file of its own: a tensor file stored uncompressed inside an archive.

Readers that need a file object (the zip reader for `.pth`, the `.npy` and safetensors headers, `torch.load`) get a
`ByteWindow` onto the range; tensor data is read with positioned reads at the range's offset plus the tensor's.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import IO

from tensor_debugger.ingest.archives import Span


class ByteWindow(io.RawIOBase):
    """The `span` of the file at `path`, read-only and seekable, read with os.preadv (its own position only)."""

    def __init__(self, path: Path, span: Span) -> None:
        super().__init__()
        self._fd = os.open(path, os.O_RDONLY)
        self._span = span
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._span.size}[whence]
        if base + offset < 0:
            raise OSError(f"seek to {base + offset}, before the start")
        self._position = base + offset
        return self._position

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self._span.size - self._position)
        if n <= 0:
            return 0
        got = os.preadv(self._fd, [memoryview(buffer).cast("B")[:n]], self._span.offset + self._position)
        self._position += got
        return got

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def open_range(path: Path, span: Span | None) -> IO[bytes]:
    """The file at `path` (with `span`, only that byte range of it), opened for buffered binary reading."""
    if span is None:
        return open(path, "rb")
    return io.BufferedReader(ByteWindow(path, span), buffer_size=64 * 1024)
