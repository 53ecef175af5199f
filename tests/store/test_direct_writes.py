"""Chunk files written around the page cache (store/direct_writes.py, the `direct_writes` setting): the same bytes
as a buffered write for every size (the block-aligned body direct, the tail buffered, the zeros a short chunk is
extended with), really not left in the page cache, and written buffered where the file system refuses; bytes on an
aligned address (an ingest's read buffer) written from where they lie, without the copy into the thread's buffer."""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from tensor_debugger.ingest.block_readers import BufferPool
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store import direct_writes
from tensor_debugger.store.direct_writes import ALIGN, BUFFER, SMALLEST, address, write_chunk_file

from tests.support.stored import read_back, stored

MEMORY_FILE_SYSTEMS = ("tmpfs", "ramfs")
SIZES = [100, SMALLEST - 1, SMALLEST, 3 * ALIGN * 100, BUFFER - 1, BUFFER + ALIGN + 7, 2 * BUFFER + 1]


def resident_bytes(path: Path) -> int:
    """Bytes of the file at `path` in the page cache, as mincore(2) counts them on a shared mapping of it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    size = path.stat().st_size
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vector = ctypes.create_string_buffer(pages)
            assert libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
            return sum(byte & 1 for byte in vector.raw) * mmap.PAGESIZE
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


def file_system(path: Path) -> str:
    """The type of the file system `path` is on (the longest mount point of /proc/mounts above it)."""
    best, kind = "", ""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        mount = fields[1].replace("\\040", " ")
        if (str(path.resolve()) + "/").startswith(mount.rstrip("/") + "/") and len(mount) > len(best):
            best, kind = mount, fields[2]
    return kind


def skip_unless_direct(folder: Path) -> None:
    """Skip where `folder`'s file system refuses direct writes: chunk files are written buffered there (which the
    every-size test covers)."""
    probe = folder / "direct-probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
        try:
            os.write(fd, mmap.mmap(-1, ALIGN))
        finally:
            os.close(fd)
    except OSError as exc:
        pytest.skip(f"{folder} ({file_system(folder)}) takes no direct writes: {exc}")
    finally:
        probe.unlink(missing_ok=True)


@pytest.fixture
def on_disk(tmp_path: Path) -> Iterator[Path]:
    """A folder where a file's pages can be outside the page cache: `tmp_path`, or where that is on tmpfs (whose files
    live in the page cache, as /tmp on some systems), a folder in the checkout's test-artifacts/."""
    if file_system(tmp_path) not in MEMORY_FILE_SYSTEMS:
        skip_unless_direct(tmp_path)
        yield tmp_path
        return
    artifacts = Path(__file__).resolve().parents[2] / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="direct-writes-", dir=artifacts))
    try:
        if file_system(folder) in MEMORY_FILE_SYSTEMS:
            pytest.skip(f"{tmp_path} and {folder} are on {file_system(folder)}: their files live in the page cache")
        skip_unless_direct(folder)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("folder", ["tmp_path", "/dev/shm"])
def test_every_size_is_written_as_a_buffered_write_writes_it(tmp_path: Path, folder: str) -> None:
    """On this machine's disk (direct writes taken) and on tmpfs (which may refuse them), with and without the
    zeros that extend a short chunk."""
    root = tmp_path if folder == "tmp_path" else Path(folder)
    if not root.is_dir():
        pytest.skip(f"no {folder} here")
    rng = np.random.default_rng(5)
    made: list[Path] = []
    try:
        for size in SIZES:
            data = rng.integers(0, 256, size, dtype=np.uint8)
            for extend in (0, size + 3 * ALIGN + 5):
                expected = data.tobytes() + bytes(max(0, extend - size))
                for direct in (True, False):
                    path = root / f"td-direct-{os.getpid()}-{size}-{extend}-{direct}"
                    made.append(path)
                    write_chunk_file(path, memoryview(data.data), extend, direct)
                    assert path.read_bytes() == expected, (size, extend, direct)
    finally:
        for path in made:
            path.unlink(missing_ok=True)


def test_a_direct_write_leaves_at_most_its_tail_in_the_page_cache(on_disk: Path) -> None:
    data = np.random.default_rng(6).integers(0, 256, BUFFER + ALIGN + 7, dtype=np.uint8)
    direct, buffered = on_disk / "direct", on_disk / "buffered"
    write_chunk_file(direct, memoryview(data.data), 0, True)
    write_chunk_file(buffered, memoryview(data.data), 0, False)
    assert resident_bytes(buffered) == BUFFER + 2 * ALIGN
    assert resident_bytes(direct) <= ALIGN  # the 7 bytes past the last whole block, written buffered


