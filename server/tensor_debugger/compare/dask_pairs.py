"""Pending pairs computed by the workers of a Dask cluster (TENSOR_DEBUGGER_DASK_SCHEDULER=tcp://host:8786).

The pairs pending when a computation starts are cut into batches in execution order, one Dask task per batch.
Each task runs in a worker process that reaches the same database and array store as the server (its own
TENSOR_DEBUGGER_* and AWS_* variables name them): it computes its batch exactly as this process would
(`compute_pending`, with the chunk loop where the store is a local folder) and writes the results through the
database, so the server reads them as it reads its own. Only the settings and the pair ids travel to the workers.
`distributed` is imported here only, when the setting is given.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import select

from tensor_debugger.compare.pending import ProgressCallback, compute_pending
from tensor_debugger.store.models import PairRecord

if TYPE_CHECKING:
    from tensor_debugger.compare.plan import Comparisons
    from tensor_debugger.settings import Settings

BATCH_PAIRS = 32  # pairs per task: a task's set-up (a few queries) is small beside comparing them
CONNECT_SECONDS = 30

_opened: dict[Settings, Comparisons] = {}  # a worker process's comparisons, by the settings it was sent
_opening = threading.Lock()


def compute_on_dask(
    settings: Settings,
    comparisons: Comparisons,
    session_id: int | None = None,
    progress: ProgressCallback | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> int:
    """Compute every pending pair (of one session, or all) on the Dask cluster at `settings.dask_scheduler`;
    returns how many pairs were settled."""
    from distributed import Client

    with comparisons.sessions() as db:
        query = select(PairRecord.id).where(PairRecord.status == "pending")
        if session_id is not None:
            query = query.where(PairRecord.session_id == session_id)
        todo = list(db.scalars(query.order_by(PairRecord.session_id, PairRecord.position)))
    if not todo:
        return 0
    batches = [todo[i : i + BATCH_PAIRS] for i in range(0, len(todo), BATCH_PAIRS)]
    done = 0
    client = Client(settings.dask_scheduler, timeout=CONNECT_SECONDS, set_as_default=False)  # type: ignore[no-untyped-call]
    with client:
        kind = type(comparisons)  # sent by reference: this module does not import plan.py, which imports it
        futures = [client.submit(compute_batch, kind, settings, batch, pure=False) for batch in batches]
        for future in futures:  # in execution order, as the workers finish them
            done += int(future.result())
            if progress is not None:
                progress(done, len(todo))
            if should_stop is not None and should_stop():
                client.cancel(futures)  # type: ignore[no-untyped-call]
                break
    return done


def compute_batch(kind: type[Comparisons], settings: Settings, pair_ids: Sequence[int]) -> int:
    """In a Dask worker: compute the pairs `pair_ids` that are still pending; how many were settled."""
    return compute_pending(worker_comparisons(kind, settings), pair_ids=pair_ids)


def worker_comparisons(kind: type[Comparisons], settings: Settings) -> Comparisons:
    """This worker process's database, store and comparison threads (a `kind`) for `settings`, opened once.
    Nothing is migrated or recovered here: the server does that."""
    from tensor_debugger.engine.fused import configure
    from tensor_debugger.store.arrays import ArrayStore
    from tensor_debugger.store.database import create_db_engine, make_sessionmaker

    with _opening:
        found = _opened.get(settings)
        if found is None:
            configure(settings.kernel, settings.kernel_family)
            sessions = make_sessionmaker(create_db_engine(settings.database_url))
            found = _opened[settings] = kind(sessions, ArrayStore(settings.store_url), settings.threads)
        return found
