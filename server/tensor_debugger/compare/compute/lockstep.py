"""Two runs ingested at once, compared from the bytes as they are read: each pair's statistics come from the blocks
the ingests read for storing (`ingest/taps.py`), and its stored copy is not read back for them.

`compare A B` ingests both runs at once (`compare/pipeline.py`; with more runs, `compare A B C` or `--noise`, the
reference's blocks go to a `Lockstep` per other run: `ingest/taps.EveryTap`), and so does an upload of a reference
and a candidate, in one child process that sends what is computed here to the server (`sent_pairs.py`: `take_found`
and `replay`). Each run's ingest hands this `Lockstep` every tensor's blocks as it reads them; the tensors of the
same name on both sides (the guess early comparisons make: `early.guess`) are a pair, and once both sides have
handed the values of one of the pair's blocks (the regions `engine/streaming.pair_blocks` cuts, in order), that
block's statistics are computed by the compiled chunk loop from the values in memory (`ChunkPairs.in_memory`: the
same kernel calls over the same stretches as reading the chunk files). When the pair's tensors are stored,
`early_uploads.SessionComparisons` guesses the pair as always and its job's blocks are taken from what was computed
here (`replayed`): the same `compare_block` and merge, so the same statistics, cache key and result row as reading
the stored copy. Where inside a failing pair the error is (`engine/where.py`) is computed from the same blocks in
memory too, for every pair (which fails is known only at its end), in `where_regions` order (`PairJob.spans`).

Memory stays bounded: a side keeps its blocks only until the other side has handed the same values. The side ahead
keeps about two ingest blocks (`_limit`) over all its pairs together, whatever the sizes and the number of its
tensors, then waits, but only while the other run is reading the same tensor or one the side ahead has finished (it
catches up), so that the two never wait for each other; otherwise the pair is given up: its blocks are dropped and
it is compared from the stored copy, as before. A side level with the other or behind never waits: what it hands
over is released as soon as a pair block is complete (the two take turns ahead within a pair block larger than the
limit). A kept block is the ingest's own buffer while the ingest writes it (`TensorTap.release`: the writer holds
its last few, `WritePools.in_flight`); when the ingest takes it back, the side ahead waits for the other to compare
it where the other catches up (`_may_hold`), and copies it only otherwise, so that in step no block is copied.
`most_kept` says the most bytes each side kept at once, `copied` the bytes copied.

Also compared from the stored copy: pairs the loop does not serve (integers and bools, ULP tolerances, shapes that
differ, shards of a tensor split across ranks, a 0-d or empty tensor), a name met twice in one run, a file that
fails, a block with a NaN or an Inf (only that block is read back). `counts` says how many pairs were compared each
way, and why not.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.compare.compute.chunk_loop import ChunkPairs, Pieces, chunk_pairs
from tensor_debugger.compare.compute.in_memory_pairs import InMemoryPair, loop_key, replay
from tensor_debugger.compare.compute.pending import PendingPair
from tensor_debugger.compare.context import CompareContext
from tensor_debugger.compare.planning.sides import aligned_views, tolerance
from tensor_debugger.engine.alignment import align
from tensor_debugger.engine.chunking import Region, region_flat_range
from tensor_debugger.engine.fused import FusedPartial
from tensor_debugger.engine.logical_tensors import shard_of
from tensor_debugger.engine.streaming import PairJob, pair_blocks
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.engine.where import WhereAccumulator, block_masses, where_regions
from tensor_debugger.ingest.stored_sketches import CHUNKS_PER_BLOCK
from tensor_debugger.ingest.taps import RunTap, TensorTap
from tensor_debugger.store.chunk_reader import ChunkReader
from tensor_debugger.store.dtypes import LogicalDtype, storage_to_compute
from tensor_debugger.store.models import SessionRecord, TensorRecord

SPARE_BUFFERS = 2  # block copies kept for reuse


@dataclass(frozen=True)
class LockstepCounts:
    """Pairs compared from the blocks in memory, and those read back from the store, by why."""

    in_memory: int
    read_back: dict[str, int]
    most_kept: int = 0  # the most bytes of blocks one side kept at once (0: not told, as by an upload's child)
    copied: int = 0  # bytes of blocks copied


@dataclass
class _Kept:
    start: int  # flat C-order offsets of the block's values
    stop: int
    values: NDArray[Any]  # its bytes (uint8): the ingest's buffer until released, then a copy
    owned: bool  # `values` is a copy (reused for later copies once no block needs it)


@dataclass
class _Half:
    """One side's tensor of a pair."""

    key: str
    shape: tuple[int, ...]
    dtype: LogicalDtype
    limit: int  # bytes of blocks kept (by the side, over all pairs) before it waits or gives the pair up
    upto: int = 0  # flat values handed over so far
    ended: bool = False
    kept: deque[_Kept] = field(default_factory=deque)
    kept_bytes: int = 0


