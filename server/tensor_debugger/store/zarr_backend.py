"""The Zarr side of the array store (store/arrays.py), in a module of its own so that what only reads the metadata
database (a `compare` run again on unchanged files) does not import Zarr (about 0.15 s): the codec new arrays are
written with, the store wrapper counting chunk reads, and the store of a URL."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from zarr.abc.store import ByteRequest, Store
from zarr.codecs import BloscCodec
from zarr.storage import LocalStore, MemoryStore, WrapperStore

from tensor_debugger.errors import StoreOutageError, StoreReadError, StoreWriteError, TensorDebuggerError
from tensor_debugger.store import compression
from tensor_debugger.store.chunk_reader import ReadCounter
from tensor_debugger.store.layout import EVERY_CHUNK_WRITTEN, missing_chunk
from tensor_debugger.store.object_stores import describe_failure, is_refusal, open_s3_store

if TYPE_CHECKING:
    from obstore.store import S3Store
    from zarr.abc.buffer import Buffer, BufferPrototype

# compression.py's settings (why these); where the codec saves under compression.RAW_BELOW, ingest stores raw.
DEFAULT_CODEC = BloscCodec(cname=compression.CNAME, clevel=compression.CLEVEL, shuffle=compression.SHUFFLE)


_METADATA_KEYS = frozenset({"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"})


class CountingStore(WrapperStore[Store]):
    """Counts chunk reads (not metadata), so tests and benchmarks can see what a computation touched. Zarr
    re-wraps stores (a read-only copy for `mode="r"`), so the copies share one counter. Over an object store
    (`remote`), a failed write or deletion is a StoreWriteError naming the key; a local folder's are OSErrors,
    a full disk among them (errors.is_disk_full)."""

    def __init__(self, store: Store, counter: ReadCounter | None = None, remote: bool = False) -> None:
        super().__init__(store)
        self.counter = counter or ReadCounter()
        self.remote = remote

    def _with_store(self, store: Store) -> CountingStore:
        return CountingStore(store, self.counter, self.remote)

    @contextmanager
    def _writing(self, key: str) -> Iterator[None]:
        try:
            yield
        except TensorDebuggerError:
            raise
        except Exception as exc:
            if not self.remote:
                raise
            error = StoreWriteError if is_refusal(exc) else StoreOutageError
            raise error(key, describe_failure(exc)) from exc

    async def set(self, key: str, value: Buffer) -> None:
        with self._writing(key):
            await self._store.set(key, value)

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        with self._writing(key):
            await self._store.set_if_not_exists(key, value)

    async def delete(self, key: str) -> None:
        with self._writing(key):
            await self._store.delete(key)

    async def delete_dir(self, prefix: str) -> None:
        with self._writing(prefix):
            await self._store.delete_dir(prefix)

    @contextmanager
    def _reading(self, key: str) -> Iterator[None]:
        """Over an object store, a read it did not answer is a StoreReadError naming the key (an outage: ingest
        and comparisons try again later); a refusal or a missing object is raised as it came."""
        try:
            yield
        except (TensorDebuggerError, FileNotFoundError):
            raise
        except Exception as exc:
            if not self.remote or is_refusal(exc):
                raise
            raise StoreReadError(f"the array store did not answer reading {key}: {describe_failure(exc)}") from exc

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        chunk = key.rsplit("/", 1)[-1] not in _METADATA_KEYS
        if chunk:
            self.counter.add(1)
        with self._reading(key):
            found = await self._store.get(key, prototype, byte_range)
        if found is None and chunk and self.read_only:  # a read (mode="r"), not a write's read-modify-write
            await self._check_never_written(key, prototype)
        return found

    async def _check_never_written(self, key: str, prototype: BufferPrototype) -> None:
        """Raise `missing_chunk` where the chunk at `key`, which is not there, belongs to an array written with every
        chunk (its zarr.json's attribute says so): damage, not the fill value. Only on a missing chunk's path."""
        parts = key.split("/")
        at = next((i for i in range(len(parts) - 1, -1, -1) if parts[i] == "c" or parts[i].startswith("c.")), None)
        if at is None:  # not a chunk key of the "default" encoding (which this store writes)
            return
        document = "/".join([*parts[:at], "zarr.json"])
        with self._reading(document):
            text = await self._store.get(document, prototype)
        if text is None:
            return
        attributes = json.loads(text.to_bytes()).get("attributes", {})
        if attributes.get(EVERY_CHUNK_WRITTEN) is True:
            root = self._store.root if isinstance(self._store, LocalStore) else None
            raise missing_chunk(f"file {root / key}" if root is not None else f"object {key}")

    async def exists(self, key: str) -> bool:
        with self._reading(key):
            return await self._store.exists(key)

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        with self._reading(prefix):
            async for name in self._store.list_dir(prefix):
                yield name

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        with self._reading(prefix):
            async for name in self._store.list_prefix(prefix):
                yield name


def open_store(url: str, environ: Mapping[str, str] | None = None, bucket: S3Store | None = None) -> Store:
    """The Zarr store of `url`; an s3:// store is over `bucket` where given, else configured from the AWS variables
    in `environ` (this process's environment unless given) and tried once (StoreUnavailableError naming the setting
    when it fails)."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return LocalStore(Path(unquote(parsed.path)))
    if parsed.scheme == "s3":
        return open_s3_store(url, os.environ if environ is None else environ, bucket)
    if parsed.scheme == "memory":
        return MemoryStore()
    raise ValueError(f"unsupported store URL {url!r}: use file:///folder, s3://bucket/prefix or memory://")
