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

from tensor_debugger.errors import DiskFullError, FileProblem, IngestPostponed, NothingUsableError, StoreWriteError
from tensor_debugger.ingest.child import ChildIngests
from tensor_debugger.ingest.fair_line import FairLine
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.outcomes import IngestCancelled, TakenOver
from tensor_debugger.ingest.runs import Ingestor, IngestResult, PendingRun
from tensor_debugger.ingest.stored import NoteListener, NotesOf

log = logging.getLogger(__name__)

STAGES = ("queued", "unpacking", "copying", "planning", "waiting")
OUTAGE_MAX_SECONDS = 60.0  # the longest wait before an ingest that met an outage is tried again (1, 2, 4 ... before)


def outage_delay(attempts: int) -> float:
    """Seconds before the next try of an ingest that met an outage `attempts` times in a row."""
    return min(OUTAGE_MAX_SECONDS, 2.0 ** min(attempts - 1, 16))


@dataclass(frozen=True)
class IngestProgress:
    stage: str  # one of STAGES
    bytes_done: int = 0  # of the run's tensor files, once unpacked
    bytes_total: int = 0
    waiting_for: str = ""  # "waiting": what did not answer (the database, the array store), and why


class IngestWatcher(Protocol):
    """Told of each ingest the queue runs (the server compares pairs while their runs ingest:
    `compare/compute/early_uploads.py`)."""

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
    outages: int = 0  # tries so far that met an outage: the next one first deletes what they wrote


