"""Arrays in object storage written as chunk files are: each chunk encoded in the ingest thread that holds its
block and uploaded at once, while the next chunk is encoded.

Through Zarr's `ObjectStore`, an array's creation was a listing, a deletion and a check and conditional write of
each parent group's zarr.json (about ten requests per tensor, one after another), and every chunk was encoded by
numcodecs on Zarr's event loop's threads and copied into a buffer of its own before its upload: on two cores that
machinery ran an ingest to SeaweedFS at 15-42 MB/s against 35-78 into a folder (bench/cluster.py). An
`ObjectChunkWriter` encodes the chunks as `ChunkWriter` does for files (the same bytes) and hands each to
`ChunkObjects.submit_put` (obstore's `put_async`, at most `PUTS_AT_ONCE` uploads in flight in the process, a
multipart upload for a chunk over obstore's 5 MB part size); a block's write returns once every one of its uploads
has settled (`start_write`'s future: the ingest thread that encoded the block goes on to other work meanwhile, and
the ingest settles the block when that future is done), so an ingest holds at most its blocks in flight in memory,
and a failed upload fails the block (and the run) only after its other uploads have finished: nothing of the block
is still being written when the run's arrays are deleted.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, wait
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.store.chunk_writer import ChunkWriter, chunk_view
from tensor_debugger.store.layout import group_document, parse_layout
from tensor_debugger.store.object_chunks import ChunkObjects


def metadata_bytes(document: dict[str, Any]) -> memoryview:
    """A zarr.json document's bytes, as Zarr writes them (indented)."""
    return memoryview(json.dumps(document, indent=2).encode())


class ObjectChunkWriter(ChunkWriter):
    """Writes chunk-aligned regions of the array at `key` of `objects` (see `ChunkWriter`)."""

    def __init__(self, document: dict[str, Any], objects: ChunkObjects, key: str) -> None:
        super().__init__(parse_layout(document), Path(key), direct=False)
        self.objects = objects
        self._key = key

    def __setitem__(self, region: tuple[slice, ...], values: NDArray[Any]) -> None:
        self.start_write(region, values).result()

    def start_write(self, region: tuple[slice, ...], values: NDArray[Any]) -> Future[None]:
        """Encode the chunks of `region` set to `values` in this thread and start uploading each at once; the future
        is done once every upload has settled (failed with the first failure, in chunk order), so that the thread
        that encodes need not wait for the uploads. `values` must not change until then."""
        puts: list[Future[None]] = []
        try:
            for coords, data, size in self.encoded(region, values):
                view = chunk_view(data)
                if size > len(view):  # a raw chunk short of its rows: the object holds the zeros a file's end gives
                    padded = np.zeros(size, dtype=np.uint8)
                    padded[: len(view)] = np.frombuffer(view, dtype=np.uint8)
                    view = memoryview(padded.data)
                puts.append(self.objects.submit_put(f"{self._key}/{self._layout.chunk_key(coords)}", view))
        except BaseException:
            wait(puts)  # settled, failed or not, before this raises
            raise
        return all_settled(puts)


def all_settled(futures: list[Future[None]]) -> Future[None]:
    """A future done once all of `futures` are: failed with the first of them that failed, else None."""
    settled: Future[None] = Future()
    left = [len(futures)]
    lock = threading.Lock()

    def one_done(_: Future[None]) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        failed = next((f.exception() for f in futures if f.exception() is not None), None)
        if failed is not None:
            settled.set_exception(failed)
        else:
            settled.set_result(None)

    if not futures:
        settled.set_result(None)
    for future in futures:
        future.add_done_callback(one_done)
    return settled


def create_object_array(
    objects: ChunkObjects,
    key: str,
    document: dict[str, Any],
    groups: set[PurePosixPath],
    present: set[str] | None = None,
) -> ObjectChunkWriter:
    """A new array at `key` described by `document` (its zarr.json), as Zarr's `create_array(overwrite=True)`
    makes one: whatever was under `key` deleted, the zarr.json of a group at each level above it that has none
    (`groups`: the levels known to have one, to which those written here are added), then its own zarr.json.
    `present`: the names known to be under `key`'s parent (its listing, kept by the caller): where `key`'s is not
    among them there is nothing to delete, and no listing is made (one request fewer per array of a run)."""
    if present is None or PurePosixPath(key).name in present:
        objects.delete_under(key)
    parent = PurePosixPath(key).parent
    levels = [parent, *parent.parents] if str(parent) != "." else [parent]
    missing = [level for level in levels if level not in groups]
    if missing:
        group = metadata_bytes(group_document())
        puts = [objects.submit_put(_zarr_json(level), group, create=True) for level in missing]
        wait(puts)
        for put in puts:
            put.result()
        groups.update(missing)
    objects.put(f"{key}/zarr.json", metadata_bytes(document))
    return ObjectChunkWriter(document, objects, key)


def _zarr_json(level: PurePosixPath) -> str:
    return "zarr.json" if str(level) == "." else f"{level}/zarr.json"
