"""What an ingest lends of each tensor's values as it reads them, before they are stored: a `RunTap` is told of
each tensor as its array is begun and handed each block as it is read, so that a comparison of two runs ingested at
once can compute a pair's statistics from the bytes in memory instead of reading the stored copy back
(`compare/compute/lockstep.py`). A tap copies what it keeps: the block is the ingest's, reused once written."""

from __future__ import annotations

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
