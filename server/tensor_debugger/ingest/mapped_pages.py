"""Give back the resident pages of a memory-mapped tensor file once they have been copied.

`torch.load(..., mmap=True)` maps the file privately; every page we read stays resident (and counts in RSS)
until the mapping goes. Dropping pages we have already copied keeps memory bounded for dumps larger than RAM.
Only ranges inside a private, read-only-so-far mapping of the very file are ever touched.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_MADV_DONTNEED = 4


@dataclass(frozen=True)
class FileMapping:
    start: int
    stop: int


def file_mappings(path: Path) -> list[FileMapping]:
    """Private mappings of `path` in this process, from /proc/self/maps (empty where there is no /proc)."""
    target = str(path.resolve())
    found: list[FileMapping] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].strip() == target and parts[1][3] == "p":
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    found.append(FileMapping(lo, hi))
    except OSError:
        return []
    return found


class PageReleaser:
    """Drops pages of one file's private mappings; a no-op when the file is not mapped."""

    def __init__(self, path: Path) -> None:
        self._mappings = file_mappings(path)
        self._madvise = _libc_madvise() if self._mappings else None

    def release(self, address: int, length: int) -> None:
        if self._madvise is None or length <= 0:
            return
        page = mmap.PAGESIZE
        lo = (address + page - 1) // page * page  # only whole pages inside the range
        hi = (address + length) // page * page
        for m in self._mappings:
            a, b = max(lo, m.start), min(hi, m.stop)
            if b > a:
                self._madvise(ctypes.c_void_p(a), ctypes.c_size_t(b - a), _MADV_DONTNEED)


def _libc_madvise() -> Callable[..., int] | None:
    if os.name != "posix":
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    fn = ctypes.CDLL(name, use_errno=True).madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return, unused-ignore]
