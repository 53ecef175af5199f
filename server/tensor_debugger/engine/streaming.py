"""Compare aligned views in one streaming pass: blocks read and reduced in parallel, merged in order.

`compare_stream` takes pairs one after another as one stream of blocks: the next pair's first blocks are already
computing while the last blocks of the pair before finish, and taking the next pair from its iterable (which may
read a database, open arrays) happens while the pool works. Per-pair set-up and the drain at the end of each pair
then leave no core idle (measured: 4 to 8 ms per pair, 10% to 20% of a comparison of 64 MiB tensors).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from tensor_debugger.engine.chunking import Region, iter_blocks, plan_chunks
from tensor_debugger.engine.error_spans import ErrorSpan
from tensor_debugger.engine.fused import FusedPartial, Kernel, default_kernel
from tensor_debugger.engine.metrics import DEFAULT_TOP, PairStats
from tensor_debugger.engine.pair_accumulator import PairAccumulator
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.engine.views import View
from tensor_debugger.engine.where import locate_error

log = logging.getLogger(__name__)
BLOCK_BYTES = 8 * 1024 * 1024  # of float64 per side: about 1M elements, 4 stored float32 chunks: short drains
# between pairs (measured: 4M-element blocks left a core idle while the last block of each pair finished)
# A pair whose blocks are reduced straight from storage (`PairJob.reduce`) holds no block in memory: its blocks are
# larger, so that the Python around each (submitting, merging) costs less (measured: 7% of the CPU time with blocks of
# 1M elements)
REDUCED_BLOCK_BYTES = 4 * BLOCK_BYTES
TICK_SECONDS = 0.1  # how often `on_tick` is called while a block is awaited

Key = TypeVar("Key")
# A block's statistics computed straight from storage (compare/chunk_loop), or None to read the block through the views
Reduce = Callable[[Region, Tolerance], FusedPartial | None]


@dataclass(frozen=True)
class PairJob(Generic[Key]):
    """One pair to compare: `key` comes back with its result, so that a caller can tell the results apart."""

    key: Key
    a: View
    b: View
    tolerance: Tolerance
    exact: bool  # integers and bools: any difference is a mismatch
    reduce: Reduce | None = None  # tried first for every block
    top: int = DEFAULT_TOP  # worst elements kept (the reducer keeps as many)
    kernel: Kernel | None = None  # the statistics path (CompareContext.kernel); None: fused.default_kernel
    # where a failing pair's error is, as computed elsewhere from the same blocks (compare/compute/lockstep.py);
    # None: `locate_error` reads the views again
    spans: Callable[[], list[ErrorSpan]] | None = None

    def accumulator(self) -> PairAccumulator:
        """An empty accumulator of this job's statistics."""
        return PairAccumulator(self.tolerance, self.exact, self.top, self.kernel)


@dataclass
class _Running(Generic[Key]):
    job: PairJob[Key]
    total: PairAccumulator
    blocks: int = 0  # submitted and not yet merged
    submitted: bool = False  # every block of the pair has been submitted
    error: Exception | None = None

    def work(self, region: Region) -> PairAccumulator:
        if self.error is not None:  # an earlier block failed: this one's result would be thrown away
            return self.job.accumulator()
        return compare_block(self.job, region)


def compare_block(job: PairJob[Key], region: Region) -> PairAccumulator:
    """The partial statistics of one block of a pair (one region of `pair_blocks`): what `compare_stream` merges,
    in block order, into the pair's statistics. A Dask worker computes a big pair's blocks with it
    (compare/compute/dask_pairs.py), so that merging them in the same order gives the same statistics."""
    part = job.accumulator()
    origin = tuple(s.start for s in region)
    if job.reduce is None:
        part.add(job.a.read(region), job.b.read(region), origin, job.a.shape)
        return part
    block_shape = tuple(s.stop - s.start for s in region)
    fused = job.reduce(region, job.tolerance)
    if fused is not None and part.add_fused(fused, origin, block_shape, job.a.shape):
        return part
    # Not finished from storage: read into arrays, in blocks of the usual size (this one is larger)
    for inner in iter_blocks(plan_chunks(block_shape, 8, BLOCK_BYTES), 1):
        sub = tuple(slice(o + s.start, o + s.stop) for o, s in zip(origin, inner, strict=True))
        part.add(job.a.read(sub), job.b.read(sub), tuple(s.start for s in sub), job.a.shape)
    return part