@dataclass(frozen=True)
class _Plan:
    loop: ChunkPairs
    tolerance: Tolerance
    regions: tuple[tuple[int, int], ...]  # each pair block's flat [start, stop), in merge order
    where: tuple[Region, ...]  # the blocks `where.locate_error` reads (where_regions), in its order
    where_ranges: tuple[tuple[int, int], ...]  # their flat [start, stop)


@dataclass
class _Pair:
    halves: list[_Half | None] = field(default_factory=lambda: [None, None])
    why: str | None = None  # why it is read back from the store instead; None while it may still be in memory
    plan: _Plan | None = None
    done: int = 0  # pair blocks computed
    partials: dict[int, FusedPartial | None] = field(default_factory=dict)  # by the block's flat start
    where_done: int = 0  # blocks of `_Plan.where` folded into `masses`
    masses: WhereAccumulator | None = None  # where the error is, should the pair fail
    computing: threading.Lock = field(default_factory=threading.Lock)
    replayed: bool = False
    told: bool = False  # handed to `take_found`


class Lockstep:
    """The taps of a reference run (side 0) and a candidate run (side 1) ingested at once, comparing same-named
    tensors from their blocks in memory; `replayed` hands the statistics to the early comparisons' jobs."""

    def __init__(self, context: CompareContext, session: SessionRecord, runs: tuple[int, int]) -> None:
        self._context = context
        self._session = session
        self.runs = runs  # (reference run id, candidate run id)
        self._changed = threading.Condition()
        self._pairs: dict[str, _Pair] = {}
        self._current: list[_Pair | None] = [None, None]  # the tensor each side reads now (or read last)
        self._closed = [False, False]
        self._spare: list[NDArray[Any]] = []  # copies no block needs any more, for the next blocks
        self._kept = [0, 0]  # bytes of block copies each side keeps, over all its pairs
        self.most_kept = [0, 0]  # the most of them at once
        self.copied = 0  # bytes of blocks copied (kept after the ingest released them, or not C-contiguous)
        self._waiting = [False, False]  # a side waits in `put` for the other to catch up
        self._holding = [False, False]  # a side waits in `release` for the other to compare the block it lent
        self._let_go = [False, False]  # the other side would wait in `put`: stop holding, copy

    def tap(self, side: int) -> RunTap:
        return _RunTap(self, side)

    # -- the ingests' side

    def begin(
        self, side: int, name: str, key: str, shape: tuple[int, ...], dtype: LogicalDtype, chunks: tuple[int, ...]
    ) -> TensorTap | None:
        half = _Half(key, shape, dtype, _limit(shape, dtype, chunks))
        with self._changed:
            pair = self._pairs.setdefault(name, _Pair())
            self._current[side] = pair
            self._changed.notify_all()
            if pair.halves[side] is not None:
                self._give_up(pair, "a name met twice in one run")
                return None
            pair.halves[side] = half
            why = _untracked(name, shape)
            if why is not None:
                self._give_up(pair, why)
            elif self._closed[1 - side] and pair.halves[1 - side] is None:
                self._give_up(pair, "the other run's ingest read no tensor of that name")
            if pair.why is not None:
                return None
            both = all(h is not None for h in pair.halves)
        if both:
            self._plan(pair)
        return _TensorTap(self, pair, side)

    def put(self, pair: _Pair, side: int, region: Region, block: NDArray[Any]) -> None:
        half = pair.halves[side]
        assert half is not None
        start, stop = region_flat_range(half.shape, region)
        with self._changed:
            if pair.why is not None:
                return
        owned = not block.flags.c_contiguous
        if owned:
            values = self._buffer(block.nbytes)
            values[:] = np.ascontiguousarray(block).reshape(-1).view(np.uint8)
        else:  # lent until `release`
            values = block.reshape(-1).view(np.uint8)
        with self._changed:
            while pair.why is None and self._kept[side] >= half.limit and self._ahead(pair, side):
                if not self._may_wait(pair, side):
                    self._give_up(pair, "one run was far ahead of the other")
                    break
                if self._holding[1 - side]:  # the other waits in `release`: it copies and goes on instead
                    self._let_go[1 - side] = True
                    self._changed.notify_all()
                self._waiting[side] = True
                self._changed.wait()
            self._waiting[side] = False
            if pair.why is not None:
                return
            if owned:
                self.copied += values.nbytes
            half.kept.append(_Kept(start, stop, values, owned))
            half.kept_bytes += values.nbytes
            self._kept[side] += values.nbytes
            self.most_kept[side] = max(self.most_kept[side], self._kept[side])
            half.upto = stop
            self._changed.notify_all()
        self._compute(pair)

    def _buffer(self, nbytes: int) -> NDArray[Any]:
        """`nbytes` bytes for a block's copy: a spare one where one is large enough (new memory costs a page fault
        per 4 KiB on first touch), else new."""
        with self._changed:
            fitting = [n for n, spare in enumerate(self._spare) if spare.size >= nbytes]
            found = self._spare.pop(fitting[0]) if fitting else None
        return found[:nbytes] if found is not None else np.empty(nbytes, dtype=np.uint8)

    def release(self, pair: _Pair, side: int, region: Region) -> None:
        """The ingest takes back the block of `region` it lent. While the other side catches up and will compare it
        without more of this side's values, wait for that (`_may_hold`); then wait for a computation that may read
        it, and copy its values if they are still kept."""
        half = pair.halves[side]
        assert half is not None
        start, stop = region_flat_range(half.shape, region)
        with self._changed:
            while (kept := _lent(half, start, stop)) is not None and self._may_hold(pair, side, kept):
                self._holding[side] = True
                self._changed.wait()
            self._holding[side] = self._let_go[side] = False
        with pair.computing:  # no block of the pair is being computed: none reads the lent buffer now
            with self._changed:
                kept = _lent(half, start, stop)
            if kept is None:
                return
            copy = self._buffer(kept.values.nbytes)
            copy[:] = kept.values
            with self._changed:
                kept.values, kept.owned = copy, True
                self.copied += copy.nbytes

    def end(self, pair: _Pair, side: int, complete: bool) -> None:
        with self._changed:
            half = pair.halves[side]
            assert half is not None
            half.ended = True
            if not complete:
                self._give_up(pair, "its file could not be read to the end")
            self._changed.notify_all()

    def close(self, side: int) -> None:
        """Side `side`'s ingest is over: pairs it never began or did not finish are read back from the store."""
        with self._changed:
            self._closed[side] = True
            self._current[side] = None
            for pair in self._pairs.values():
                half = pair.halves[side]
                if half is None:
                    self._give_up(pair, "the other run's ingest read no tensor of that name")
                elif not half.ended:
                    self._give_up(pair, "its ingest stopped")
            self._changed.notify_all()

    # -- the comparisons' side

    def replayed(self, name: str, job: PairJob[PendingPair]) -> PairJob[PendingPair] | None:
        """`job` (the early comparison of the pair `name`, guessed from the two stored tensors) with its blocks'
        statistics taken from those computed in memory, or None where the pair must be read from the store (given
        up, or the job is not the one computed here: another alignment, tolerance or chunk layout)."""
        with self._changed:
            pair = self._pairs.get(name)
            if pair is None:
                return None
            if not _finished(pair):
                if pair.why is None:
                    pair.why = "not finished in memory"
                return None
            found = self._found(pair)
        replayed = replay(found, job)
        with self._changed:
            if replayed is None:
                pair.why = "compared otherwise than guessed"
            else:
                pair.replayed = True
        return replayed

    def take_found(self) -> list[tuple[str, InMemoryPair | str]]:
        """What is new since the last call, for a comparison in another process (`compute/sent_pairs.py`): the
        pairs finished in memory; once both ingests are closed, every other pair of two tensors too, with why it is
        read back from the store. Each pair is told once."""
        with self._changed:
            closed = all(self._closed)
            found: list[tuple[str, InMemoryPair | str]] = []
            for name, pair in self._pairs.items():
                if pair.told or not all(h is not None for h in pair.halves):
                    continue
                if _finished(pair):
                    found.append((name, self._found(pair)))
                elif closed:
                    found.append((name, pair.why or "not finished in memory"))
                else:
                    continue
                pair.told = True
            return found

    def counts(self) -> LockstepCounts:
        with self._changed:
            read_back: Counter[str] = Counter()
            in_memory = 0
            for pair in self._pairs.values():
                if pair.replayed:
                    in_memory += 1
                elif all(h is not None for h in pair.halves):
                    read_back[pair.why or "not compared early"] += 1
            return LockstepCounts(in_memory, dict(read_back), max(self.most_kept), self.copied)

    # -- under the hood

    def _found(self, pair: _Pair) -> InMemoryPair:
        """(under the lock) A finished pair's statistics, as a value (`_finished`)."""
        plan, masses = pair.plan, pair.masses
        assert plan is not None and masses is not None
        loop = plan.loop
        return InMemoryPair(
            loop_key(loop), self._context.kernel, plan.tolerance, plan.regions, dict(pair.partials), masses
        )

    def _ahead(self, pair: _Pair, side: int) -> bool:
        """(under the lock) Whether this side has handed more of the pair's values than the other: only then may it
        wait for the other. A side level with the other or behind never waits (within a pair block larger than the
        limit, the two take turns ahead), so that the two never wait for each other."""
        other, half = pair.halves[1 - side], pair.halves[side]
        assert half is not None
        return other is None or other.upto < half.upto

    def _may_hold(self, pair: _Pair, side: int, kept: _Kept) -> bool:
        """(under the lock) Whether `release` may wait for the other side to compare the lent block `kept` rather
        than copy it: the other side catches up (`_may_wait`; it may not have begun the tensor yet) and needs no more
        of this side's values for the blocks that read it, and neither side waits otherwise (no two waits on each
        other: a side about to wait in `put` ends this one, `_let_go`)."""
        other, plan, half = pair.halves[1 - side], pair.plan, pair.halves[side]
        assert half is not None
        if self._let_go[side] or self._waiting[1 - side] or self._holding[1 - side]:
            return False
        if pair.why is not None or (other is not None and other.ended) or not self._may_wait(pair, side):
            return False
        if other is None or plan is None:  # not planned yet: every value of this side is needed
            return half.ended
        needed = max(
            (stop for start, stop in (*plan.regions, *plan.where_ranges) if start < kept.stop and stop > kept.start),
            default=0,
        )
        return half.upto >= needed

    def _may_wait(self, pair: _Pair, side: int) -> bool:
        """Whether the side ahead may wait for the other (under the lock): the other reads this pair's tensor, or
        one that this side has finished (it catches up), or has not begun its first (it unpacks its archives). Then
        the other never waits for this side."""
        if self._closed[1 - side]:
            return False
        other = self._current[1 - side]
        if other is None or other is pair:
            return True
        mine = other.halves[side] if other is not None else None
        return mine is not None and mine.ended

    def _give_up(self, pair: _Pair, why: str) -> None:
        """(under the lock) Read the pair back from the store: drop what is kept."""
        if pair.why is None:
            pair.why = why
        for side, half in enumerate(pair.halves):
            if half is not None:
                half.kept.clear()
                self._kept[side] -= half.kept_bytes
                half.kept_bytes = 0
        self._changed.notify_all()

    def _plan(self, pair: _Pair) -> None:
        """Set up the pair once both its tensors are begun: the chunk loop as `early.guess` makes it."""
        a, b = pair.halves
        assert a is not None and b is not None
        why: str | None = None
        plan: _Plan | None = None
        try:
            plan = self._planned(a, b)
        except Exception as exc:  # the pair is simply read from the store, where it says what is wrong
            why = f"could not be set up in memory ({type(exc).__name__})"
        if plan is None and why is None:
            why = "not read by the chunk loop (integers, bools, ULPs or shapes that differ)"
        with self._changed:
            if why is not None:
                self._give_up(pair, why)
                return
            pair.plan = plan
            self._changed.notify_all()
        self._compute(pair)

    def _planned(self, a: _Half, b: _Half) -> _Plan | None:
        if a.shape != b.shape:
            return None
        alignment = align([a.shape], [b.shape])
        if alignment is None:
            return None
        steps = alignment.to_json()
        tol, exact = tolerance(self._session, a.dtype.name, b.dtype.name)
        if tol.ulp or exact:
            return None
        rows = [_record(h) for h in (a, b)]
        view_a, view_b, _ = aligned_views(self._context.store, steps, rows[:1], rows[1:])
        top, kernel = self._context.top, self._context.kernel
        loop = chunk_pairs(view_a, view_b, exact, top, kernel)
        if loop is None:
            return None
        job = PairJob(None, view_a, view_b, tol, exact, loop, top, kernel)
        regions = tuple(loop.flat_range(r) for r in pair_blocks(job))
        where = tuple(where_regions(loop.shape))
        return _Plan(loop, tol, regions, where, tuple(loop.flat_range(r) for r in where))

    def _compute(self, pair: _Pair) -> None:
        """Compute, in order, every pair block whose values both sides have handed over (its statistics), and
        every block of `where.locate_error` (where the error is, should the pair fail: the squared differences per
        index of each dimension), and drop what no later block needs."""
        with pair.computing:
            while True:
                with self._changed:
                    task = self._next_task(pair)
                if task is None:
                    return
                self._run(pair, *task)

    def _next_task(self, pair: _Pair) -> tuple[str, int, int, list[Any]] | None:
        """(under the lock) The next block to compute, the one that ends first: ("stats" or "where", its flat
        range, and what it reads of the kept blocks), or None while none has both sides' values."""
        plan = pair.plan
        if pair.why is not None or plan is None:
            return None
        halves = [h for h in pair.halves if h is not None]
        upto = min(h.upto for h in halves)
        tasks: list[tuple[int, str, int]] = []
        if pair.done < len(plan.regions):
            tasks.append((plan.regions[pair.done][1], "stats", plan.regions[pair.done][0]))
        if pair.where_done < len(plan.where):
            start, stop = plan.where_ranges[pair.where_done]
            tasks.append((stop, "where", start))
        if not tasks:
            return None
        stop, kind, start = min(tasks)
        if upto < stop:
            return None
        try:
            if kind == "stats":
                readers = (plan.loop.a, plan.loop.b)
                return kind, start, stop, [_chunks(h, r, start, stop) for h, r in zip(halves, readers, strict=True)]
            return kind, start, stop, [_stretches(h, start, stop) for h in halves]
        except ValueError:
            self._give_up(pair, "its chunks are not where its blocks are")
            return None

    def _run(self, pair: _Pair, kind: str, start: int, stop: int, held: list[Any]) -> None:
        plan = pair.plan
        assert plan is not None
        if kind == "stats":
            partial = plan.loop.in_memory((held[0][0], held[1][0]), (held[0][1], held[1][1]), plan.tolerance)
        else:
            region = plan.where[pair.where_done]
            shape = tuple(s.stop - s.start for s in region)
            a, b = (_values(h, parts, shape) for h, parts in zip(pair.halves, held, strict=True) if h is not None)
            squares, nonfinite = block_masses(a, b, self._context.kernel)
        del held
        with self._changed:
            if kind == "stats":
                pair.partials[start] = partial
                pair.done += 1
            else:
                if pair.masses is None:
                    pair.masses = WhereAccumulator(plan.loop.shape)
                pair.masses.fold(squares, nonfinite, [s.start for s in plan.where[pair.where_done]])
                pair.where_done += 1
            done_upto = min(
                plan.regions[pair.done - 1][1] if pair.done else 0,
                plan.where_ranges[pair.where_done - 1][1] if pair.where_done else 0,
            )
            for side, half in enumerate(pair.halves):
                while half is not None and half.kept and half.kept[0].stop <= done_upto:
                    released = half.kept.popleft()
                    half.kept_bytes -= released.values.nbytes
                    self._kept[side] -= released.values.nbytes
                    if released.owned and len(self._spare) < SPARE_BUFFERS:
                        values = released.values
                        self._spare.append(values.base if values.base is not None else values)
            self._changed.notify_all()