class IngestQueue:
    """`at_once` threads (Settings.ingest_workers) take jobs in turn (`FairLine`: round the clients, then round
    each client's sessions), one run each; after each ingest, `plan` pairs the session again. With `children`, the
    threads are the one layer that schedules ingests: thread i runs its jobs in child process i (child.py's slot
    i), and no other pool limits them. Each ingest copies its run with a pool of its own (Settings.workers)."""

    def __init__(
        self,
        ingestor: Ingestor,
        plan: Callable[[int], None],
        at_once: int,
        children: ChildIngests | None = None,
        watcher: IngestWatcher | None = None,
    ) -> None:
        if children is not None and children.at_once < at_once:
            raise ValueError(f"{at_once} ingest threads need as many child slots, not {children.at_once}")
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
        self._later: dict[int, tuple[threading.Timer, Future[IngestResult]]] = {}  # runs waiting for an outage to end

    def submit(self, job: IngestJob) -> Future[IngestResult]:
        """Queue the job; the future holds its result, or NothingUsableError (or what else went wrong)."""
        future: Future[IngestResult] = Future()
        with self._lock:
            if self._stopping.is_set():
                raise RuntimeError("the server is stopping; no new ingests")
            self._progress[job.pending.run_id] = IngestProgress("queued")
            self._start_thread()
        self._jobs.put(job.client, job.pending.session_id, (job, future))
        return future

    def _start_thread(self) -> None:
        if len(self._threads) < self.at_once:  # started on demand: a CLI process never needs them
            slot = len(self._threads)  # the thread's child process, with `children`
            thread = threading.Thread(target=self._work, args=(slot,), name=f"ingest-{slot}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def progress(self, run_id: int) -> IngestProgress | None:
        """The live figures of a run this process is ingesting (or planning after); None for any other run."""
        with self._lock:
            return self._progress.get(run_id)

    def close(self, timeout: float = 10) -> None:
        """Stop: waiting jobs are dropped and running ones cancelled at their next block of bytes, their runs
        removed as if never begun (their session too when the upload made it and nothing else is in it), but an
        accepted upload's (its files staged): its run stays "ingesting" and its files staged, for the next start or
        another replica to take over (recovery.py). An ingest still unpacking an archive after `timeout` seconds
        is left to die with the process: its run stays "ingesting" until the next start's recovery removes it
        (or takes it over). Runs waiting for an outage to end stay
        "ingesting", their staged files kept: the next start, or another replica, takes them over (recovery.py);
        whoever waits on their futures is told IngestCancelled."""
        self._stopping.set()
        with self._lock:
            later, self._later = list(self._later.values()), {}
        for timer, future in later:
            timer.cancel()
            future.set_exception(IngestCancelled("the server stopped while this ingest waited for an outage to end"))
        if self.children is not None:
            self.children.close()
        with self._lock:
            threads = list(self._threads)
        self._jobs.stop(len(threads))
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _postpone(self, job: IngestJob, future: Future[IngestResult], exc: IngestPostponed) -> bool:
        """Queue the job again after the outage's backoff, its run "waiting" meanwhile; False: the server stops."""
        job = replace(job, outages=job.outages + 1)
        delay = outage_delay(job.outages)
        log.warning("ingest of run %s met an outage; tried again in %.0f s: %s", job.pending.run_id, delay, exc)
        timer = threading.Timer(delay, self._resubmit, args=(job, future))
        timer.daemon = True
        with self._lock:
            if self._stopping.is_set():
                return False
            self._progress[job.pending.run_id] = IngestProgress("waiting", waiting_for=exc.reason)
            self._later[job.pending.run_id] = (timer, future)
        timer.start()
        return True

    def _resubmit(self, job: IngestJob, future: Future[IngestResult]) -> None:
        with self._lock:
            if self._later.pop(job.pending.run_id, None) is None:  # closed meanwhile
                return
            self._progress[job.pending.run_id] = IngestProgress("queued")
        self._jobs.put(job.client, job.pending.session_id, (job, future))

    def _set(self, run_id: int, progress: IngestProgress) -> None:
        with self._lock:
            self._progress[run_id] = progress

    def _work(self, slot: int) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, future = item
            try:
                future.set_result(self._ingest(job, slot))
            except IngestPostponed as exc:
                if not self._postpone(job, future, exc):  # the run stays "ingesting", its files for a later start
                    with self._lock:
                        self._progress.pop(job.pending.run_id, None)
                    future.set_exception(IngestCancelled("the server stopped while this ingest met an outage"))
                continue  # not done: its staged files are kept for the next try
            except TakenOver as exc:  # another process ingests it from the same staged files: they are theirs
                log.warning("ingest of run %s stopped: %s", job.pending.run_id, exc)
                with self._lock:
                    self._progress.pop(job.pending.run_id, None)
                future.set_exception(exc)
                continue
            except BaseException as exc:  # handed to whoever waits on the future
                if not isinstance(exc, NothingUsableError | IngestCancelled | DiskFullError | StoreWriteError):
                    log.exception("ingest of run %s failed", job.pending.run_id)
                future.set_exception(exc)
                if isinstance(exc, IngestCancelled) and job.pending.staged:  # its files stay for the next start
                    with self._lock:
                        self._progress.pop(job.pending.run_id, None)
                    continue
            with self._lock:
                self._progress.pop(job.pending.run_id, None)
            job.done()

    def _ingest(self, job: IngestJob, slot: int) -> IngestResult:
        run_id = job.pending.run_id
        self._set(run_id, IngestProgress("unpacking"))

        def on_progress(done: int, total: int) -> None:
            if self._stopping.is_set():
                raise IngestCancelled("the server is stopping")
            self._set(run_id, IngestProgress("copying", done, total))

        if self._stopping.is_set():
            if not job.pending.staged:  # an accepted upload's run stays, for the next start to take over
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
                result = self.children.complete(
                    slot, job.pending, job.inputs, job.keep_failure, on_progress, listener, again=job.outages > 0
                )
            else:
                stored = None if listener is None else NotesOf(listener)
                result = self.ingestor.complete(
                    job.pending, job.inputs, on_progress, job.keep_failure, listener=stored, again=job.outages > 0
                )
            ready = True
        except (NothingUsableError, IngestCancelled, DiskFullError, StoreWriteError, IngestPostponed, TakenOver):
            raise  # each has its own answer (422, the run undone, 507, 503, tried again later, another's now)
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
        self._plan(result.session_id)
        return result

    def _plan(self, session_id: int) -> None:
        """Pair the session again; while the database does not answer, tried again after a backoff."""
        outages = 0
        while True:
            try:
                self.plan(session_id)
                return
            except Exception as exc:  # the run is stored: the next start plans sessions that have no pairs
                outage = self.ingestor.outage(exc)
                if outage is None or self._stopping.is_set():
                    log.exception("planning session %s after ingest failed", session_id)
                    return
                outages += 1
                delay = outage_delay(outages)
                log.warning("planning session %s met an outage; tried again in %.0f s: %s", session_id, delay, outage)
                if self._stopping.wait(delay):
                    return
