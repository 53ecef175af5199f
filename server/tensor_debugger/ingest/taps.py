"""What an ingest lends of each tensor's values as it reads them, before they are stored: a `RunTap` is told of
each tensor as its array is begun and handed each block as it is read, so that a comparison of two runs ingested at
once can compute a pair's statistics from the bytes in memory instead of reading the stored copy back
(`compare/compute/lockstep.py`). The block is the ingest's, lent: a tap may keep it only until it is told the block
is written (`release`), when its buffer goes back to the reader (reused for the next block, or its file unmapped);
a tap that needs it longer copies it then. Most blocks are compared while the writer still holds them, so that
they are never copied."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from tensor_debugger.engine.chunking import Region
from tensor_debugger.store.dtypes import LogicalDtype


class TensorTap(Protocol):
    """One tensor's blocks, handed over in order (C-order regions of its shape, chunk-aligned, as the writer cuts
    them)."""

    def put(self, region: Region, block: np.ndarray) -> None:
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