class _RunTap:
    def __init__(self, lockstep: Lockstep, side: int) -> None:
        self._lockstep = lockstep
        self._side = side

    def tensor(
        self, name: str, key: str, shape: tuple[int, ...], dtype: LogicalDtype, chunks: tuple[int, ...]
    ) -> TensorTap | None:
        return self._lockstep.begin(self._side, name, key, shape, dtype, chunks)

    def close(self) -> None:
        self._lockstep.close(self._side)


class _TensorTap:
    def __init__(self, lockstep: Lockstep, pair: _Pair, side: int) -> None:
        self._lockstep = lockstep
        self._pair = pair
        self._side = side

    def put(self, region: Region, block: NDArray[Any]) -> None:
        self._lockstep.put(self._pair, self._side, region, block)

    def release(self, region: Region) -> None:
        self._lockstep.release(self._pair, self._side, region)

    def end(self, complete: bool) -> None:
        self._lockstep.end(self._pair, self._side, complete)


def _untracked(name: str, shape: tuple[int, ...]) -> str | None:
    if shard_of(name)[1] is not None:
        return "a shard of a tensor split across ranks"
    if not shape or 0 in shape:
        return "a 0-d or empty tensor"
    return None


def _limit(shape: tuple[int, ...], dtype: LogicalDtype, chunks: tuple[int, ...]) -> int:
    """Bytes of one side's blocks kept (over all its pairs) before the side ahead waits: two ingest blocks, no more
    than the writer holds (`WritePools.in_flight`: one per thread, two at least, beside the other run's ingest), so
    that what is kept is still the writer's (not copied)."""
    itemsize = dtype.numpy_storage.itemsize
    chunk = int(np.prod(chunks, dtype=np.int64)) * itemsize if chunks else itemsize
    return 2 * CHUNKS_PER_BLOCK * chunk


