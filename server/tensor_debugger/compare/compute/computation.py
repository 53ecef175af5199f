"""How a process computes its pending pairs: here (`LocalComputation`) or on a Dask cluster
(`dask_pairs.DaskComputation`), chosen once where its services are built (services.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tensor_debugger.compare.compute.pending import ProgressCallback, compute_pending
from tensor_debugger.compare.context import CompareContext


class Computation(Protocol):
    """Computes the pending pairs of one session (or all) and returns how many it settled (`compute_pending`)."""

    @property
    def remote(self) -> bool:
        """Whether other processes (a Dask cluster's workers) compute them, not this one's threads."""
        ...

    @property
    def waiting_for(self) -> str | None:
        """Why pending pairs are not being computed now (no Dask worker for too long), None while nothing keeps
        them: what a session's progress says beside its pending pairs."""
        ...

    def __call__(
        self,
        session_id: int | None = None,
        progress: ProgressCallback | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> int: ...

    def close(self) -> None: ...


class LocalComputation:
    """Pending pairs computed by this process's threads (the context's pool)."""

    def __init__(self, context: CompareContext) -> None:
        self.context = context

    @property
    def remote(self) -> bool:
        return False

    @property
    def waiting_for(self) -> str | None:
        return None  # this process's threads: nothing to wait for

    def __call__(
        self,
        session_id: int | None = None,
        progress: ProgressCallback | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> int:
        return compute_pending(self.context, session_id, progress, should_stop)

    def close(self) -> None:
        """Nothing of its own: the context's pool is closed with the context."""
