"""Tensor arrays in a Zarr v3 store, addressed by key ("runs/<run id>/<index>"), configured by URL.

Supported URLs: file:///absolute/folder, s3://bucket/prefix (store/object_stores.py) and memory:// (tests). Each
tensor is one chunked array holding its storage dtype; its logical dtype lives in the array's attributes and in the
metadata database.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property, partial
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import unquote, urlparse

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.errors import StoreUnavailableError, StoreWriteError
from tensor_debugger.store import compression
from tensor_debugger.store.chunk_reader import ChunkReader, ReadCounter
from tensor_debugger.store.chunk_writer import ChunkWriter
from tensor_debugger.store.dtypes import LogicalDtype, storage_to_torch
from tensor_debugger.store.layout import (
    CHUNK_SEPARATOR,
    EVERY_CHUNK_WRITTEN,
    ArrayLayout,
    BloscSettings,
    array_document,
    group_document,
    parse_layout,
    read_layout,
)
from tensor_debugger.store.object_stores import aws_variables, describe_failure, open_s3_bucket

if TYPE_CHECKING:
    import torch
    import zarr

    from tensor_debugger.store.object_chunks import ChunkObjects
    from tensor_debugger.store.zarr_backend import CountingStore

T = TypeVar("T")

_OPENED_LIMIT = 512  # arrays kept open for slices and comparisons


def worth_compressing(block: NDArray[Any]) -> bool:
    """Whether the store's codec saves enough on a sample of `block` (compression.py) to store its tensor so."""
    return compression.worth_compressing(block, compression.CNAME, compression.CLEVEL, compression.SHUFFLE)


def run_prefix(run_id: int) -> str:
    """The key under which a run's arrays are stored."""
    return f"runs/{run_id}"


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run one of a Zarr store's coroutines to its end from synchronous code, in an event loop of its own (on a
    thread of its own, so that a caller already inside an event loop is not disturbed). Only for rare calls
    (listing, deleting): reading and writing arrays go through Zarr's synchronous API or the chunk files."""
    with ThreadPoolExecutor(1, thread_name_prefix="store-sync") as thread:
        return thread.submit(asyncio.run, coroutine).result()


class Remembered(Generic[T]):
    """The `limit` values last made for arrays (opened arrays, parsed layouts), by key and content digest:
    arrays never change after ingest, and the digest tells a new array apart from an old one that once had the
    same key."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._values: OrderedDict[tuple[str, str], T] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, content_digest: str | None, make: Callable[[], T]) -> T:
        """The value remembered for (key, digest), else `make()`'s (remembered, unless there is no digest)."""
        if content_digest is None:
            return make()
        remembered = (key, content_digest)
        with self._lock:
            found = self._values.get(remembered)
            if found is not None:
                self._values.move_to_end(remembered)
                return found
        value = make()
        with self._lock:
            self._values[remembered] = value
            while len(self._values) > self._limit:
                self._values.popitem(last=False)
        return value

    def forget(self, prefix: str) -> None:
        """Forget the values of the arrays at or under `prefix`."""
        with self._lock:
            for remembered in [k for k in self._values if k[0] == prefix or k[0].startswith(prefix + "/")]:
                del self._values[remembered]


def _write_json(path: Path, document: dict[str, Any]) -> None:
    """`document` at `path` as Zarr writes metadata (indented), whole or not at all (written aside, then renamed)."""
    aside = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    aside.write_bytes(json.dumps(document, indent=2).encode())
    os.replace(aside, path)