def _record(half: _Half) -> TensorRecord:
    """A row for `aligned_views` (store key, dtype and shape; no digest is known yet)."""
    record = TensorRecord(name="", store_key=half.key, digest="", dtype=half.dtype.name, has_values=True)
    record.shape = list(half.shape)
    return record


def _finished(pair: _Pair) -> bool:
    """(under the lock) Whether every block of the pair was computed in memory, statistics and where."""
    plan = pair.plan
    if pair.why is not None or plan is None or pair.masses is None:
        return False
    return (pair.done, pair.where_done) == (len(plan.regions), len(plan.where))


def _lent(half: _Half, start: int, stop: int) -> _Kept | None:
    """(under the lock) The kept block of flat values [start, stop) if it is still the ingest's buffer."""
    return next((k for k in half.kept if (k.start, k.stop) == (start, stop) and not k.owned), None)


def _stretches(half: _Half, start: int, stop: int) -> list[NDArray[Any]]:
    """(under the lock) The kept bytes of flat values [start, stop) of one side, as the stretches of its blocks."""
    itemsize = half.dtype.numpy_storage.itemsize
    parts = [
        k.values[(max(start, k.start) - k.start) * itemsize : (min(stop, k.stop) - k.start) * itemsize]
        for k in half.kept
        if k.start < stop and k.stop > start
    ]
    if sum(p.size for p in parts) != (stop - start) * itemsize:
        raise ValueError("values outside the blocks kept")
    return parts


