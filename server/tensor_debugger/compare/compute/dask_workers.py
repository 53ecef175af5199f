"""What a Dask worker process keeps between tasks: the compare context (database, store, claims, threads) for the
settings it was sent, opened at its first task."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from tensor_debugger.compare.context import CompareContext, open_context
from tensor_debugger.store.claims import Claims

if TYPE_CHECKING:
    from tensor_debugger.settings import Settings

_opened: dict[Settings, CompareContext] = {}  # a worker process's context, by the settings it was sent
_opening = threading.Lock()


def worker_context(settings: Settings) -> CompareContext:
    """This worker process's database, store, claims (renewed while it runs), comparison threads and worst elements
    kept (`Settings.top`) for `settings`, opened once. Nothing is migrated or recovered here: the server does that."""
    from tensor_debugger.engine.fused import Kernel
    from tensor_debugger.store.arrays import ArrayStore
    from tensor_debugger.store.database import create_db_engine, make_sessionmaker

    with _opening:
        found = _opened.get(settings)
        if found is None:
            sessions = make_sessionmaker(create_db_engine(settings.database_url))
            claims = Claims(sessions, settings.claim_seconds, outage_max_seconds=settings.outage_retry_seconds)
            claims.start()
            store = ArrayStore(settings.store_url, retry_seconds=settings.store_retry_seconds)
            kernel = Kernel(settings.kernel, settings.kernel_family)  # the statistics path the server's settings name
            found = _opened[settings] = open_context(sessions, store, settings.threads, claims, settings.top, kernel)
        return found
