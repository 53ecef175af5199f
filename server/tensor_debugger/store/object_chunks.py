"""Arrays in object storage read as chunk files are: the chunk objects a region needs fetched at once, then decoded.

Through Zarr's `ObjectStore`, every chunk of a region is a request on Zarr's event loop and an array of its own,
decoded by numcodecs on another thread: on two cores that machinery, not the network, bounded comparisons on S3
(bench/cluster.py: 121 MB/s against 717 from a folder). For an array whose layout the chunk reader reads
(store/layout.py), `ObjectChunkReader` instead fetches the chunk objects a region covers with concurrent GETs
(obstore's `get_async`, at most `FETCHES_AT_ONCE` at a time, on an event loop of this module's own thread) and
decodes them as `ChunkReader` decodes chunk files, with the same checks; the compiled chunk loop
(compare/chunk_loop.py) hands the fetched bytes to C instead of paths. A chunk object that is not there is the fill
value, as a chunk file that is not there is.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.errors import StoreOutageError, StoreReadError, StoreWriteError
from tensor_debugger.store.chunk_reader import ChunkReader, ReadCounter, decode_frame
from tensor_debugger.store.layout import ArrayLayout, layout_of, missing_chunk
from tensor_debugger.store.object_stores import describe_failure, is_refusal

if TYPE_CHECKING:
    from obstore import Bytes
    from obstore.store import S3Store

# Requests in flight for one region or block: enough to keep a loopback SeaweedFS or a remote S3 busy (a block of the
# chunk loop is about 16 chunks a side), few enough not to open hundreds of connections for a large slice.
FETCHES_AT_ONCE = 32
# Chunk objects being uploaded at once by this process (every array and ingest thread together): ingest hands over a
# block's 16 chunks at a time from each of its threads, and keeps the memory of what is in flight bounded by that.
PUTS_AT_ONCE = 32
SLICE_BATCH = 64  # chunk objects of a region fetched together (64 MiB of chunks as ingest writes them)
# Fetched chunk bytes an `ObjectChunkReader` keeps for a second read of the same chunks: a failing pair's statistics
# read every chunk of its two tensors (the compiled chunk loop), then where its error is reads them again
# (engine/where.py), which from a folder comes from the page cache and from S3 was a second fetch of every object
# (bench/cluster.py: SeaweedFS served twice the bytes). A reader is one tensor of one pair being compared, so what
# it keeps goes with the pair; a tensor larger than this is fetched again past the first KEPT_BYTES.
KEPT_BYTES = 32 << 20

_LOOPS: dict[int, asyncio.AbstractEventLoop] = {}  # by process id: a forked child starts a loop of its own
_LOOPS_LOCK = threading.Lock()
_PUT_LIMITS: dict[int, asyncio.Semaphore] = {}  # by process id, used on that process's loop only


def _event_loop() -> asyncio.AbstractEventLoop:
    """This process's event loop for fetches, running on a daemon thread of its own (started on the first fetch)."""
    pid = os.getpid()
    with _LOOPS_LOCK:
        loop = _LOOPS.get(pid)
        if loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="chunk-objects", daemon=True).start()
            _LOOPS.clear()
            _LOOPS[pid] = loop
        return loop