def _values(half: _Half, parts: list[NDArray[Any]], shape: tuple[int, ...]) -> NDArray[Any]:
    """A block's values as a view reads them (`storage_to_compute`: bfloat16 widened exactly), in `shape`."""
    joined = parts[0] if len(parts) == 1 else np.concatenate(parts)
    stored = joined.view(half.dtype.numpy_storage).reshape(shape)
    return storage_to_compute(stored, half.dtype)


def _chunks(half: _Half, reader: ChunkReader, start: int, stop: int) -> tuple[Pieces, list[NDArray[Any]]]:
    """(under the lock) The pieces of flat values [start, stop) of one side and each piece's whole chunk as
    `chunk_bytes` bytes of values: a view of the kept block, or for the last chunk of a row (shorter in memory than
    in its file) a padded copy; the loop reads only the piece's values of it."""
    pieces = reader.flat_pieces(start, stop)
    if pieces is None:
        raise ValueError("chunks are not ranges of the flat array")
    itemsize = half.dtype.numpy_storage.itemsize
    chunk_bytes = reader.chunk_bytes
    held: list[NDArray[Any]] = []
    position = start
    for _, skip, count in pieces:
        first = position - skip  # the chunk's first value
        kept = next((k for k in half.kept if k.start <= first < k.stop), None)
        if kept is None or position + count > kept.stop:
            raise ValueError("a chunk outside the blocks kept")
        offset = (first - kept.start) * itemsize
        whole = kept.values[offset : offset + chunk_bytes]
        if whole.size == chunk_bytes:
            held.append(whole)
        else:
            padded = np.zeros(chunk_bytes, dtype=np.uint8)
            padded[: whole.size] = whole
            held.append(padded)
        position += count
    return pieces, held