@pytest.mark.parametrize("direct_writes", [True, False])
def test_an_ingest_honours_the_setting_and_stores_the_same_tensor(on_disk: Path, direct_writes: bool) -> None:
    """TENSOR_DEBUGGER_DIRECT_WRITES reaches the ingest's chunk files; either way the stored values are the file's."""
    tmp_path = on_disk
    values = np.random.default_rng(7).standard_normal((1024, 1000)).astype(np.float32)  # chunks just under 1 MiB
    np.save(tmp_path / "acts.npy", values)
    environ = {"TENSOR_DEBUGGER_DIRECT_WRITES": str(direct_writes).lower(), "TENSOR_DEBUGGER_BUFFERED_RUN_BYTES": "0"}
    settings = Settings.from_environ(environ, data_dir=tmp_path / "data", demo=False)
    assert settings.direct_writes is direct_writes and settings.buffered_run_bytes == 0
    services = open_services(settings)
    try:
        result = services.ingestor.ingest("direct", "run", [InputFile(tmp_path / "acts.npy", "acts.npy")])
        chunks = [p for p in (tmp_path / "data" / "arrays").rglob("c.*") if p.is_file()]
        assert len(chunks) > 2 and all(p.stat().st_size > SMALLEST for p in chunks)
        resident = sum(resident_bytes(p) for p in chunks)  # before anything reads them back
        if direct_writes:
            assert resident <= len(chunks) * ALIGN  # each chunk's tail at most
        else:
            assert resident >= values.nbytes
        [record] = stored(services, result.run_id).values()
        assert read_back(services, record).numpy().tobytes() == values.tobytes()
    finally:
        services.close()


def test_a_runs_first_bytes_go_through_the_page_cache_and_the_rest_around_it(on_disk: Path) -> None:
    """TENSOR_DEBUGGER_BUFFERED_RUN_BYTES: a small run stays in the page cache, where its comparison reads it."""
    tmp_path = on_disk
    folder = tmp_path / "run"
    folder.mkdir()
    values = np.random.default_rng(8).standard_normal((1024, 1000)).astype(np.float32)
    np.save(folder / "0_first.npy", values)
    np.save(folder / "1_second.npy", values + 1)  # not the same tensor: it would share the first's array
    settings = Settings(data_dir=tmp_path / "data", demo=False, buffered_run_bytes=values.nbytes)
    services = open_services(settings)
    try:
        result = services.ingestor.ingest("budget", "run", [InputFile(folder, "run/")])
        records = stored(services, result.run_id)
        resident = {}
        for record in records.values():
            chunks = [p for p in (tmp_path / "data" / "arrays" / record.store_key).glob("c.*") if p.is_file()]
            assert len(chunks) > 2
            resident[record.name] = sum(resident_bytes(p) for p in chunks)
    finally:
        services.close()
    assert resident["0_first"] >= values.nbytes, resident  # the first tensor: within the run's budget
    assert resident["1_second"] <= 4 * ALIGN, resident  # past it: around the cache (each chunk's tail at most)


def test_an_ingests_read_buffers_start_on_an_aligned_address() -> None:
    pool = BufferPool(keep=4)
    taken = [pool.take(n) for n in (1, ALIGN - 1, 1 << 20, 3 * (1 << 20) + 17)]
    for buffer in taken:
        assert address(memoryview(buffer.data)) % ALIGN == 0
        pool.give(buffer)
    again = pool.take(1 << 20)  # a kept one: still aligned
    assert address(memoryview(again.data)) % ALIGN == 0 and pool.made == len(taken)


def _written_in_a_fresh_thread(path: Path, data: memoryview) -> bool:
    """Write `data` direct as `path` on a new thread; whether that thread made its own aligned buffer (a copy)."""
    made: list[bool] = []

    def write() -> None:
        write_chunk_file(path, data, 0, True)
        made.append(getattr(direct_writes._buffers, "view", None) is not None)

    thread = threading.Thread(target=write)
    thread.start()
    thread.join()
    assert made, "the write failed"
    return made[0]


@pytest.mark.parametrize("size", [SMALLEST, BUFFER + ALIGN + 7, 2 * BUFFER + 1])
def test_aligned_bytes_are_written_from_where_they_lie(on_disk: Path, size: int) -> None:
    """A chunk at an aligned address (as an ingest's read buffer gives) goes to the disk without the copy into the
    thread's buffer, around the page cache, the same bytes; one that is not is copied there first, the same bytes."""
    pool = BufferPool()
    buffer = pool.take(size + ALIGN + 16)
    buffer[:] = np.random.default_rng(9).integers(0, 256, buffer.size, dtype=np.uint8)
    for offset, copied in ((0, False), (ALIGN, False), (16, True)):
        data = memoryview(buffer.data)[offset : offset + size]
        path = on_disk / f"chunk-{offset}"
        assert _written_in_a_fresh_thread(path, data) is copied, offset
        assert resident_bytes(path) <= ALIGN, offset  # the tail past the last whole block at most (before a read)
        assert path.read_bytes() == bytes(data), offset
