"""A process's one connection to its Dask scheduler (TENSOR_DEBUGGER_DASK_SCHEDULER): made when pairs are first
sent to the workers, kept for every later computation, and made again only once it has dropped (the scheduler
restarted, the network failed, and Dask's own reconnection gave up). A replica with nothing to compute never
connects, so an idle cluster's scheduler log stays quiet: a server used to open a client, and the scheduler to log
it coming and going, every 5 seconds of idling. `distributed` is imported on the first connection only."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tensor_debugger.errors import NoDaskWorkerError

if TYPE_CHECKING:
    from distributed import Client

log = logging.getLogger(__name__)
CONNECT_SECONDS = 30
WORKER_POLL_SECONDS = 1.0  # how often a wait for a task's result asks the scheduler whether it has a worker


class WaitStopped(Exception):
    """A wait for the workers' results ended because the process is stopping (`should_stop`): the tasks not done
    are the caller's to cancel; their pairs stay pending."""


class SchedulerConnection:
    def __init__(self, address: str) -> None:
        self.address = address
        self.connections = 0  # clients made so far: 1 for a process whose scheduler never dropped
        # Why the pairs sent to the workers wait: NoDaskWorkerError's words once a wait gave up for want of a
        # worker, None again once a wait sees one (or a result comes). Read by the session's progress.
        self.without_workers: str | None = None
        self._client: Client | None = None
        self._lock = threading.Lock()

    def client(self) -> Client:
        """The client, connected: the one made before while it is still connected, else a new one."""
        with self._lock:
            client = self._client
            if client is not None and client.status == "running":
                return client
            if client is not None:
                log.warning(
                    "the connection to the Dask scheduler at %s dropped (%s): connecting again",
                    self.address,
                    client.status,
                )
                self._client = None
                _close(client)
            from distributed import Client

            self._client = Client(self.address, timeout=CONNECT_SECONDS, set_as_default=False)  # type: ignore[no-untyped-call]
            self.connections += 1
            return self._client

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            _close(client)


def _close(client: Client) -> None:
    try:
        client.close()  # type: ignore[no-untyped-call]
    except Exception:  # a client whose scheduler is gone may fail closing: nothing is left to release then
        log.debug("closing a Dask client failed", exc_info=True)


def result_with_workers(
    connection: SchedulerConnection,
    client: Client,
    future: Any,
    no_worker_seconds: float,
    should_stop: Callable[[], bool],
) -> Any:
    """The `future`'s result, waited for while the scheduler of `connection` has a worker: Dask reschedules a task
    whose worker died onto another, and would wait forever for a new one once every worker is gone. After
    `no_worker_seconds` with no worker at all (`Client.scheduler_info`), NoDaskWorkerError names the scheduler, and
    `connection.without_workers` keeps its words until a worker is seen. WaitStopped, within a poll
    (WORKER_POLL_SECONDS), once `should_stop` says so: a stopping server does not wait out the bound."""
    without_since: float | None = None
    while True:
        if should_stop():
            raise WaitStopped()
        try:
            found = future.result(timeout=min(WORKER_POLL_SECONDS, no_worker_seconds))
        except TimeoutError:  # not done yet: is any worker there to do it?
            pass
        else:
            connection.without_workers = None
            return found
        if client.scheduler_info()["workers"]:
            connection.without_workers = None
            without_since = None
            continue
        now = time.monotonic()
        without_since = now if without_since is None else without_since
        if now - without_since >= no_worker_seconds:
            error = NoDaskWorkerError(
                f"no Dask worker has been connected to {connection.address} for {no_worker_seconds:g} s: the pairs "
                "not computed stay pending (start a worker; a server computes them once one is back)"
            )
            connection.without_workers = str(error)
            raise error
