"""Copy one tensor into the array store block by block, hashing and summarising it on the way."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from tensor_debugger.chunking import iter_blocks, plan_chunks
from tensor_debugger.dtypes import LogicalDtype, storage_to_compute
from tensor_debugger.store import ArrayStore
from tensor_debugger.summary import SummaryAccumulator, TensorSummary
from tensor_debugger.tensor_files import Leaf

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


def write_leaf(
    store: ArrayStore,
    key: str,
    leaf: Leaf,
    chunk_bytes: int,
    pool: ThreadPoolExecutor,
    on_bytes: Callable[[int], None] | None = None,
) -> StoredTensor:
    """Store `leaf` at `key`. Reads one block at a time; while the store writes a block, another thread
    hashes and summarises it, so memory stays at a few blocks whatever the tensor's size."""
    layout = plan_chunks(leaf.shape, leaf.dtype.itemsize, chunk_bytes)
    array = store.create(key, leaf.shape, leaf.dtype, layout.chunks)
    hasher = hashlib.sha256(digest_header(leaf.dtype, leaf.shape))
    summary = SummaryAccumulator()
    pending: Future[None] | None = None

    def account(block: np.ndarray) -> None:
        hasher.update(block.reshape(-1).view(np.uint8).data)
        summary.add(storage_to_compute(block, leaf.dtype))

    for region in iter_blocks(layout, CHUNKS_PER_BLOCK):
        block = leaf.reader.read(region)
        if pending is not None:
            pending.result()  # blocks are hashed in order
        pending = pool.submit(account, block)
        array[region if region else ()] = block
        leaf.reader.done(region)
        if on_bytes is not None:
            on_bytes(block.nbytes)
    if pending is not None:
        pending.result()
    nbytes = math.prod(leaf.shape) * leaf.dtype.itemsize
    return StoredTensor(key, leaf.shape, leaf.dtype, nbytes, "sha256:" + hasher.hexdigest(), summary.result())
