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
from tensor_debugger.ingest.taps import Found

log = logging.getLogger(__name__)

STAGES = ("queued", "unpacking", "copying", "planning", "waiting")


def outage_delay(attempts: int, longest: float) -> float:
    """Seconds before the next try of an ingest that met an outage `attempts` times in a row: 1, 2, 4 ... up to
    `longest` (Settings.outage_retry_seconds)."""
    return min(longest, 2.0 ** min(attempts - 1, 16))


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

    def pair(self, reference: PendingRun, candidate: PendingRun) -> Found | None:
        """The two begun runs are ingested at once in one process whose taps compare their pairs from the blocks
        as they are read (`ChildIngests.complete_pair`); what it returns hears what those found."""


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
        self._jobs: FairLine[list[tuple[IngestJob, Future[IngestResult]]]] = FairLine()  # a run, or a pair
        self._progress: dict[int, IngestProgress] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._later: dict[int, tuple[threading.Timer, Future[IngestResult]]] = {}  # runs waiting for an outage to end

    def submit(self, job: IngestJob) -> Future[IngestResult]:
        """Queue the job; the future holds its result, or NothingUsableError (or what else went wrong)."""
        future: Future[IngestResult] = Future()
        self._put([(job, future)])
        return future

    def submit_pair(self, reference: IngestJob, candidate: IngestJob) -> tuple[Future[IngestResult], ...]:
        """Queue a reference and a candidate of one upload to be ingested at once, in one child process that
        compares their pairs from the blocks as they are read (`ChildIngests.complete_pair`); each as `submit`.
        Where this queue cannot (no child processes, or no watcher to hear what they found), each is submitted
        alone."""
        if self.children is None or self.children.pair_taps is None or self.watcher is None:
            return self.submit(reference), self.submit(candidate)
        futures: list[Future[IngestResult]] = [Future(), Future()]
        self._put(list(zip((reference, candidate), futures, strict=True)))
        return tuple(futures)

    def _put(self, jobs: list[tuple[IngestJob, Future[IngestResult]]]) -> None:
        with self._lock:
            if self._stopping.is_set():
                raise RuntimeError("the server is stopping; no new ingests")
            for job, _ in jobs:
                self._progress[job.pending.run_id] = IngestProgress("queued")
            self._start_thread()
        first = jobs[0][0]
        self._jobs.put(first.client, first.pending.session_id, jobs)

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

    def snapshot(self) -> dict[int, IngestProgress]:
        """The live figures of every run this process is ingesting (or planning after), by run id, at one moment.
        Taken before a report reads the database: a run's figures are dropped only after its plan commits, so a
        run absent here has its pairs in any read that comes after."""
        with self._lock:
            return dict(self._progress)

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
        delay = outage_delay(job.outages, self.ingestor.settings.outage_retry_seconds)
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
        self._jobs.put(job.client, job.pending.session_id, [(job, future)])

    def _set(self, run_id: int, progress: IngestProgress) -> None:
        with self._lock:
            self._progress[run_id] = progress

    def _work(self, slot: int) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            if len(item) == 2:
                outcomes = self._ingest_pair([job for job, _ in item], slot)
            else:
                try:
                    outcomes = [self._ingest(item[0][0], slot)]
                except BaseException as exc:  # handed to whoever waits on the future
                    outcomes = [exc]
            for (job, future), outcome in zip(item, outcomes, strict=True):
                self._finish(job, future, outcome)

    def _finish(self, job: IngestJob, future: Future[IngestResult], outcome: IngestResult | BaseException) -> None:
        """Hand a job's outcome to its future; one that met an outage is queued again after a while."""
        try:
            if isinstance(outcome, BaseException):
                raise outcome
            future.set_result(outcome)
        except IngestPostponed as exc:
            if not self._postpone(job, future, exc):  # the run stays "ingesting", its files for a later start
                with self._lock:
                    self._progress.pop(job.pending.run_id, None)
                future.set_exception(IngestCancelled("the server stopped while this ingest met an outage"))
            return  # not done: its staged files are kept for the next try
        except TakenOver as exc:  # another process ingests it from the same staged files: they are theirs
            log.warning("ingest of run %s stopped: %s", job.pending.run_id, exc)
            with self._lock:
                self._progress.pop(job.pending.run_id, None)
            future.set_exception(exc)
            return
        except BaseException as exc:  # handed to whoever waits on the future
            if not isinstance(exc, NothingUsableError | IngestCancelled | DiskFullError | StoreWriteError):
                log.exception("ingest of run %s failed", job.pending.run_id)
            future.set_exception(exc)
            if isinstance(exc, IngestCancelled) and job.pending.staged:  # its files stay for the next start
                with self._lock:
                    self._progress.pop(job.pending.run_id, None)
                return
        with self._lock:
            self._progress.pop(job.pending.run_id, None)
        job.done()

    def _ingest_pair(self, jobs: list[IngestJob], slot: int) -> list[IngestResult | BaseException]:
        """`_ingest` of a reference and a candidate at once (`submit_pair`): each run's result or what it raised,
        as `_ingest` would. A run that meets an outage is tried again alone."""
        pendings = [job.pending for job in jobs]
        for pending in pendings:
            self._set(pending.run_id, IngestProgress("unpacking"))
        if self._stopping.is_set():
            for pending in pendings:
                if not pending.staged:  # an accepted upload's run stays, for the next start to take over
                    self.ingestor.cancel(pending)
            return [IngestCancelled("the server stopped before this ingest began") for _ in pendings]
        watcher, children = self.watcher, self.children
        assert watcher is not None and children is not None  # `submit_pair`
        listeners: list[NoteListener | None] = [None, None]
        begun: list[int] = []
        found: Found | None = None
        try:
            for n, pending in enumerate(pendings):
                listeners[n] = watcher.begin(pending)
                begun.append(n)
            found = watcher.pair(pendings[0], pendings[1])
        except Exception:  # the runs are ingested all the same; their pairs are compared after the plan
            log.exception("comparing runs %s while they ingest could not start", [p.run_id for p in pendings])
        outcomes: list[IngestResult | BaseException] = []
        try:
            first, second = (
                (job.pending, job.inputs, self._on_progress(job.pending.run_id), listener)
                for job, listener in zip(jobs, listeners, strict=True)
            )
            if found is not None and all(listener is not None for listener in listeners):
                again = any(job.outages for job in jobs)
                outcomes = children.complete_pair(slot, (first, second), jobs[0].keep_failure, found, again)
            else:  # one after the other, as two jobs
                for job, (pending, inputs, progress, listener) in zip(jobs, (first, second), strict=True):
                    try:
                        outcomes.append(
                            children.complete(
                                slot, pending, inputs, job.keep_failure, progress, listener, again=job.outages > 0
                            )
                        )
                    except Exception as exc:
                        outcomes.append(exc)
        finally:
            for n in begun:
                try:
                    watcher.end(pendings[n], n < len(outcomes) and isinstance(outcomes[n], IngestResult))
                except Exception:  # the run is as ingested; pairs not compared yet are computed after the plan
                    log.exception("comparing run %s while it ingested did not end well", pendings[n].run_id)
        outcomes = [_failed(job, outcome) for job, outcome in zip(jobs, outcomes, strict=True)]
        ready = [outcome for outcome in outcomes if isinstance(outcome, IngestResult)]
        for outcome in ready:
            self._planning(outcome.run_id)
        if ready:
            self._plan(ready[0].session_id)
        return outcomes

    def _on_progress(self, run_id: int) -> Callable[[int, int], None]:
        def on_progress(done: int, total: int) -> None:
            if self._stopping.is_set():
                raise IngestCancelled("the server is stopping")
            self._set(run_id, IngestProgress("copying", done, total))

        return on_progress

    def _ingest(self, job: IngestJob, slot: int) -> IngestResult:
        run_id = job.pending.run_id
        self._set(run_id, IngestProgress("unpacking"))
        on_progress = self._on_progress(run_id)
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
        except Exception as exc:  # each has its own answer (422, the run undone, 507, 503, tried again later,
            # another's now); any other is the run's failure (Ingestor.complete): a 422 naming the files
            failure = _failed(job, exc)
            if failure is exc or not isinstance(failure, BaseException):
                raise
            raise failure from exc
        finally:
            if watcher is not None:
                try:
                    watcher.end(job.pending, ready)
                except Exception:  # the run is as ingested; pairs not compared yet are computed after the plan
                    log.exception("comparing run %s while it ingested did not end well", run_id)
        self._planning(run_id)
        self._plan(result.session_id)
        return result

    def _planning(self, run_id: int) -> None:
        """The run's figures say "planning"; none where they are gone already (its session deleted meanwhile)."""
        with self._lock:
            progress = self._progress.get(run_id)
            if progress is not None:
                self._progress[run_id] = replace(progress, stage="planning")

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
                delay = outage_delay(outages, self.ingestor.settings.outage_retry_seconds)
                log.warning("planning session %s met an outage; tried again in %.0f s: %s", session_id, delay, outage)
                if self._stopping.wait(delay):
                    return


def _failed(job: IngestJob, outcome: IngestResult | BaseException) -> IngestResult | BaseException:
    """A job's outcome as its future holds it: an error other than those with their own answer (422, the run
    undone, 507, 503, tried again later, another's now) is the run's failure (Ingestor.complete): a 422 naming the
    files."""
    if not isinstance(outcome, Exception) or isinstance(
        outcome, NothingUsableError | IngestCancelled | DiskFullError | StoreWriteError | IngestPostponed | TakenOver
    ):
        return outcome
    log.error("ingest of run %s failed", job.pending.run_id, exc_info=outcome)
    what = ", ".join(i.label for i in job.inputs) or "upload"
    failure = NothingUsableError([FileProblem(what, f"the ingest failed: {type(outcome).__name__}: {outcome}")])
    failure.__cause__ = outcome
    return failure
