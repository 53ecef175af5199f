"""The server's ingests, run in child processes so that they cannot starve request handling.

An ingest in one of the server's threads competes with every request for the interpreter lock (unpickling,
Python loops between the C calls) and, on a machine with few cores, for the CPU. Here each runs in a child process
(started with spawn: no lock or thread is inherited), at a lower CPU priority (nice 5): the server's threads keep
their interpreter lock to themselves, and its requests get the CPU first. The children are started on the first
ingest, `at_once` of them at most, and kept for the next ones; each ends within a fraction of a second of the
server's death, whatever killed it, so a killed server leaves no ingest running (the next start cleans up).

Each child's memory is limited by the OS (RLIMIT_DATA, `Settings.ingest_memory`): a file that needs more fails
with that reason (MemoryError), and its run's other files go on. Each ingest's time is limited by a watchdog here
(`Settings.ingest_seconds`), which ends the child past it. Each slot has a pool of one child, so a child that dies
or is ended takes no other ingest with it; its run fails naming the file it was reading (the child says which as it
opens each), its staging is swept, and the slot's next ingest starts a new child.

The server makes the run's row (`Ingestor.begin`) and keeps it among its live runs while a child fills it; the child
reports progress through a queue and stops at its next block when the server asks (`close`). Given a listener, the
child also tells each file's stored tensors (`stored.StoredNote`) and, before its run's arrays may move, waits
until the server's listener has settled (its comparisons reading them are done: `compare/compute/early_uploads.py`). A
child that dies midway (killed, out of memory) leaves the run to the server, which removes it or marks it failed.

`complete_pair` ingests a reference and a candidate in one child, in two threads, under twice the memory limit:
their blocks go to the taps `pair_taps` makes there (`compare/compute/sent_pairs.py`), which compare their pairs
from the bytes as they are read; what those found is sent before the stored note of the tensor that completes each
pair (`FoundMessage`), and the rest with the answer.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.synchronize import Event
from typing import Any

from tensor_debugger.errors import FileProblem, IngestPostponed, NothingUsableError
from tensor_debugger.ingest import staging
from tensor_debugger.ingest.child_messages import (
    FoundMessage,
    PairDone,
    PairTapsOf,
    ProgressCallback,
    ProgressMessage,
    ReadingMessage,
    SettleMessage,
    StartedMessage,
    StoredMessage,
)
from tensor_debugger.ingest.child_process import PARENT_POLL, complete_in_child, complete_pair_in_child, start_child
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.outcomes import IngestCancelled
from tensor_debugger.ingest.runs import Ingestor, IngestResult, PendingRun
from tensor_debugger.ingest.stored import NoteListener
from tensor_debugger.ingest.taps import Found
from tensor_debugger.settings import Settings

log = logging.getLogger(__name__)

ChildRun = tuple[PendingRun, list[InputFile], ProgressCallback, NoteListener | None]  # a run, its inputs, hearers


class ChildIngests:
    """Runs `Ingestor.complete` in child processes: one child per slot, the slot being the queue's worker thread
    that calls `complete` (`queue.IngestQueue`, the one layer that schedules ingests: its `at_once` threads take
    jobs in turn, each running them in its own child), so that a child that dies, or is ended for taking too long,
    takes no other ingest with it. Each child's memory is
    limited by the OS (`Settings.ingest_memory`, RLIMIT_DATA), each ingest's time by a watchdog here
    (`Settings.ingest_seconds`)."""

    def __init__(
        self, settings: Settings, ingestor: Ingestor, at_once: int, pair_taps: PairTapsOf | None = None
    ) -> None:
        """`pair_taps`: in a child, the taps of a reference and a candidate ingested at once (`complete_pair`)."""
        self.settings = settings
        self.ingestor = ingestor  # the server's: it began the runs, and takes them back from a child that died
        self.at_once = at_once
        self.pair_taps = pair_taps
        self._context = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._pools: dict[int, ProcessPoolExecutor] = {}  # by slot: each a pool of one child
        # a multiprocessing queue of ProgressMessage, StoredMessage, ReadingMessage and SettleMessage
        self._messages: Any = None
        self._replies: list[Any] = []  # each slot's queue of settled run ids
        self._cancel: Event | None = None
        self._callbacks: dict[int, ProgressCallback] = {}
        self._listeners: dict[int, NoteListener] = {}
        self._found: dict[int, Found] = {}  # by run: who hears what its pair's taps found
        self._reading: dict[int, str] = {}  # by run: the file its child has opened last
        self._pids: dict[int, int] = {}  # by slot: its child's process id
        self._began: dict[int, float] = {}  # by slot: when its child said who it is (time.monotonic), started
        self._reader: threading.Thread | None = None
        self._closed = False

    def complete(
        self,
        slot: int,
        pending: PendingRun,
        inputs: list[InputFile],
        keep_failure: bool,
        progress: ProgressCallback,
        listener: NoteListener | None = None,
        again: bool = False,
    ) -> IngestResult:
        """`Ingestor.complete` in a child process; raises what it raises (NothingUsableError, DiskFullError,
        IngestCancelled, IngestPostponed: then the run stays among the server's live runs, ...), and
        NothingUsableError naming the file it was reading for a child that died or was ended past the time limit
        (the run failed with that reason, not tried again). `listener` hears, in the server, of the tensors the
        child stores. `slot` (0 to `at_once` - 1): the calling worker's, whose child runs it; one ingest at a time
        per slot."""
        (outcome,) = self._complete(slot, [(pending, inputs, progress, listener)], keep_failure, again, None)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def complete_pair(
        self,
        slot: int,
        runs: tuple[ChildRun, ChildRun],
        keep_failure: bool,
        found: Found,
        again: bool = False,
    ) -> list[IngestResult | BaseException]:
        """`complete` of a reference and a candidate (`runs`: each run, its inputs, progress and listener) at once,
        in two threads of the slot's child, each handing its blocks to the taps `pair_taps` makes there (their pairs
        compared from the bytes as they are read: `compare/compute/sent_pairs.py`); `found` hears, in the server,
        what those found, before the stored note of the tensor that completes each pair. Each run's result, or
        what `complete` would have raised for it. The two share the child's time limit and twice its memory
        limit."""
        if self.pair_taps is None:
            raise ValueError("these child ingests were not given the taps of a pair of runs")
        return self._complete(slot, list(runs), keep_failure, again, found)

    def _complete(
        self, slot: int, runs: list[ChildRun], keep_failure: bool, again: bool, found: Found | None
    ) -> list[IngestResult | BaseException]:
        if not 0 <= slot < self.at_once:
            raise ValueError(f"slot {slot} is not one of the {self.at_once} ingest slots")
        pendings = [pending for pending, _, _, _ in runs]
        notes = all(listener is not None for _, _, _, listener in runs)
        with self._lock:
            for pending, _, progress, listener in runs:
                self._callbacks[pending.run_id] = progress
                if listener is not None:
                    self._listeners[pending.run_id] = listener
                if found is not None:
                    self._found[pending.run_id] = found
        task: Callable[[], object]
        if found is None or self.pair_taps is None:
            (pending, inputs, _, _) = runs[0]
            task = functools.partial(complete_in_child, pending, inputs, keep_failure, notes, again)
        else:
            task = functools.partial(
                complete_pair_in_child, pendings, [i for _, i, _, _ in runs], keep_failure, notes, again, self.pair_taps
            )
        outcomes: list[IngestResult | BaseException] = []
        try:
            outcomes = self._run(slot, task, runs, keep_failure, found)
            return outcomes
        finally:
            with self._lock:
                for pending in pendings:
                    self._callbacks.pop(pending.run_id, None)
                    self._listeners.pop(pending.run_id, None)
                    self._reading.pop(pending.run_id, None)
                    self._found.pop(pending.run_id, None)
            for n, pending in enumerate(pendings):
                if not (n < len(outcomes) and isinstance(outcomes[n], IngestPostponed)):  # stays among the live
                    self.ingestor.forget(pending.run_id)

    def _run(
        self, slot: int, task: Callable[[], object], runs: list[ChildRun], keep_failure: bool, found: Found | None
    ) -> list[IngestResult | BaseException]:
        """Run `task` (the ingest of `runs`) in the slot's child: each run's result or what it raised; `found`
        hears what a pair's taps found last."""
        pendings = [pending for pending, _, _, _ in runs]
        pool: ProcessPoolExecutor | None = None
        try:
            try:
                pool = self._open(slot)
            except IngestCancelled as exc:  # the server is stopping: the run is undone as if it never began
                for pending in pendings:
                    if not pending.staged:  # but an accepted upload's, which the next start takes over
                        self.ingestor.cancel(pending)
                return [IngestCancelled(str(exc)) for _ in pendings]
            try:
                future = pool.submit(task)
            except BrokenProcessPool:  # an idle child died (killed, say): the ingest has not begun; a new child
                self._reset(slot, pool)
                pool = self._open(slot)
                future = pool.submit(task)
            try:
                done = self._watch(future, slot)
            except (CancelledError, BrokenProcessPool):
                raise
            except Exception as exc:  # the ingest's own error (or a pair's before either run began: both runs')
                return [exc for _ in pendings]
            if isinstance(done, PairDone):
                if found is not None:
                    found(done.found)
                return list(done.outcomes)
            return [done]
        except CancelledError:  # the server stopped before a child took it: as an ingest that never began
            for pending in pendings:
                if not pending.staged:  # but an accepted upload's run stays, for the next start to take over
                    self.ingestor.cancel(pending)
            return [IngestCancelled("the server stopped before this ingest began") for _ in pendings]
        except BrokenProcessPool as exc:
            if pool is not None:
                # waiting for the pool's own thread, which reaps the dead child: its pipe closes before it is a
                # zombie, and until then the sweep below would take its staging folder for a live process's
                self._reset(slot, pool, wait=True)
            try:  # what the dead child left; an upload waiting to be ingested stays
                staging.sweep(self.settings.staging_dir, self.ingestor.staged_folders())
            except Exception:  # the database did not answer: the next sweep removes it
                log.exception("sweeping what the ingest of runs %s left", [p.run_id for p in pendings])
            return [self._died(pending, inputs, keep_failure, exc) for pending, inputs, _, _ in runs]

    def _died(
        self, pending: PendingRun, inputs: list[InputFile], keep_failure: bool, exc: BrokenProcessPool
    ) -> BaseException:
        """What a run whose child died raises: IngestCancelled while the server stops, else NothingUsableError
        naming the file it read (the run given up)."""
        if self._closed:
            if not pending.staged:  # an accepted upload's run stays, for the next start to take over
                self.ingestor.give_up(pending, [], False)
            return IngestCancelled("the server is stopping")
        problem = self._death(pending, inputs, exc)
        self.ingestor.give_up(pending, [problem], keep_failure)
        return NothingUsableError([problem])

    def _watch(self, future: Future[Any], slot: int) -> Any:
        """The ingest's result; past `ingest_seconds`, the slot's child is ended (SIGKILL: it may be stuck in C
        code) and BrokenProcessPool raised, the time limit named. The limit counts from the submission, or from
        the child's start where the ingest started it: a new process's start (spawn, its imports: seconds of a
        loaded machine) is not the ingest's."""
        submitted = time.monotonic()
        while True:
            with self._lock:
                pid, began = self._pids.get(slot), self._began.get(slot)
            if pid is None or began is None:  # its child has not said who it is (starting still): until it has
                left = PARENT_POLL
            else:
                left = max(submitted, began) + self.settings.ingest_seconds - time.monotonic()
                if left <= 0:
                    break
            try:
                return future.result(timeout=left)
            except FutureTimeout:
                continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(BrokenProcessPool):
            future.result()
        raise BrokenProcessPool(_TIMED_OUT)

    def _death(self, pending: PendingRun, inputs: list[InputFile], exc: BrokenProcessPool) -> FileProblem:
        """The problem of a run whose child died (or was ended past the time limit), naming the file it read."""
        with self._lock:
            reading = self._reading.get(pending.run_id)
        what = reading or ", ".join(i.label for i in inputs)
        where = f"reading {reading}" if reading else "before it read a file (unpacking its archives)"
        if str(exc) == _TIMED_OUT:
            return FileProblem(
                what or "upload",
                f"the ingest took longer than {self.settings.ingest_seconds:g} s (TENSOR_DEBUGGER_INGEST_SECONDS), "
                f"{where}: its process was ended",
            )
        limit = self.settings.ingest_memory_limit / 2**30
        return FileProblem(
            what or "upload",
            f"the ingest's process died {where} (killed, or it crashed; the most memory it may take is "
            f"{limit:.3g} GiB, TENSOR_DEBUGGER_INGEST_MEMORY)",
        )

    def _reset(self, slot: int, pool: ProcessPoolExecutor, wait: bool = False) -> None:
        """Let go of a slot's pool whose child died; the next ingest in the slot starts a new one. `wait`: until
        the pool's thread has reaped its child."""
        with self._lock:
            if self._pools.get(slot) is pool:
                del self._pools[slot]
                self._pids.pop(slot, None)
                self._began.pop(slot, None)
        pool.shutdown(wait=wait)

    def close(self) -> None:
        """Ask every child to stop at its next block of bytes, and let them go."""
        with self._lock:
            self._closed = True
            pools, cancel, messages = list(self._pools.values()), self._cancel, self._messages
            self._pools.clear()
        if cancel is not None:
            cancel.set()
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)
        if messages is not None:
            messages.put(None)  # ends the reader

    def _open(self, slot: int) -> ProcessPoolExecutor:
        with self._lock:
            if self._closed:
                raise IngestCancelled("the server is stopping")
            if self._messages is None:
                self._messages = self._context.Queue()
                self._cancel = self._context.Event()
                self._replies = [self._context.Queue() for _ in range(self.at_once)]
                self._reader = threading.Thread(target=self._read, name="ingest-progress", daemon=True)
                self._reader.start()
            if slot not in self._pools:
                self._pools[slot] = ProcessPoolExecutor(
                    1,
                    mp_context=self._context,
                    initializer=functools.partial(
                        start_child,
                        os.getpid(),
                        self.settings,
                        self.ingestor.store.environ,
                        self._messages,
                        self._cancel,
                        self._replies[slot],
                        slot,
                    ),
                )
            return self._pools[slot]

    def _read(self) -> None:
        while True:
            message = self._messages.get()
            if message is None:
                return
            with self._lock:
                if isinstance(message, StartedMessage):
                    self._pids[message.slot] = message.pid
                    self._began[message.slot] = time.monotonic()
                    continue
                if isinstance(message, ReadingMessage):
                    self._reading[message.run_id] = message.label
                    continue
                callback = self._callbacks.get(message.run_id)
                listener = self._listeners.get(message.run_id)
                found = self._found.get(message.run_id)
                replies = self._replies
            try:
                if isinstance(message, ProgressMessage) and callback is not None:
                    callback(message.done, message.total)
                elif isinstance(message, FoundMessage) and found is not None:
                    found(message.found)
                elif isinstance(message, StoredMessage) and listener is not None:
                    listener.stored(message.notes)
                elif isinstance(message, SettleMessage):  # in a thread of its own: progress of other runs goes on
                    threading.Thread(
                        target=_settle,
                        args=(listener, message.run_id, replies[message.slot]),
                        name=f"settle-{message.run_id}",
                        daemon=True,
                    ).start()
            except IngestCancelled:
                continue  # the child sees the same request to stop
            except Exception:
                log.exception("progress of run %s", message.run_id)


_TIMED_OUT = "past the time limit"


def _settle(listener: NoteListener | None, run_id: int, replies: Any) -> None:
    """Settle the run's listener, then let its child go on (whatever the listener did: the child must not wait)."""
    try:
        if listener is not None:
            listener.settle()
    except Exception:
        log.exception("settling the comparisons of run %s", run_id)
    finally:
        replies.put(run_id)