class ArrayStore:
    def __init__(
        self,
        url: str,
        environ: Mapping[str, str] | None = None,
        direct_writes: bool = True,
        retry_seconds: float | None = None,
    ) -> None:
        self.url = url
        self._direct_writes = direct_writes  # a local folder's large chunk files around the page cache
        # the AWS variables an s3:// store was opened with, for a child process opening the same store
        self.environ = aws_variables(os.environ if environ is None else environ)
        # the read counter, shared with the Zarr store once one is opened (chunk readers count in it too)
        self._counter = ReadCounter()
        self._opened: Remembered[zarr.Array[Any]] = Remembered(_OPENED_LIMIT)
        self._layouts: Remembered[ArrayLayout] = Remembered(_OPENED_LIMIT)
        parsed = urlparse(url)
        # A local folder's Zarr store is opened on first use (what only lists the folder needs no Zarr: see
        # zarr_backend.py); any other is opened now, so that a store that cannot be used stops here.
        self._folder = Path(unquote(parsed.path)) if parsed.scheme == "file" else None
        # An s3:// store's objects, which comparisons and slices fetch themselves (store/object_chunks.py)
        self._objects: ChunkObjects | None = None
        if parsed.scheme == "s3":
            from tensor_debugger.store.object_chunks import ChunkObjects

            # retry_seconds: Settings.store_retry_seconds, how long a request is tried again
            bucket = open_s3_bucket(url, os.environ if environ is None else environ, retry_seconds)
            self._objects = ChunkObjects(bucket, url)
        self._groups: set[PurePosixPath] = set()  # levels of the folder or bucket known to hold a group's zarr.json
        # in a bucket: the names under a level ("runs/3") as listed once, with the arrays this process made there since
        # (a run's arrays are made by the one ingest that holds the run: no other process adds any meanwhile)
        self._present: dict[PurePosixPath, set[str]] = {}
        self._groups_lock = threading.Lock()
        if self._folder is None:
            self._open_store(environ)

    def _open_store(self, environ: Mapping[str, str] | None = None) -> CountingStore:
        from zarr.storage import LocalStore, MemoryStore

        from tensor_debugger.store.zarr_backend import CountingStore, open_store

        backend = open_store(self.url, environ, self._objects.bucket if self._objects is not None else None)
        remote = not isinstance(backend, LocalStore | MemoryStore)
        self.__dict__["_store"] = store = CountingStore(backend, self._counter, remote=remote)
        return store

    @cached_property
    def _store(self) -> CountingStore:
        """The Zarr store (a local folder's, opened on first use)."""
        return self._open_store()

    @property
    def chunk_reads(self) -> int:
        """Chunks read through this store since it was opened."""
        return self._counter.chunks

    def create(
        self,
        key: str,
        shape: tuple[int, ...],
        dtype: LogicalDtype,
        chunks: tuple[int, ...],
        compressed: bool = True,
    ) -> zarr.Array[Any]:
        """A new array at `key`, its chunks compressed with `DEFAULT_CODEC` or (not `compressed`) stored raw."""
        import zarr

        from tensor_debugger.store.zarr_backend import DEFAULT_CODEC

        with self._groups_lock:  # made by Zarr: what was listed above it is listed again before `writer` uses it
            self._present.pop(PurePosixPath(key).parent, None)

        return zarr.create_array(
            self._store,
            name=key,
            shape=shape,
            dtype=dtype.numpy_storage,
            chunks=chunks,
            compressors=DEFAULT_CODEC if compressed else None,
            fill_value=np.zeros((), dtype=dtype.numpy_storage)[()],
            attributes={"logical_dtype": dtype.name, EVERY_CHUNK_WRITTEN: True},
            # a folder's arrays name their chunks "c.0.0" (layout.CHUNK_SEPARATOR); an object store's "c/0/0"
            chunk_key_encoding={"name": "default", "separator": CHUNK_SEPARATOR if self._folder else "/"},
            overwrite=True,
            # every chunk is written: the per-chunk comparison with the fill value costs more than it saves
            config={"write_empty_chunks": True},
        )

    def writer(
        self,
        key: str,
        shape: tuple[int, ...],
        dtype: LogicalDtype,
        chunks: tuple[int, ...],
        compressed: bool = True,
        direct: bool = True,
    ) -> ChunkWriter | zarr.Array[Any]:
        """A new array at `key` for ingest to fill, region by chunk-aligned region: a `ChunkWriter` where the
        store is a local folder (its zarr.json written here, as Zarr would write it: `layout.array_document`), an
        `ObjectChunkWriter` in S3 (its chunks uploaded concurrently: store/object_writes.py), else the Zarr array
        itself. `direct`: its chunk files may go around the page cache (if `direct_writes`)."""
        direct = direct and self._direct_writes
        storage = dtype.numpy_storage
        codec = (
            BloscSettings(compression.CNAME, compression.CLEVEL, compression.SHUFFLE, storage.itemsize, 0)
            if compressed
            else None
        )
        separator = CHUNK_SEPARATOR if self._folder else "/"
        document = array_document(
            shape, storage, chunks, codec, {"logical_dtype": dtype.name, EVERY_CHUNK_WRITTEN: True}, separator
        )
        if self._objects is not None and document is not None:
            from tensor_debugger.store.object_writes import create_object_array

            parent = PurePosixPath(key).parent
            with self._groups_lock:
                known = set(self._groups)
                present = self._present.get(parent)
            if present is None:  # the parent listed once; then each array made under it is added to what it holds
                present = self._objects.names_under(str(parent)) if str(parent) != "." else None
            made = create_object_array(self._objects, key, document, known, present)
            with self._groups_lock:
                self._groups |= known
                if present is not None:
                    self._present[parent] = present | {PurePosixPath(key).name}
            return made
        if self._folder is None or document is None:
            array = self.create(key, shape, dtype, chunks, compressed)
            if self._folder is None:
                return array
            layout = read_layout(self._folder / key, key)
            return ChunkWriter(layout, self._folder / key, direct) if layout.readable else array
        folder = self._folder / key
        if folder.is_dir():  # as Zarr's overwrite=True: nothing of an older array at the key stays
            shutil.rmtree(folder)
        self._make_groups(PurePosixPath(key).parent)
        folder.mkdir(parents=True, exist_ok=True)
        _write_json(folder / "zarr.json", document)
        return ChunkWriter(parse_layout(document), folder, direct)

    def _make_groups(self, parent: PurePosixPath) -> None:
        """Write the group zarr.json Zarr writes at `parent` and every level above it (the store's root
        included) that has none, once per process and level."""
        assert self._folder is not None
        levels = [parent, *parent.parents] if str(parent) != "." else [parent]
        for level in levels:
            with self._groups_lock:
                if level in self._groups:
                    continue
            folder = self._folder / level
            folder.mkdir(parents=True, exist_ok=True)
            if not (folder / "zarr.json").exists():
                _write_json(folder / "zarr.json", group_document())
            with self._groups_lock:
                self._groups.add(level)

    def open(self, key: str, content_digest: str | None = None) -> zarr.Array[Any]:
        """The array at `key`, read-only. With the tensor's content digest, an array opened before is reused
        (its metadata is not read again): arrays never change after ingest, and the digest tells a new array
        apart from an old one that once had the same key."""
        import zarr

        return self._opened.get(key, content_digest, lambda: zarr.open_array(self._store, path=key, mode="r"))

    def reader(self, key: str, content_digest: str | None = None) -> ChunkReader | zarr.Array[Any]:
        """The array at `key` for reading regions in bulk (comparisons, slices): a `ChunkReader` where the array's
        layout allows one (in S3, an `ObjectChunkReader`: store/object_chunks.py), else the Zarr array itself. Both
        index like numpy and count their chunk reads here. A `ChunkReader` is built from the array's zarr.json alone
        (about 0.08 ms; opening the Zarr array takes 0.4)."""
        open_array = partial(self.open, key, content_digest)
        if self._folder is not None:
            layout = self._layout(key, content_digest)
            if layout.readable:
                return ChunkReader(layout, self._folder / key, self._counter, open_array)
        elif self._objects is not None:
            from tensor_debugger.store.object_chunks import ObjectChunkReader

            layout = self._layout(key, content_digest)
            if layout.readable:
                return ObjectChunkReader(layout, self._objects, key, self._counter, open_array)
        return self.open(key, content_digest)

    def _layout(self, key: str, content_digest: str | None) -> ArrayLayout:
        """The parsed zarr.json of the array at `key` in the local folder or the bucket (remembered like `open`'s
        arrays)."""
        folder, objects = self._folder, self._objects
        if folder is not None:
            return self._layouts.get(key, content_digest, lambda: read_layout(folder / key, key))
        assert objects is not None
        return self._layouts.get(key, content_digest, lambda: objects.layout(key))

    def check(self) -> None:
        """Raise StoreUnavailableError unless the store answers now: a local folder (or the folder it will be made
        in) is there, an S3 bucket lists its prefix. For health checks: nothing is read or written."""
        if self._folder is not None:
            where = self._folder if self._folder.exists() else self._folder.parent
            if not where.is_dir() or not os.access(where, os.R_OK | os.W_OK | os.X_OK):
                raise StoreUnavailableError(f"the array store's folder {where} is not a folder this process may use")
            return
        assert self._objects is not None
        try:
            self._objects.list_one()
        except Exception as exc:  # obstore's GenericError for most failures: its first line says which
            reason = describe_failure(exc)
            raise StoreUnavailableError(f"the array store did not answer ({self.url}): {reason}") from None

    def delete(self, prefix: str) -> None:
        """Delete every array under `prefix` ("runs/12")."""
        self._opened.forget(prefix)
        self._layouts.forget(prefix)
        gone = PurePosixPath(prefix)
        if self._folder is not None:  # as Zarr's LocalStore.delete_dir, without starting an event loop
            folder = self._folder / prefix
            if folder.is_file():
                raise ValueError(f"delete was passed a {prefix=!r} that is a file")
            if folder.is_dir():
                with self._groups_lock:
                    self._groups -= {level for level in self._groups if level == gone or gone in level.parents}
                shutil.rmtree(folder)
            return
        with self._groups_lock:
            self._groups -= {level for level in self._groups if level == gone or gone in level.parents}
            # what was listed at, under or just above the prefix is listed again before the next array is made there
            for level in [level for level in self._present if level in (gone, gone.parent) or gone in level.parents]:
                del self._present[level]
        run_sync(self._store.delete_dir(prefix))

    def children(self, prefix: str) -> list[str]:
        """Names directly under `prefix` ("runs" -> ["1", "2"])."""
        if self._folder is not None:  # as Zarr's LocalStore.list_dir, without starting an event loop
            try:
                return sorted(os.listdir(self._folder / prefix))
            except (FileNotFoundError, NotADirectoryError):
                return []

        async def collect() -> list[str]:
            it: AsyncIterator[str] = self._store.list_dir(prefix)
            return [name async for name in it]

        return sorted(run_sync(collect()))

    def read_object(self, key: str) -> bytes | None:
        """The bytes of the small object at `key` outside any array (the store's marker), None where there is none.
        Not counted as a chunk read."""
        if self._folder is not None:
            try:
                return (self._folder / key).read_bytes()
            except (FileNotFoundError, NotADirectoryError):
                return None
        if self._objects is not None:
            import obstore

            try:
                return obstore.get(self._objects.bucket, key).bytes().to_bytes()
            except FileNotFoundError:
                return None
            except Exception as exc:  # obstore's errors for an answer other than 404
                raise StoreUnavailableError(f"cannot read {key} from the array store {self.url}: {exc}") from None
        from zarr.buffer import default_buffer_prototype

        found = run_sync(self._store.get(key, default_buffer_prototype()))
        return None if found is None else found.to_bytes()

    def write_object(self, key: str, data: bytes) -> None:
        """Write `data` as the object at `key` outside any array, whole or not at all."""
        if self._folder is not None:
            self._folder.mkdir(parents=True, exist_ok=True)
            aside = self._folder / f".{key}.{os.getpid()}.{threading.get_ident()}"
            aside.write_bytes(data)
            os.replace(aside, self._folder / key)
            return
        if self._objects is not None:
            import obstore

            try:
                obstore.put(self._objects.bucket, key, data)
            except Exception as exc:
                raise StoreWriteError(key, describe_failure(exc)) from None
            return
        from zarr.buffer import default_buffer_prototype

        run_sync(self._store.set(key, default_buffer_prototype().buffer.from_bytes(data)))

    def read_whole(self, key: str, dtype: LogicalDtype) -> torch.Tensor:
        """The whole tensor at `key`, bit-exact, in its logical dtype (for small tensors and tests)."""
        array = self.open(key)
        values = np.asarray(array[...]) if array.shape else np.asarray(array[()])
        return storage_to_torch(values.reshape(array.shape), dtype)
