"""What a `Lockstep` (`lockstep.py`) knows of each pair of same-named tensors: each side's tensor and the blocks it
keeps, the comparison set up for the pair, and how far it has been computed. Everything here is read and changed
under the `Lockstep`'s lock, but `LockstepPair.computing`, which one computation of the pair's blocks holds."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.compare.compute.chunk_loop import ChunkPairs
from tensor_debugger.engine.chunking import Region
from tensor_debugger.engine.fused import FusedPartial
from tensor_debugger.engine.logical_tensors import shard_of
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.engine.where import WhereAccumulator
from tensor_debugger.ingest.stored_sketches import CHUNKS_PER_BLOCK
from tensor_debugger.store.dtypes import LogicalDtype


@dataclass
class Kept:
    start: int  # flat C-order offsets of the block's values
    stop: int
    values: NDArray[Any]  # its bytes (uint8): the ingest's buffer until released, then a copy
    owned: bool  # `values` is a copy (reused for later copies once no block needs it)


@dataclass
class Half:
    """One side's tensor of a pair."""

    key: str
    shape: tuple[int, ...]
    dtype: LogicalDtype
    limit: int  # bytes of blocks kept (by the side, over all pairs) before it waits or gives the pair up
    upto: int = 0  # flat values handed over so far
    ended: bool = False
    kept: deque[Kept] = field(default_factory=deque)
    kept_bytes: int = 0


@dataclass(frozen=True)
class PairPlan:
    loop: ChunkPairs
    tolerance: Tolerance
    regions: tuple[tuple[int, int], ...]  # each pair block's flat [start, stop), in merge order
    where: tuple[Region, ...]  # the blocks `where.locate_error` reads (where_regions), in its order
    where_ranges: tuple[tuple[int, int], ...]  # their flat [start, stop)


@dataclass
class LockstepPair:
    halves: list[Half | None] = field(default_factory=lambda: [None, None])
    why: str | None = None  # why it is read back from the store instead; None while it may still be in memory
    plan: PairPlan | None = None
    done: int = 0  # pair blocks computed
    partials: dict[int, FusedPartial | None] = field(default_factory=dict)  # by the block's flat start
    where_done: int = 0  # blocks of `PairPlan.where` folded into `masses`
    masses: WhereAccumulator | None = None  # where the error is, should the pair fail
    computing: threading.Lock = field(default_factory=threading.Lock)
    replayed: bool = False
    told: bool = False  # handed to `take_found`


def untracked(name: str, shape: tuple[int, ...]) -> str | None:
    """Why a tensor is not compared in memory (its pair is read back from the store), or None."""
    if shard_of(name)[1] is not None:
        return "a shard of a tensor split across ranks"
    if not shape or 0 in shape:
        return "a 0-d or empty tensor"
    return None


def kept_limit(shape: tuple[int, ...], dtype: LogicalDtype, chunks: tuple[int, ...]) -> int:
    """Bytes of one side's blocks kept (over all its pairs) before the side ahead waits: two ingest blocks, no more
    than the writer holds (`WritePools.in_flight`: one per thread, two at least, beside the other run's ingest), so
    that what is kept is still the writer's (not copied)."""
    itemsize = dtype.numpy_storage.itemsize
    chunk = int(np.prod(chunks, dtype=np.int64)) * itemsize if chunks else itemsize
    return 2 * CHUNKS_PER_BLOCK * chunk


def finished(pair: LockstepPair) -> bool:
    """(under the lock) Whether every block of the pair was computed in memory, statistics and where."""
    plan = pair.plan
    if pair.why is not None or plan is None or pair.masses is None:
        return False
    return (pair.done, pair.where_done) == (len(plan.regions), len(plan.where))


def lent(half: Half, start: int, stop: int) -> Kept | None:
    """(under the lock) The kept block of flat values [start, stop) if it is still the ingest's buffer."""
    return next((k for k in half.kept if (k.start, k.stop) == (start, stop) and not k.owned), None)
