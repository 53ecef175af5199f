"""How much of its blocks each side of a `Lockstep` (`lockstep.py`) keeps, and when the side ahead waits for the
other rather than keep more: its limit (`lockstep_pairs.kept_limit`) over all its pairs together, waits only where
the other side catches up (`may_wait`), and a block the ingest takes back held for the other side to compare
(`release`) or copied. Every method takes the `Lockstep`'s lock (`changed`) but those said to run under it."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.compare.compute.lockstep_pairs import Kept, LockstepPair, lent

SPARE_BUFFERS = 2  # block copies kept for reuse


class LockstepBounds:
    """The blocks the two sides keep (side 0 the reference, side 1 the candidate), and where each side reads."""

    def __init__(self, changed: threading.Condition) -> None:
        self.changed = changed
        self.current: list[LockstepPair | None] = [None, None]  # the tensor each side reads now (or read last)
        self.closed = [False, False]
        self._spare: list[NDArray[Any]] = []  # copies no block needs any more, for the next blocks
        self._kept = [0, 0]  # bytes of block copies each side keeps, over all its pairs
        self.most_kept = [0, 0]  # the most of them at once
        self.copied = 0  # bytes of blocks copied (kept after the ingest released them, or not C-contiguous)
        self._waiting = [False, False]  # a side waits in `keep` for the other to catch up
        self._holding = [False, False]  # a side waits in `release` for the other to compare the block it lent
        self._let_go = [False, False]  # the other side would wait in `keep`: stop holding, copy

    def buffer(self, nbytes: int) -> NDArray[Any]:
        """`nbytes` bytes for a block's copy: a spare one where one is large enough (new memory costs a page fault
        per 4 KiB on first touch), else new."""
        with self.changed:
            fitting = [n for n, spare in enumerate(self._spare) if spare.size >= nbytes]
            found = self._spare.pop(fitting[0]) if fitting else None
        return found[:nbytes] if found is not None else np.empty(nbytes, dtype=np.uint8)

    def keep(self, pair: LockstepPair, side: int, kept: Kept) -> bool:
        """Keep side `side`'s block `kept`, the values it hands over next, once the side is within its limit or not
        ahead of the other (waiting for the other to catch up where it may, else giving the pair up): False where
        the pair is given up (nothing kept)."""
        half = pair.halves[side]
        assert half is not None
        with self.changed:
            while pair.why is None and self._kept[side] >= half.limit and self._ahead(pair, side):
                if not self.may_wait(pair, side):
                    self.give_up(pair, "one run was far ahead of the other")
                    break
                if self._holding[1 - side]:  # the other waits in `release`: it copies and goes on instead
                    self._let_go[1 - side] = True
                    self.changed.notify_all()
                self._waiting[side] = True
                self.changed.wait()
            self._waiting[side] = False
            if pair.why is not None:
                return False
            if kept.owned:
                self.copied += kept.values.nbytes
            half.kept.append(kept)
            half.kept_bytes += kept.values.nbytes
            self._kept[side] += kept.values.nbytes
            self.most_kept[side] = max(self.most_kept[side], self._kept[side])
            half.upto = kept.stop
            self.changed.notify_all()
        return True

    def release(self, pair: LockstepPair, side: int, start: int, stop: int) -> None:
        """The ingest takes back the block of flat values [start, stop) it lent. While the other side catches up and
        will compare it without more of this side's values, wait for that (`_may_hold`); then wait for a
        computation that may read it, and copy its values if they are still kept."""
        half = pair.halves[side]
        assert half is not None
        with self.changed:
            while (kept := lent(half, start, stop)) is not None and self._may_hold(pair, side, kept):
                self._holding[side] = True
                self.changed.wait()
            self._holding[side] = self._let_go[side] = False
        with pair.computing:  # no block of the pair is being computed: none reads the lent buffer now
            with self.changed:
                kept = lent(half, start, stop)
            if kept is None:
                return
            copy = self.buffer(kept.values.nbytes)
            copy[:] = kept.values
            with self.changed:
                kept.values, kept.owned = copy, True
                self.copied += copy.nbytes

    def drop_computed(self, pair: LockstepPair, done_upto: int) -> None:
        """(under the lock) Let go of the pair's kept blocks that end by flat value `done_upto` (no block left to
        compute reads them); their copies become spares."""
        for side, half in enumerate(pair.halves):
            while half is not None and half.kept and half.kept[0].stop <= done_upto:
                released = half.kept.popleft()
                half.kept_bytes -= released.values.nbytes
                self._kept[side] -= released.values.nbytes
                if released.owned and len(self._spare) < SPARE_BUFFERS:
                    values = released.values
                    self._spare.append(values.base if values.base is not None else values)

    def give_up(self, pair: LockstepPair, why: str) -> None:
        """(under the lock) Read the pair back from the store: drop what is kept."""
        if pair.why is None:
            pair.why = why
        for side, half in enumerate(pair.halves):
            if half is not None:
                half.kept.clear()
                self._kept[side] -= half.kept_bytes
                half.kept_bytes = 0
        self.changed.notify_all()

    def may_wait(self, pair: LockstepPair, side: int) -> bool:
        """Whether the side ahead may wait for the other (under the lock): the other reads this pair's tensor, or
        one that this side has finished (it catches up), or has not begun its first (it unpacks its archives). Then
        the other never waits for this side."""
        if self.closed[1 - side]:
            return False
        other = self.current[1 - side]
        if other is None or other is pair:
            return True
        mine = other.halves[side] if other is not None else None
        return mine is not None and mine.ended

    def _ahead(self, pair: LockstepPair, side: int) -> bool:
        """(under the lock) Whether this side has handed more of the pair's values than the other: only then may it
        wait for the other. A side level with the other or behind never waits (within a pair block larger than the
        limit, the two take turns ahead), so that the two never wait for each other."""
        other, half = pair.halves[1 - side], pair.halves[side]
        assert half is not None
        return other is None or other.upto < half.upto

    def _may_hold(self, pair: LockstepPair, side: int, kept: Kept) -> bool:
        """(under the lock) Whether `release` may wait for the other side to compare the lent block `kept` rather
        than copy it: the other side catches up (`may_wait`; it may not have begun the tensor yet) and needs no more
        of this side's values for the blocks that read it, and neither side waits otherwise (no two waits on each
        other: a side about to wait in `keep` ends this one, `_let_go`)."""
        other, plan, half = pair.halves[1 - side], pair.plan, pair.halves[side]
        assert half is not None
        if self._let_go[side] or self._waiting[1 - side] or self._holding[1 - side]:
            return False
        if pair.why is not None or (other is not None and other.ended) or not self.may_wait(pair, side):
            return False
        if other is None or plan is None:  # not planned yet: every value of this side is needed
            return half.ended
        needed = max(
            (stop for start, stop in (*plan.regions, *plan.where_ranges) if start < kept.stop and stop > kept.start),
            default=0,
        )
        return half.upto >= needed
