"""The background worker: computes pending pairs while the server answers, and resumes after a restart
(pending pairs are rows in the database, so a killed computation is simply pending again)."""

from __future__ import annotations

import logging
import threading

from tensor_debugger.compare.compute.computation import Computation
from tensor_debugger.errors import NoDaskWorkerError

log = logging.getLogger(__name__)
STOP_SECONDS = 30.0  # how long a stop waits for the computation under way


class ComparisonWorker:
    def __init__(self, compute: Computation, idle_seconds: float = 5.0) -> None:
        self.compute = compute
        self.idle_seconds = idle_seconds
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="comparison-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        """Ask the computation to stop (a wait for Dask workers ends within a poll) and wait for it, 30 s at most."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=STOP_SECONDS)
        if self._thread.is_alive():
            log.warning("the comparison worker did not stop within %g s: left to end with the process", STOP_SECONDS)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.idle_seconds)
            self._wake.clear()
            try:
                self.compute(should_stop=self._stop.is_set)
            except NoDaskWorkerError as exc:  # the pairs stay pending: computed at a later wake, once a worker is back
                log.warning("%s", exc)
            except Exception:  # keep the worker alive; the pair in question is marked "error" where it can be
                log.exception("comparison worker failed; will retry")
