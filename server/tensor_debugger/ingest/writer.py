"""Copy one tensor into the array store block by block, hashing and summarising it on the way."""

from __future__ import annotations

import hashlib
import json
import math
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np

from tensor_debugger.engine.chunking import Region, iter_blocks, plan_chunks
from tensor_debugger.ingest.summary import SummaryAccumulator, TensorSummary
from tensor_debugger.ingest.tensor_files import Leaf
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.dtypes import LogicalDtype

CHUNKS_PER_BLOCK = 16  # one store write covers this many chunks: fewer, larger writes run faster


@dataclass(frozen=True)
class StoredTensor:
    store_key: str
    shape: tuple[int, ...]
    dtype: LogicalDtype
    nbytes: int
    digest: str  # "sha256:<hex>" of dtype, shape and C-order bytes
    summary: TensorSummary


def digest_header(dtype: LogicalDtype, shape: tuple[int, ...]) -> bytes:
    return json.dumps({"dtype": dtype.name, "shape": list(shape)}).encode() + b"\0"


@dataclass(frozen=True)
class WritePools:
    """Threads an ingest shares: one hashes and summarises blocks in order, the others write to the store."""

    hashing: ThreadPoolExecutor
    writing: ThreadPoolExecutor
    in_flight: int  # blocks being written at once (two keep both compression and the disk busy)

    @classmethod
    def open(cls, writers: int = 2) -> WritePools:
        return cls(ThreadPoolExecutor(1, thread_name_prefix="ingest-hash"),
                   ThreadPoolExecutor(writers, thread_name_prefix="ingest-write"), writers)

    def close(self) -> None:
        self.hashing.shutdown()
        self.writing.shutdown()


def write_leaf(
    store: ArrayStore,
    key: str,
    leaf: Leaf,
    chunk_bytes: int,
    pools: WritePools,
    on_bytes: Callable[[int], None] | None = None,
) -> StoredTensor:
    """Store `leaf` at `key`. Blocks are read one at a time; each is hashed and summarised (in order, on one
    thread) while up to `pools.in_flight` blocks are written, so memory stays at a few blocks whatever the
    tensor's size."""
    layout = plan_chunks(leaf.shape, leaf.dtype.itemsize, chunk_bytes)
    array = store.writer(key, leaf.shape, leaf.dtype, layout.chunks)
    hasher = hashlib.sha256(digest_header(leaf.dtype, leaf.shape))
    summary = SummaryAccumulator()
    in_flight: deque[tuple[Future[None], Future[None], Region]] = deque()

    def account(block: np.ndarray) -> None:
        hasher.update(block.reshape(-1).view(np.uint8).data)
        summary.add_stored(block, leaf.dtype)

    def store_block(region: Region, block: np.ndarray) -> None:
        array[region if region else ()] = block

    def settle() -> None:
        written, accounted, region = in_flight.popleft()
        written.result()
        accounted.result()
        leaf.reader.done(region)  # only now may its pages go: nothing touches the block any more

    try:
        for region in iter_blocks(layout, CHUNKS_PER_BLOCK):
            block = leaf.reader.read(region)  # may be a view of a memory-mapped file
            in_flight.append((pools.writing.submit(store_block, region, block), pools.hashing.submit(account, block),
                              region))
            if on_bytes is not None:
                on_bytes(block.nbytes)
            while len(in_flight) > pools.in_flight:
                settle()
        while in_flight:
            settle()
    finally:
        for written, accounted, _ in in_flight:  # a failure midway: let nothing run on after we return
            written.cancel()
            accounted.cancel()
            wait([written, accounted])
    nbytes = math.prod(leaf.shape) * leaf.dtype.itemsize
    return StoredTensor(key, leaf.shape, leaf.dtype, nbytes, "sha256:" + hasher.hexdigest(), summary.result())
