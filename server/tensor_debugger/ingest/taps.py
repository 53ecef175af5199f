"""What an ingest lends of each tensor's values as it reads them, before they are stored: a `RunTap` is told of
each tensor as its array is begun and handed each block as it is read, so that a comparison of two runs ingested at
once can compute a pair's statistics from the bytes in memory instead of reading the stored copy back
(`compare/compute/lockstep.py`). The block is the ingest's, lent: a tap may keep it only until it is told the block
is written (`release`), when its buffer goes back to the reader (reused for the next block, or its file unmapped);
a tap that needs it longer copies it then. Most blocks are compared while the writer still holds them, so that
they are never copied."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from numpy.typing import NDArray

from tensor_debugger.engine.chunking import Region
from tensor_debugger.store.dtypes import LogicalDtype


class TensorTap(Protocol):
    """One tensor's blocks, handed over in order (C-order regions of its shape, chunk-aligned, as the writer cuts
    them)."""

    def put(self, region: Region, block: NDArray[Any]) -> None:
        """The block of `region` (the storage dtype's values, C-contiguous), just read; may wait for the other
        run to catch up (a bounded number of blocks is kept)."""

    def release(self, region: Region) -> None:
        """The block handed over for `region` goes back to its reader once this returns: nothing of the tap may
        read it afterwards (a tap still keeping its values copies them). Called once for every block handed
        over, after `put`, whether the tensor ended or not."""

    def end(self, complete: bool) -> None:
        """Every block was handed over (`complete`), or the tensor's writing stopped (its file failed)."""


class RunTap(Protocol):
    """A run's ingest's tap: each tensor it begins to store, and its end."""

    def tensor(
        self, name: str, key: str, shape: tuple[int, ...], dtype: LogicalDtype, chunks: tuple[int, ...]
    ) -> TensorTap | None:
        """The tap of the tensor `name` (as its row will be named) stored at `key` in chunks of `chunks`, its
        array begun (its metadata written); None where its blocks are not wanted."""

    def close(self) -> None:
        """The run's ingest is over (or stopped): no more tensors come."""


class PairTaps(Protocol):
    """The taps of two runs ingested at once in one process (a reference, side 0, and a candidate, side 1) whose
    pairs are compared there from the blocks as they are read, and what that found, to be sent to the process that
    compares the stored tensors (`ingest/child.py`: an upload's runs in a child process)."""

    def tap(self, side: int) -> RunTap:
        """Side `side`'s run's tap."""

    def take_found(self) -> Sequence[tuple[str, object]]:
        """Each pair (by name) found since the last call, with what was found: a value the other process knows
        what to do with (picklable). Each pair is told once."""


Found = Callable[[Sequence[tuple[str, object]]], None]  # hears, elsewhere, what a `PairTaps` found (`take_found`)


class EveryTap:
    """A `RunTap` that hands each tensor's blocks to every one of `taps` (a reference ingested with several runs:
    each pair of it and one of them has its tap). Each may wait for its other run in `put`: the blocks are handed
    over in order, one tap after the other."""

    def __init__(self, taps: Sequence[RunTap]) -> None:
        self._taps = list(taps)

    def tensor(
        self, name: str, key: str, shape: tuple[int, ...], dtype: LogicalDtype, chunks: tuple[int, ...]
    ) -> TensorTap | None:
        wanted = [t for t in (tap.tensor(name, key, shape, dtype, chunks) for tap in self._taps) if t is not None]
        return _EveryTensorTap(wanted) if wanted else None

    def close(self) -> None:
        for tap in self._taps:
            tap.close()


class _EveryTensorTap:
    def __init__(self, taps: list[TensorTap]) -> None:
        self._taps = taps

    def put(self, region: Region, block: NDArray[Any]) -> None:
        for tap in self._taps:
            tap.put(region, block)

    def release(self, region: Region) -> None:
        for tap in self._taps:
            tap.release(region)

    def end(self, complete: bool) -> None:
        for tap in self._taps:
            tap.end(complete)