class ChunkObjects:
    """The objects of one bucket prefix (the store URL `url`), fetched concurrently."""

    def __init__(self, bucket: S3Store, url: str) -> None:
        self.bucket = bucket
        self.url = url.rstrip("/")

    def name(self, key: str) -> str:
        """The object at `key` as errors name it: the store URL and the key."""
        return f"{self.url}/{key}"

    def list_one(self) -> None:
        """List at most one object of the prefix: raises as obstore does when the bucket does not answer."""
        import obstore

        for _ in obstore.list(self.bucket, chunk_size=1):
            break

    def submit(self, keys: Sequence[str]) -> Future[list[Bytes | None]]:
        """Start fetching the objects at `keys`: their bytes, in order, None for one that is not there. An object
        that cannot be fetched fails the future with a StoreReadError (an OSError) naming it."""
        return asyncio.run_coroutine_threadsafe(self._fetch_all(keys), _event_loop())

    def fetch(self, keys: Sequence[str]) -> list[Bytes | None]:
        """`submit`'s result, waited for."""
        return self.submit(keys).result()

    async def _fetch_all(self, keys: Sequence[str]) -> list[Bytes | None]:
        import obstore

        limit = asyncio.Semaphore(FETCHES_AT_ONCE)

        async def one(key: str) -> Bytes | None:
            async with limit:
                try:
                    result = await obstore.get_async(self.bucket, key)
                    return await result.bytes_async()
                except FileNotFoundError:  # what obstore raises for an object that is not there
                    return None
                except Exception as exc:  # obstore's GenericError for most HTTP answers: its text says which
                    reason = describe_failure(exc)
                    raise StoreReadError(
                        f"the array store did not answer ({self.url}): chunk object {self.name(key)} could not be "
                        f"fetched: {reason}"
                    ) from None

        return list(await asyncio.gather(*(one(key) for key in keys)))

    def fetch_range(self, key: str, start: int, end: int) -> Bytes | None:
        """Bytes `start` to `end` of the object at `key` (one ranged GET, in this thread), None where there is no
        object; a StoreReadError naming it where it cannot be fetched."""
        import obstore

        try:
            return obstore.get_range(self.bucket, key, start=start, end=end)
        except FileNotFoundError:
            return None
        except Exception as exc:  # obstore's GenericError for most HTTP answers: its text says which
            raise StoreReadError(
                f"the array store did not answer ({self.url}): chunk object {self.name(key)} could not be fetched: "
                f"{describe_failure(exc)}"
            ) from None

    def submit_put(self, key: str, data: memoryview, create: bool = False) -> Future[None]:
        """Start uploading `data` as the object at `key` (obstore's `put_async`: one request, or a multipart upload
        of concurrent parts for an object larger than its part size, 5 MB); at most `PUTS_AT_ONCE` of this process
        at a time. `create`: only if there is no object at `key` yet (one already there is left as it is). An upload
        that fails fails the future with a StoreWriteError naming the key (a StoreOutageError where the store did
        not answer). `data` must not change until the future is done."""
        return asyncio.run_coroutine_threadsafe(self._put(key, data, create), _event_loop())

    def put(self, key: str, data: memoryview, create: bool = False) -> None:
        """`submit_put`'s upload, waited for."""
        self.submit_put(key, data, create).result()

    async def _put(self, key: str, data: memoryview, create: bool) -> None:
        import obstore
        from obstore.exceptions import AlreadyExistsError

        pid = os.getpid()
        limit = _PUT_LIMITS.get(pid)
        if limit is None:  # made on the loop's thread, the only one that uses it
            limit = _PUT_LIMITS[pid] = asyncio.Semaphore(PUTS_AT_ONCE)
        async with limit:
            try:
                await obstore.put_async(self.bucket, key, data, mode="create" if create else "overwrite")
            except AlreadyExistsError:
                if not create:
                    raise
            except Exception as exc:  # obstore's GenericError for most HTTP answers: its text says which
                error = StoreWriteError if is_refusal(exc) else StoreOutageError
                raise error(key, describe_failure(exc)) from exc

    def delete_under(self, prefix: str) -> None:
        """Delete every object under `prefix/` (a StoreWriteError naming the prefix where the store refuses or does
        not answer)."""
        try:
            # on this module's event loop, as every other request: with obstore 0.5.1, the blocking list made from
            # an ingest's thread took minutes to answer (a compare of 2 x 4 tensors on SeaweedFS: 213 s, here 2 s)
            asyncio.run_coroutine_threadsafe(self._delete_under(prefix), _event_loop()).result()
        except Exception as exc:
            error = StoreWriteError if is_refusal(exc) else StoreOutageError
            raise error(prefix, describe_failure(exc)) from exc

    def names_under(self, prefix: str) -> set[str]:
        """The names directly under `prefix/` (its arrays and groups: "0", "zarr.json"), in one listing; a
        StoreWriteError naming the prefix where the store refuses or does not answer (this is for writing there)."""
        try:
            return asyncio.run_coroutine_threadsafe(self._names_under(prefix), _event_loop()).result()
        except Exception as exc:
            error = StoreWriteError if is_refusal(exc) else StoreOutageError
            raise error(prefix, describe_failure(exc)) from exc

    async def _names_under(self, prefix: str) -> set[str]:
        import obstore

        found = await obstore.list_with_delimiter_async(self.bucket, prefix=f"{prefix}/")
        paths = [*found["common_prefixes"], *(item["path"] for item in found["objects"])]
        return {path.rstrip("/").rsplit("/", 1)[-1] for path in paths}

    async def _delete_under(self, prefix: str) -> None:
        import obstore

        items = await obstore.list(self.bucket, prefix=f"{prefix}/").collect_async()
        if items:
            await obstore.delete_async(self.bucket, [item["path"] for item in items])

    def layout(self, key: str) -> ArrayLayout:
        """The layout of the array at `key`, from its zarr.json object."""
        (text,) = self.fetch([f"{key}/zarr.json"])
        where = self.name(f"{key}/zarr.json")
        if text is None:
            raise FileNotFoundError(f"no array {key!r} in the store ({where} is missing)")
        return layout_of(bytes(text), where, key)


