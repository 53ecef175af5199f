"""Writing a chunk file around the page cache (O_DIRECT), where the system and the file system allow it.

A buffered write copies every byte into a page of the page cache, which the kernel writes back later. For the
gigabytes of a large ingest that copy is most of the ingest's time on machines where fresh memory is dear (a
virtual machine whose free pages the host takes back: each new page-cache page is a fault in the host), and the
pages so filled push out the cache the comparison reads from. A direct write hands the disk the bytes from one
small reused buffer instead. Only the file's block-aligned body is written so; its tail (under one block) is written
through the page cache. Where direct writes are refused (tmpfs, some network file systems, other systems), the file
is written through the page cache as before.

Bytes that already lie on an aligned address (a chunk at the start of an ingest's read buffer, which
`ingest/block_readers.BufferPool` aligns, and every chunk after it whose offset is a multiple of `ALIGN`) are handed
to the disk from where they are: no copy at all, and the GIL released for the whole write. Others are copied into
the thread's aligned buffer first, as a copy under the GIL; so are all where the system refuses the address.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading

import numpy as np

ALIGN = 4096  # a multiple of every file system's logical block size that direct writes must be aligned to
BUFFER = 8 << 20  # bytes per write: the reused buffer of each writing thread
SMALLEST = 256 << 10  # smaller files gain little from going around the cache (a chunk is about 1 MiB)

_buffers = threading.local()


def _buffer() -> memoryview:
    """This thread's page-aligned buffer, made on its first direct write."""
    found: memoryview | None = getattr(_buffers, "view", None)
    if found is None:
        found = memoryview(mmap.mmap(-1, BUFFER))
        _buffers.view = found
    return found


def write_chunk_file(path: os.PathLike[str] | str, data: memoryview, size: int = 0, direct: bool = True) -> None:
    """Write the bytes of `data` as the file at `path` (created or truncated), extended with zeros to `size` bytes
    where it is shorter; around the page cache when `direct` and the file is large enough to gain from it."""
    use_direct = direct and len(data) >= SMALLEST and hasattr(os, "O_DIRECT")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    try:
        fd = os.open(path, flags | (os.O_DIRECT if use_direct else 0), 0o644)
    except OSError as exc:
        if not use_direct or exc.errno != errno.EINVAL:
            raise
        use_direct, fd = False, os.open(path, flags, 0o644)
    try:
        done = _write_direct(fd, data) if use_direct else 0
        while done < len(data):
            done += os.write(fd, data[done:])
        if size > done:
            os.ftruncate(fd, size)
    finally:
        os.close(fd)


def address(data: memoryview) -> int:
    """Where the first byte of `data` lies in memory."""
    return int(np.frombuffer(data, dtype=np.uint8).__array_interface__["data"][0])


def _write_in_place(fd: int, data: memoryview, body: int) -> int:
    """Write `data[:body]` (`body` a multiple of ALIGN) from where it lies, if that is an aligned address; returns the
    bytes written, fewer where the system refuses the address (EINVAL) or writes less than asked."""
    if body == 0 or address(data) % ALIGN:
        return 0
    try:
        return _write_body(fd, data, 0, body, None)
    except _Refused as refused:
        return refused.done


class _Refused(Exception):
    """The system refused a direct write (EINVAL) after `done` bytes."""

    def __init__(self, done: int) -> None:
        super().__init__(done)
        self.done = done


def _write_body(fd: int, data: memoryview, done: int, body: int, buffer: memoryview | None) -> int:
    """Write `data[done:body]` in BUFFER-sized writes, from where it lies (`buffer` None) or copied into `buffer`;
    returns the bytes written in all, stopping at a short write (what is left is no longer aligned). Raises
    `_Refused` where the system refuses the address or the file (EINVAL)."""
    while done < body:
        n = min(BUFFER, body - done)
        try:
            if buffer is None:
                written = os.write(fd, data[done : done + n])
            else:
                buffer[:n] = data[done : done + n]
                written = os.write(fd, buffer[:n])
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            raise _Refused(done) from None
        done += written
        if written != n:
            break
    return done


def _write_direct(fd: int, data: memoryview) -> int:
    """Write the block-aligned body of `data` from offset 0, from where it lies or else through this thread's buffer;
    returns the bytes written, and leaves `fd` writing through the page cache for the rest (all of it, if the file
    system refuses)."""
    body = len(data) - len(data) % ALIGN
    done = _write_in_place(fd, data, body)
    if done % ALIGN:  # a short write: the rest goes through the page cache
        body = done
    if done < body:
        try:
            done = _write_body(fd, data, done, body, _buffer())
        except _Refused as refused:  # the file system takes no direct writes after all: the rest goes buffered
            done = refused.done
            os.lseek(fd, done, os.SEEK_SET)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
    return done
