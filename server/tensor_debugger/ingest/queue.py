"""The server's ingests: uploads are ingested in background threads, a few at a time, the rest waiting in
line, so an upload's request can return as soon as its bytes are on disk.

Each run's live figures (waiting, unpacking, bytes copied of the total, planning its pairs) are kept in memory
while its job runs; the run's row says "ingesting" all along, so a page or a client that finds no figures here
(another process is ingesting it, say) still knows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Protocol

from tensor_debugger.errors import DiskFullError, FileProblem, NothingUsableError, StoreWriteError
from tensor_debugger.ingest.child import ChildIngests
from tensor_debugger.ingest.fair_line import FairLine
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.runs import IngestCancelled, Ingestor, IngestResult, PendingRun
from tensor_debugger.ingest.stored import NoteListener, NotesOf

log = logging.getLogger(__name__)

STAGES = ("queued", "unpacking", "copying", "planning")


@dataclass(frozen=True)
class IngestProgress:
    stage: str  # one of STAGES
    bytes_done: int = 0  # of the run's tensor files, once unpacked
    bytes_total: int = 0


class IngestWatcher(Protocol):
    """Told of each ingest the queue runs (the server compares pairs while their runs ingest:
    `compare/early_uploads.py`)."""

    def begin(self, pending: PendingRun) -> NoteListener | None:
        """The ingest of `pending` starts; what it returns hears of the run's tensors as they are stored."""

    def end(self, pending: PendingRun, ready: bool) -> None:
        """The ingest is over, before its session is planned; `ready`: the run is ready."""


@dataclass(frozen=True)
class IngestJob:
    pending: PendingRun
    inputs: list[InputFile]
    keep_failure: bool  # True: a run with nothing usable stays as "failed", so its page can say why
    done: Callable[[], None]  # called once the job is over, whatever its outcome (removes the uploaded files)
    client: str = ""  # who sent it (the request's address): jobs wait their turn per client, then per session


class IngestQueue:
    """`at_once` threads (Settings.ingest_workers) take jobs in turn (`FairLine`: round the clients, then round
    each client's sessions), one run each; after each ingest, `plan` pairs the session again. Each ingest copies
    its run with a pool of its own (Settings.workers)."""

    def __init__(
        self,
        ingestor: Ingestor,
        plan: Callable[[int], None],
        at_once: int,
        children: ChildIngests | None = None,
        watcher: IngestWatcher | None = None,
    ) -> None:
        self.ingestor = ingestor
        self.children = children  # given: each ingest runs in a child process (child.py), else in the thread
        self.watcher = watcher
        self.plan = plan
        self.at_once = at_once
        self._jobs: FairLine[tuple[IngestJob, Future[IngestResult]]] = FairLine()
        self._progress: dict[int, IngestProgress] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def submit(self, job: IngestJob) -> Future[IngestResult]:
        """Queue the job; the future holds its result, or NothingUsableError (or what else went wrong)."""
        future: Future[IngestResult] = Future()
        with self._lock:
            if self._stopping.is_set():
                raise RuntimeError("the server is stopping; no new ingests")
            self._progress[job.pending.run_id] = IngestProgress("queued")
            if len(self._threads) < self.at_once:  # started on demand: a CLI process never needs them
                thread = threading.Thread(target=self._work, name=f"ingest-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        self._jobs.put(job.client, job.pending.session_id, (job, future))
        return future

    def progress(self, run_id: int) -> IngestProgress | None:
        """The live figures of a run this process is ingesting (or planning after); None for any other run."""
        with self._lock:
            return self._progress.get(run_id)

    def close(self, timeout: float = 10) -> None:
        """Stop: waiting jobs are dropped and running ones cancelled at their next block of bytes, their runs
        removed as if never begun (their session too when the upload made it and nothing else is in it). An
        ingest still unpacking an archive after `timeout` seconds is left to die with the process: its run
        stays "ingesting" until the next start's recovery removes it."""
        self._stopping.set()
        if self.children is not None:
            self.children.close()
        with self._lock:
            threads = list(self._threads)
        self._jobs.stop(len(threads))
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _set(self, run_id: int, progress: IngestProgress) -> None:
        with self._lock:
            self._progress[run_id] = progress

    def _work(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, future = item
            try:
                future.set_result(self._ingest(job))
            except BaseException as exc:  # handed to whoever waits on the future
                if not isinstance(exc, NothingUsableError | IngestCancelled | DiskFullError | StoreWriteError):
                    log.exception("ingest of run %s failed", job.pending.run_id)
                future.set_exception(exc)
            finally:
                with self._lock:
                    self._progress.pop(job.pending.run_id, None)
                job.done()

    def _ingest(self, job: IngestJob) -> IngestResult:
        run_id = job.pending.run_id
        self._set(run_id, IngestProgress("unpacking"))

        def on_progress(done: int, total: int) -> None:
            if self._stopping.is_set():
                raise IngestCancelled("the server is stopping")
            self._set(run_id, IngestProgress("copying", done, total))

        if self._stopping.is_set():
            self.ingestor.cancel(job.pending)
            raise IngestCancelled("the server stopped before this ingest began")
        watcher, listener = self.watcher, None
        if watcher is not None:
            try:
                listener = watcher.begin(job.pending)
            except Exception:  # the run is ingested all the same; its pairs are compared after the plan
                log.exception("comparing run %s while it ingests could not start", run_id)
                watcher = None
        ready = False
        try:
            if self.children is not None:
                result = self.children.complete(job.pending, job.inputs, job.keep_failure, on_progress, listener)
            else:
                stored = None if listener is None else NotesOf(listener)
                result = self.ingestor.complete(job.pending, job.inputs, on_progress, job.keep_failure, listener=stored)
            ready = True
        except (NothingUsableError, IngestCancelled, DiskFullError, StoreWriteError):
            raise  # each has its own answer (422, the run undone, 507, 503)
        except Exception as exc:  # the run failed with it as its problem (Ingestor.complete): a 422 naming the files
            log.exception("ingest of run %s failed", run_id)
            what = ", ".join(i.label for i in job.inputs) or "upload"
            raise NothingUsableError([FileProblem(what, f"the ingest failed: {type(exc).__name__}: {exc}")]) from exc
        finally:
            if watcher is not None:
                try:
                    watcher.end(job.pending, ready)
                except Exception:  # the run is as ingested; pairs not compared yet are computed after the plan
                    log.exception("comparing run %s while it ingested did not end well", run_id)
        with self._lock:
            self._progress[run_id] = replace(self._progress[run_id], stage="planning")
        try:
            self.plan(result.session_id)
        except Exception:  # the run is stored: the next start plans sessions that have no pairs
            log.exception("planning session %s after ingest failed", result.session_id)
        return result
