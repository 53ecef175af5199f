"""Pending pairs computed by the workers of a Dask cluster (TENSOR_DEBUGGER_DASK_SCHEDULER=tcp://host:8786).

The pending pairs nobody holds when a computation starts are cut into batches in execution order, one Dask task per
batch; a pair larger than one block is instead computed one task per block (compare/dask_blocks.py). Each task runs
in a worker process that reaches the same database and array store as the server (the settings sent name them, its
own AWS_* variables reach an S3 store): it computes the pairs of its batch that it can claim, exactly as this
process would (`compute_pending`, with the chunk loop where the store is a local folder), and writes the results
through the database, so the server reads them as it reads its own. The claims (store/claims.py) keep a pair from
being computed twice, by two workers or by a worker and another replica; a worker renews its claims, and those of
one that died expire for others to take over. Rounds go on while the workers settle pairs; what is left (pairs
another process held, or added meanwhile) is then computed here as without Dask, which also waits, for one session,
for pairs another process still holds. The process's one client to the scheduler is kept between computations
(compare/compute/dask_connection.py); with nothing to send, it is not even made. Only the settings (without tokens), the
pair ids and blocks' regions travel to the workers. `distributed` is imported only when the setting is given.
A wait for the workers' results gives up once the scheduler has had no worker for TENSOR_DEBUGGER_DASK_NO_WORKER_SECONDS
(`dask_connection.result_with_workers`): the tasks are cancelled, the pairs not computed stay pending, and
NoDaskWorkerError says so (a lost worker alone is not waited for: Dask gives its tasks to the others).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import select

from tensor_debugger.compare.compute.dask_blocks import Cluster, big_pairs, collect_split, submit_split
from tensor_debugger.compare.compute.dask_connection import SchedulerConnection, WaitStopped, result_with_workers
from tensor_debugger.compare.compute.dask_workers import worker_context
from tensor_debugger.compare.compute.pending import ProgressCallback, Tally, compute_pending, pending_query
from tensor_debugger.compare.context import CompareContext
from tensor_debugger.errors import NoDaskWorkerError
from tensor_debugger.store.claims import claimable
from tensor_debugger.store.models import PairRecord

if TYPE_CHECKING:
    from tensor_debugger.settings import Settings

log = logging.getLogger(__name__)
BATCH_PAIRS = 32  # pairs per task: a task's set-up (a few queries) is small beside comparing them


class DaskComputation:
    """Pending pairs computed on the Dask cluster that `settings.dask_scheduler` names, through one client to its
    scheduler for the process's life, made once pairs are first sent to the workers."""

    def __init__(self, settings: Settings, context: CompareContext) -> None:
        self.settings = settings
        self.context = context
        self.scheduler = SchedulerConnection(settings.dask_scheduler)

    @property
    def remote(self) -> bool:
        return True

    def __call__(
        self,
        session_id: int | None = None,
        progress: ProgressCallback | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> int:
        return compute_on_dask(self.settings, self.scheduler, self.context, session_id, progress, should_stop)

    @property
    def waiting_for(self) -> str | None:
        """Why pending pairs wait: no worker connected to the scheduler for the bound (None once one is seen)."""
        return self.scheduler.without_workers

    def close(self) -> None:
        self.scheduler.close()


def compute_on_dask(
    settings: Settings,
    scheduler: SchedulerConnection,
    context: CompareContext,
    session_id: int | None = None,
    progress: ProgressCallback | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> int:
    """Compute every pending pair (of one session, or all) on the Dask cluster at `settings.dask_scheduler`, and
    here what the workers left; returns how many pairs were settled (as `compute_pending` counts them)."""
    tally = Tally(context, session_id, progress, should_stop)
    no_worker = settings.dask_no_worker_seconds
    stopping = tally.stopping

    sent = dataclasses.replace(settings, token="", read_token="")  # the workers need no token: none travels
    todo = claimable_pairs(context, session_id)
    # nothing to send, no connection: an idle server never reaches the scheduler (compare/compute/dask_connection.py)
    connection = scheduler if todo and not stopping() else None
    client = connection.client() if connection is not None else None
    if client is None and session_id is None:
        # The worker's wake with nothing pending: nothing sent, nothing left by the workers. Pairs planned since are
        # the next wake's (planning wakes the worker), for the workers: computed below, an upload planned between
        # the two queries was compared in this process and never reached the cluster (a flaky test under load)
        return tally.done
    while client is not None and todo and not stopping():
        big = big_pairs(context, todo)
        whole = [pair for pair in todo if pair not in big]
        batches = [whole[i : i + BATCH_PAIRS] for i in range(0, len(whole), BATCH_PAIRS)]
        futures = [client.submit(compute_batch, sent, batch, pure=False) for batch in batches]
        before = tally.done
        # The big pairs are claimed by this process, as `compute_pending` claims: one such computation at a time
        with context.lock if big else contextlib.nullcontext():
            splits, finished = submit_split(client, sent, context, [p for p in todo if p in big])
            tally.settled(finished)
            try:
                for future in futures:  # in execution order, as the workers finish them
                    waited = result_with_workers(scheduler, client, future, no_worker, stopping)
                    tally.settled(int(waited))
                    if stopping():
                        break
                collect_split(context, splits, tally.settled, stopping, Cluster(scheduler, client, sent, stopping))
            except NoDaskWorkerError:  # every worker gone for too long: what they did not settle stays pending
                client.cancel([*futures, *(t for split in splits for t in split.tasks)])  # type: ignore[no-untyped-call]
                raise
            except WaitStopped:  # the process stops: checked below
                pass
        if stopping():
            client.cancel([*futures, *(t for split in splits for t in split.tasks)])  # type: ignore[no-untyped-call]
            return tally.done
        if tally.done == before:  # the workers settled none of them
            # Taken by another process meanwhile (another replica's workers, say), they are its to settle, and
            # waited for below. Still pending and free, the workers could not take them: said, then done here.
            free = set(todo).intersection(claimable_pairs(context, session_id))
            if free:
                log.warning(
                    "the Dask workers at %s settled none of %d pending pairs, which nobody holds: do they reach "
                    "the same database and store as this server? Comparing them here instead",
                    settings.dask_scheduler,
                    len(free),
                )
            break
        todo = claimable_pairs(context, session_id)
    if stopping():
        return tally.done
    on_dask, total = tally.done, tally.total

    def progress_here(count: int, of: int) -> None:
        if progress is not None:
            progress(on_dask + count, max(total, on_dask + of))

    return on_dask + compute_pending(context, session_id, progress_here, should_stop)


def claimable_pairs(context: CompareContext, session_id: int | None) -> list[int]:
    """The pending pairs (of one session, or all) that no process holds now, in execution order."""
    query = pending_query(session_id, select(PairRecord.id)).where(claimable(PairRecord, time.time()))
    with context.sessions() as db:
        return list(db.scalars(query.order_by(PairRecord.session_id, PairRecord.position)))


def compute_batch(settings: Settings, pair_ids: Sequence[int]) -> int:
    """In a Dask worker: compute the pairs of `pair_ids` still pending that no other process holds; how many were
    settled."""
    return compute_pending(worker_context(settings), pair_ids=pair_ids)