def compare_stream(
    jobs: Iterable[PairJob[Key]],
    pool: ThreadPoolExecutor,
    in_flight: int | None = None,
    on_tick: Callable[[], None] | None = None,
) -> Iterator[tuple[Key, PairStats | Exception]]:
    """Exact statistics of every job's two views, yielded in the jobs' order: `(key, stats)`, or `(key, error)`
    where reading or comparing failed (a missing array, a corrupt chunk, views of different shapes). At most
    `in_flight` blocks are submitted at once (one more is being read), whatever the number and size of the pairs;
    by default one more than the pool's threads: every thread busy and one block ready for the first to free. A
    pair whose block failed submits no more blocks. Blocks are merged in their order, so the statistics are the
    same whatever the number of threads. `on_tick` is called after every block and every
    `TICK_SECONDS` while one is awaited, so that a caller can write what it has (yielded results) on time."""
    if in_flight is None:
        in_flight = pool_threads(pool) + 1
    pending: deque[tuple[_Running[Key], Future[PairAccumulator]]] = deque()
    running: deque[_Running[Key]] = deque()

    def settle() -> None:
        state, future = pending.popleft()
        if on_tick is not None:
            while not wait([future], timeout=TICK_SECONDS).done:
                on_tick()
        state.blocks -= 1
        try:
            part = future.result()
        except Exception as exc:  # the pair fails; its other blocks are still merged away, unused
            state.error = state.error or exc
            return
        if state.error is None:
            state.total.merge(part)
        if on_tick is not None:
            on_tick()

    def finished() -> Iterator[tuple[Key, PairStats | Exception]]:
        while running and running[0].submitted and running[0].blocks == 0:
            state = running.popleft()
            yield (
                state.job.key,
                state.error if state.error is not None else located(state.job, state.total.result(), pool),
            )

    for job in jobs:  # taking the next job runs the caller's set-up while the pool computes
        state = _Running(job, job.accumulator())
        running.append(state)
        for region in _regions(job, state):
            if state.error is not None:  # a block failed: the pair's result is that error, read no more
                break
            pending.append((state, pool.submit(state.work, region)))
            state.blocks += 1
            while len(pending) > in_flight:
                settle()
                yield from finished()
        state.submitted = True
        yield from finished()
    while pending:
        settle()
        yield from finished()
    yield from finished()


def located(job: PairJob[Key], stats: PairStats, pool: Executor | None) -> PairStats:
    """`stats` of a failing pair with where inside it the error is (engine/where.py: a second read of its blocks,
    for failing pairs only); a passing pair's as they are. A block that cannot be read now leaves `where` unknown
    (None): the statistics, read once already, stand."""
    if stats.passed:
        return stats
    try:
        spans = (
            job.spans() if job.spans is not None else locate_error(job.a, job.b, pool, job.kernel or default_kernel())
        )
    except Exception:
        log.exception("could not locate the error of a failing pair; its statistics stand without `where`")
        return stats
    return replace(stats, where=spans)


def pool_threads(pool: ThreadPoolExecutor) -> int:
    """The most threads `pool` runs at once (the size it was made with)."""
    return int(pool._max_workers)


def _regions(job: PairJob[Key], state: _Running[Key]) -> Iterator[Region]:
    try:
        return pair_blocks(job)
    except ValueError as exc:
        state.error = exc
        return iter(())


def pair_blocks(job: PairJob[Key]) -> Iterator[Region]:
    """The blocks of a job's aligned shape, in the order their statistics are merged (one empty region for a 0-d
    pair); ValueError where the views differ in shape."""
    if job.a.shape != job.b.shape:
        raise ValueError(f"views differ in shape: {list(job.a.shape)} and {list(job.b.shape)}")
    if not job.a.shape:
        return iter([()])
    return iter_blocks(plan_chunks(job.a.shape, 8, BLOCK_BYTES if job.reduce is None else REDUCED_BLOCK_BYTES), 1)


def compare_views(
    a: View,
    b: View,
    tolerance: Tolerance,
    exact: bool,
    pool: ThreadPoolExecutor,
    in_flight: int | None = None,
    top: int = DEFAULT_TOP,
    kernel: Kernel | None = None,
) -> PairStats:
    """Exact statistics over every element of two views of the same shape (one pair of `compare_stream`);
    raises what reading or comparing raised."""
    ((_, result),) = compare_stream([PairJob(None, a, b, tolerance, exact, None, top, kernel)], pool, in_flight)
    if isinstance(result, Exception):
        raise result
    return result
