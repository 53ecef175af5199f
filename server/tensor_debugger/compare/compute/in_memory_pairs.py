"""A pair compared from the blocks in memory (`lockstep.py`), as a value another process can be sent, and the
job that takes its blocks' statistics from it (`replay`) in place of reading the stored copy."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tensor_debugger.compare.compute.chunk_loop import ChunkPairs
from tensor_debugger.compare.compute.pending import PendingPair
from tensor_debugger.engine.chunking import Region
from tensor_debugger.engine.fused import FusedPartial, Kernel
from tensor_debugger.engine.streaming import PairJob, pair_blocks
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.engine.where import WhereAccumulator


@dataclass(frozen=True)
class InMemoryPair:
    """A pair compared from the blocks in memory, as a value another process can be sent (an upload's ingests run
    in a child process: `ingest/child.py`): the comparison it was computed as (the chunk loop, its kernel, the
    tolerance, the pair blocks' flat ranges), each block's statistics by its flat start (None: read from the store)
    and where the error is (`engine/where.py`)."""

    loop: tuple[object, ...]  # `loop_key`
    kernel: Kernel
    tolerance: Tolerance
    regions: tuple[tuple[int, int], ...]
    partials: dict[int, FusedPartial | None]
    masses: WhereAccumulator


def replay(found: InMemoryPair, job: PairJob[PendingPair]) -> PairJob[PendingPair] | None:
    """`job` with its blocks' statistics and where its error is taken from `found`, or None where `job` is not the
    comparison `found` was computed as (another alignment, tolerance, kernel or chunk layout): the same
    `compare_block` and merge as reading the stored copy, so the same result."""
    loop = job.reduce
    if (
        not isinstance(loop, ChunkPairs)
        or job.tolerance != found.tolerance
        or job.kernel != found.kernel
        or loop_key(loop) != found.loop
        or tuple(loop.flat_range(r) for r in pair_blocks(job)) != found.regions
    ):
        return None
    return replace(job, reduce=_Replay(loop, dict(found.partials)), spans=found.masses.spans)


def from_memory_only(job: PairJob[PendingPair]) -> bool:
    """Whether a job `replay` gave takes every block's statistics from memory, so that computing it reads nothing of
    the stored copies."""
    reduce = job.reduce
    if not isinstance(reduce, _Replay):
        return False
    return all(reduce.holds(region) for region in pair_blocks(job))


def loop_key(loop: ChunkPairs) -> tuple[object, ...]:
    """What makes two chunk loops of a pair compute the same statistics, but the kernel's address (one process's):
    the kernel itself is compared instead (`InMemoryPair.kernel`)."""
    return (loop.codes, loop.shape, loop.top, loop.a.chunks, loop.b.chunks)


class _Replay:
    """A job's `reduce` that gives each block's statistics as computed in memory (a copy: folding may not change
    them); None (the block is read through the views) where the loop did not finish it there."""

    def __init__(self, loop: ChunkPairs, partials: dict[int, FusedPartial | None]) -> None:
        self._loop = loop
        self._partials = partials

    def holds(self, region: Region) -> bool:
        """Whether the block of `region` was computed in memory."""
        return self._partials.get(self._loop.flat_range(region)[0]) is not None

    def __call__(self, region: Region, tolerance: Tolerance) -> FusedPartial | None:
        partial = self._partials.get(self._loop.flat_range(region)[0])
        if partial is None:
            return None
        return type(partial).from_buffer_copy(partial)
