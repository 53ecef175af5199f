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
keeps about two ingest blocks (`lockstep_pairs.kept_limit`) over all its pairs together, whatever the sizes and the
number of its tensors, then waits, but only while the other run is reading the same tensor or one the side ahead has
finished (it catches up), so that the two never wait for each other; otherwise the pair is given up: its blocks are
dropped and it is compared from the stored copy, as before. A side level with the other or behind never waits: what
it hands over is released as soon as a pair block is complete (the two take turns ahead within a pair block larger
than the limit). A kept block is the ingest's own buffer while the ingest writes it (`TensorTap.release`: the writer
holds its last few, `WritePools.in_flight`); when the ingest takes it back, the side ahead waits for the other to
compare it where the other catches up (`LockstepBounds.release`), and copies it only otherwise, so that in step no
block is copied.
`most_kept` says the most bytes each side kept at once, `copied` the bytes copied.

Also compared from the stored copy: pairs the loop does not serve (integers and bools, ULP tolerances, shapes that
differ, shards of a tensor split across ranks, a 0-d or empty tensor), a name met twice in one run, a file that
fails, a block with a NaN or an Inf (only that block is read back). `counts` says how many pairs were compared each
way, and why not.

This module is the two sides' taps and what they call; the rest is in parts of their own: what is known of each pair
(`lockstep_pairs.py`), the blocks each side keeps and when it waits (`lockstep_bounds.py`), each pair's set-up and
the order its blocks are computed in (`lockstep_blocks.py`, reading the kept blocks through `kept_values.py`), and
what is handed on of the pairs (`lockstep_handoff.py`).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.compare.compute.in_memory_pairs import InMemoryPair, replay
from tensor_debugger.compare.compute.lockstep_blocks import BlockSchedule
from tensor_debugger.compare.compute.lockstep_bounds import LockstepBounds
from tensor_debugger.compare.compute.lockstep_handoff import LockstepCounts, found_pair, found_since, pair_counts
from tensor_debugger.compare.compute.lockstep_pairs import Half, Kept, LockstepPair, finished, kept_limit, untracked
from tensor_debugger.compare.compute.pending import PendingPair
from tensor_debugger.compare.context import CompareContext
from tensor_debugger.engine.chunking import Region, region_flat_range
from tensor_debugger.engine.streaming import PairJob
from tensor_debugger.ingest.taps import RunTap, TensorTap
from tensor_debugger.store.dtypes import LogicalDtype
from tensor_debugger.store.models import SessionRecord


class Lockstep:
    """The taps of a reference run (side 0) and a candidate run (side 1) ingested at once, comparing same-named
    tensors from their blocks in memory; `replayed` hands the statistics to the early comparisons' jobs."""

    def __init__(self, context: CompareContext, session: SessionRecord, runs: tuple[int, int]) -> None:
        self._context = context
        self.runs = runs  # (reference run id, candidate run id)
        self._changed = threading.Condition()
        self._pairs: dict[str, LockstepPair] = {}
        self._bounds = LockstepBounds(self._changed)  # the blocks each side keeps, and when it waits
        self._blocks = BlockSchedule(context, session, self._bounds)  # each pair set up, its blocks computed

    @property
    def most_kept(self) -> list[int]:
        """The most bytes of blocks each side kept at once."""
        return self._bounds.most_kept

    @property
    def copied(self) -> int:
        """Bytes of blocks copied (kept after the ingest released them, or not C-contiguous)."""
        return self._bounds.copied

    def tap(self, side: int) -> RunTap:
        return _RunTap(self, side)

    # -- the ingests' side

    def begin(
        self, side: int, name: str, key: str, shape: tuple[int, ...], dtype: LogicalDtype, chunks: tuple[int, ...]
    ) -> TensorTap | None:
        half = Half(key, shape, dtype, kept_limit(shape, dtype, chunks))
        bounds = self._bounds
        with self._changed:
            pair = self._pairs.setdefault(name, LockstepPair())
            bounds.current[side] = pair
            self._changed.notify_all()
            if pair.halves[side] is not None:
                bounds.give_up(pair, "a name met twice in one run")
                return None
            pair.halves[side] = half
            why = untracked(name, shape)
            if why is not None:
                bounds.give_up(pair, why)
            elif bounds.closed[1 - side] and pair.halves[1 - side] is None:
                bounds.give_up(pair, "the other run's ingest read no tensor of that name")
            if pair.why is not None:
                return None
            both = all(h is not None for h in pair.halves)
        if both:
            self._blocks.plan(pair)
        return _TensorTap(self, pair, side)

    def put(self, pair: LockstepPair, side: int, region: Region, block: NDArray[Any]) -> None:
        half = pair.halves[side]
        assert half is not None
        start, stop = region_flat_range(half.shape, region)
        with self._changed:
            if pair.why is not None:
                return
        owned = not block.flags.c_contiguous
        if owned:
            values = self._bounds.buffer(block.nbytes)
            values[:] = np.ascontiguousarray(block).reshape(-1).view(np.uint8)
        else:  # lent until `release`
            values = block.reshape(-1).view(np.uint8)
        if self._bounds.keep(pair, side, Kept(start, stop, values, owned)):
            self._blocks.compute(pair)

    def release(self, pair: LockstepPair, side: int, region: Region) -> None:
        """The ingest takes back the block of `region` it lent (`LockstepBounds.release`: held for the other side to
        compare, or copied)."""
        half = pair.halves[side]
        assert half is not None
        start, stop = region_flat_range(half.shape, region)
        self._bounds.release(pair, side, start, stop)

    def end(self, pair: LockstepPair, side: int, complete: bool) -> None:
        with self._changed:
            half = pair.halves[side]
            assert half is not None
            half.ended = True
            if not complete:
                self._bounds.give_up(pair, "its file could not be read to the end")
            self._changed.notify_all()

    def close(self, side: int) -> None:
        """Side `side`'s ingest is over: pairs it never began or did not finish are read back from the store."""
        bounds = self._bounds
        with self._changed:
            bounds.closed[side] = True
            bounds.current[side] = None
            for pair in self._pairs.values():
                half = pair.halves[side]
                if half is None:
                    bounds.give_up(pair, "the other run's ingest read no tensor of that name")
                elif not half.ended:
                    bounds.give_up(pair, "its ingest stopped")
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
            if not finished(pair):
                if pair.why is None:
                    pair.why = "not finished in memory"
                return None
            found = found_pair(pair, self._context.kernel)
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
            return found_since(self._pairs, all(self._bounds.closed), self._context.kernel)

    def counts(self) -> LockstepCounts:
        with self._changed:
            return pair_counts(self._pairs, max(self._bounds.most_kept), self._bounds.copied)


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
    def __init__(self, lockstep: Lockstep, pair: LockstepPair, side: int) -> None:
        self._lockstep = lockstep
        self._pair = pair
        self._side = side

    def put(self, region: Region, block: NDArray[Any]) -> None:
        self._lockstep.put(self._pair, self._side, region, block)

    def release(self, region: Region) -> None:
        self._lockstep.release(self._pair, self._side, region)

    def end(self, complete: bool) -> None:
        self._lockstep.end(self._pair, self._side, complete)