class ObjectChunkReader(ChunkReader):
    """A `ChunkReader` over the chunk objects of one array in object storage: `flat_pieces` gives their keys."""

    def __init__(
        self, layout: ArrayLayout, objects: ChunkObjects, key: str, counter: ReadCounter, open_array: Callable[[], Any]
    ) -> None:
        super().__init__(layout, Path(key), counter, open_array)
        self.objects = objects
        self._key = key
        self._kept: dict[str, Bytes] = {}  # fetched chunk objects by key, up to KEPT_BYTES, for a second read
        self._kept_bytes = 0
        self._kept_lock = threading.Lock()

    def __getitem__(self, region: tuple[slice, ...]) -> NDArray[Any]:
        found = self._within_one_chunk(region)
        return found if found is not None else super().__getitem__(region)

    def _present(self, path: Path) -> bool:
        return self.objects.fetch_range(str(path), 0, 1) is not None  # one byte: a HEAD's cost

    def _chunk_name(self, path: Path) -> str:
        return f"object {self.objects.name(str(path))}"

    def _within_one_chunk(self, region: tuple[slice, ...]) -> NDArray[Any] | None:
        """A region inside one raw chunk (a slice of a few values, most often), read from the bytes of the chunk
        object that it spans (one ranged GET: a 64-value window of a 1 MiB chunk fetches 256 bytes) where those are
        under half the chunk; None for any other region."""
        if not self.raw or len(region) != len(self.shape) or any(s.step not in (None, 1) for s in region):
            return None
        bounds = [s.indices(d)[:2] for s, d in zip(region, self.shape, strict=True)]
        if any(stop <= start for start, stop in bounds):
            return None
        coords = tuple(start // c for (start, _), c in zip(bounds, self.chunks, strict=True))
        if any((stop - 1) // c != i for (_, stop), c, i in zip(bounds, self.chunks, coords, strict=True)):
            return None
        inner = [(start - i * c, stop - i * c) for (start, stop), c, i in zip(bounds, self.chunks, coords, strict=True)]
        strides = [math.prod(self.chunks[axis + 1 :]) for axis in range(len(self.chunks))]  # in values, C order
        first = sum(lo * step for (lo, _), step in zip(inner, strides, strict=True))
        last = sum((hi - 1) * step for (_, hi), step in zip(inner, strides, strict=True))
        itemsize = self.dtype.itemsize
        start, end = first * itemsize, (last + 1) * itemsize
        if end - start > self._layout.chunk_bytes // 2:
            return None
        key = f"{self._key}/{self._layout.chunk_key(coords)}"
        data = self.objects.fetch_range(key, start, end)
        self.count_reads(1)
        shape = tuple(hi - lo for lo, hi in inner)
        if data is None:
            if self._layout.every_chunk_written:  # it was written: damage, not values
                raise missing_chunk(f"object {self.objects.name(key)}")
            return np.full(shape, self._fill, dtype=self.dtype)
        if len(data) != end - start:
            raise ValueError(
                f"chunk object {self.objects.name(key)} is not one raw chunk ({self._layout.chunk_bytes} bytes): "
                f"bytes {start} to {end} of it are {len(data)}"
            )
        values = np.frombuffer(memoryview(data), dtype=self.dtype)
        view = np.lib.stride_tricks.as_strided(values, shape, tuple(step * itemsize for step in strides))
        return np.array(view)

    def fetch_pieces(self, pieces: Sequence[tuple[bytes, int, int]]) -> Future[list[Bytes | None]]:
        """Start fetching the chunk objects of `flat_pieces`' pieces (those kept from a fetch before are not fetched
        again)."""
        return self._fetch([key.decode() for key, _, _ in pieces], keep=True)

    def _fetch(self, keys: list[str], keep: bool = False) -> Future[list[Bytes | None]]:
        """The objects at `keys`, as `ChunkObjects.submit` gives them: those this reader keeps at once, the others
        fetched; `keep`: and kept while there is room (what the compiled chunk loop fetches, for the second read of
        a failing pair; a slice's reads keep nothing)."""
        with self._kept_lock:
            found = [self._kept.get(key) for key in keys]
        missing = [key for key, data in zip(keys, found, strict=True) if data is None]
        if not missing:
            done: Future[list[Bytes | None]] = Future()
            done.set_result(list(found))
            return done
        fetching = self.objects.submit(missing)
        result: Future[list[Bytes | None]] = Future()

        def arrived(fetched: Future[list[Bytes | None]]) -> None:
            try:
                values = iter(fetched.result())
            except BaseException as exc:
                result.set_exception(exc)
                return
            merged = [data if data is not None else next(values) for data in found]
            if keep:
                with self._kept_lock:
                    for key, data in zip(keys, merged, strict=True):
                        if data is not None and key not in self._kept and self._kept_bytes + len(data) <= KEPT_BYTES:
                            self._kept[key] = data
                            self._kept_bytes += len(data)
            result.set_result(merged)

        fetching.add_done_callback(arrived)
        return result

    def _decoder(self, every: list[tuple[int, ...]]) -> Callable[[tuple[int, ...], NDArray[Any]], None]:
        """Decode from the region's chunk objects (decoded in the order of `every`), fetched `SLICE_BATCH` at a time,
        the next batch while the one before is decoded: a large region holds that many chunks' bytes, not all."""
        keys = [f"{self._key}/{self._layout.chunk_key(coords)}" for coords in every]
        batches = [(every[i : i + SLICE_BATCH], keys[i : i + SLICE_BATCH]) for i in range(0, len(every), SLICE_BATCH)]
        fetched: dict[tuple[int, ...], tuple[str, Bytes | None]] = {}  # the batch being decoded
        fetching = deque(self._fetch(batch_keys) for _, batch_keys in batches[:1])
        taken = 0  # batches decoded or being decoded

        def decode(coords: tuple[int, ...], into: NDArray[Any]) -> None:
            nonlocal taken
            if coords not in fetched:
                chunks, batch_keys = batches[taken]
                taken += 1
                if taken < len(batches):  # the next batch, fetched while this one is decoded
                    fetching.append(self._fetch(batches[taken][1]))
                fetched.clear()
                fetched.update(zip(chunks, zip(batch_keys, fetching.popleft().result(), strict=True), strict=True))
            key, data = fetched[coords]
            if data is None:
                if self._layout.every_chunk_written:  # it was written: damage, not values
                    raise missing_chunk(f"object {self.objects.name(key)}")
                into[...] = self._fill  # an array from before the marker: never written, the fill value
                return
            frame = memoryview(data)
            if not self.raw:
                decode_frame(frame, into, f"chunk object {self.objects.name(key)}")
            elif len(frame) != into.nbytes:
                raise ValueError(
                    f"chunk object {self.objects.name(key)} is not one raw chunk ({into.nbytes} bytes): "
                    f"it has {len(frame)}"
                )
            else:
                into.reshape(-1).view(np.uint8)[...] = np.frombuffer(frame, dtype=np.uint8)

        return decode
