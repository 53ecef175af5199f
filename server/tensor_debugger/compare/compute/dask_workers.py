"""What a Dask worker process keeps between tasks: the comparisons (database, store, claims, threads) for the
settings it was sent, opened at its first task."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from tensor_debugger.store.claims import Claims

if TYPE_CHECKING:
    from tensor_debugger.compare.planning.plan import Comparisons
    from tensor_debugger.settings import Settings

_opened: dict[Settings, Comparisons] = {}  # a worker process's comparisons, by the settings it was sent
_opening = threading.Lock()


def worker_comparisons(kind: type[Comparisons], settings: Settings) -> Comparisons:
    """This worker process's database, store, claims (renewed while it runs) and comparison threads (a `kind`) for
    `settings`, opened once. Nothing is migrated or recovered here: the server does that."""
    from tensor_debugger.engine.fused import configure
    from tensor_debugger.store.arrays import ArrayStore
    from tensor_debugger.store.database import create_db_engine, make_sessionmaker

    with _opening:
        found = _opened.get(settings)
        if found is None:
            configure(settings.kernel, settings.kernel_family)
            sessions = make_sessionmaker(create_db_engine(settings.database_url))
            claims = Claims(sessions, settings.claim_seconds)
            claims.start()
            found = _opened[settings] = kind(sessions, ArrayStore(settings.store_url), settings.threads, claims)
        return found
