"""What a `Lockstep` (`lockstep.py`) hands on of its pairs: a finished pair's statistics as a value
(`InMemoryPair`, for `replayed` and for a comparison in another process: `take_found`), and how many pairs were
compared each way (`LockstepCounts`). Each function runs under the `Lockstep`'s lock."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tensor_debugger.compare.compute.in_memory_pairs import InMemoryPair, loop_key
from tensor_debugger.compare.compute.lockstep_pairs import LockstepPair, finished
from tensor_debugger.engine.fused import Kernel


@dataclass(frozen=True)
class LockstepCounts:
    """Pairs compared from the blocks in memory, and those read back from the store, by why."""

    in_memory: int
    read_back: dict[str, int]
    most_kept: int = 0  # the most bytes of blocks one side kept at once (0: not told, as by an upload's child)
    copied: int = 0  # bytes of blocks copied


def found_pair(pair: LockstepPair, kernel: Kernel) -> InMemoryPair:
    """A finished pair's statistics, as a value (`lockstep_pairs.finished`)."""
    plan, masses = pair.plan, pair.masses
    assert plan is not None and masses is not None
    loop = plan.loop
    return InMemoryPair(loop_key(loop), kernel, plan.tolerance, plan.regions, dict(pair.partials), masses)


def found_since(pairs: dict[str, LockstepPair], closed: bool, kernel: Kernel) -> list[tuple[str, InMemoryPair | str]]:
    """The pairs of two tensors not told yet that are finished in memory, and once both ingests are `closed`, every
    other such pair too, with why it is read back from the store; each is marked told."""
    found: list[tuple[str, InMemoryPair | str]] = []
    for name, pair in pairs.items():
        if pair.told or not all(h is not None for h in pair.halves):
            continue
        if finished(pair):
            found.append((name, found_pair(pair, kernel)))
        elif closed:
            found.append((name, pair.why or "not finished in memory"))
        else:
            continue
        pair.told = True
    return found


def pair_counts(pairs: dict[str, LockstepPair], most_kept: int, copied: int) -> LockstepCounts:
    """How many pairs of two tensors were replayed from memory, and how many read back, by why."""
    read_back: Counter[str] = Counter()
    in_memory = 0
    for pair in pairs.values():
        if pair.replayed:
            in_memory += 1
        elif all(h is not None for h in pair.halves):
            read_back[pair.why or "not compared early"] += 1
    return LockstepCounts(in_memory, dict(read_back), most_kept, copied)
