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
pair (`_Found`), and the rest with the answer.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import queue
import resource
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from typing import Any

from tensor_debugger.errors import FileProblem, IngestPostponed, NothingUsableError, is_outage
from tensor_debugger.ingest import staging
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.outcomes import IngestCancelled
from tensor_debugger.ingest.runs import Ingestor, IngestResult, PendingRun
from tensor_debugger.ingest.stored import NoteListener, Stored, StoredNote, note_of
from tensor_debugger.ingest.taps import Found, PairTaps
from tensor_debugger.settings import Settings
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.database import create_db_engine, make_sessionmaker

log = logging.getLogger(__name__)

NICENESS = 5  # added to the child's CPU priority: the server's requests come first, ingests still progress
PROGRESS_EVERY = 0.1  # seconds between two progress messages of one ingest
PARENT_POLL = 0.2  # seconds between a child's checks that the server is still there

ProgressCallback = Callable[[int, int], None]
ChildRun = tuple[PendingRun, list[InputFile], ProgressCallback, NoteListener | None]  # a run, its inputs, hearers
PairTapsOf = Callable[[Ingestor, int, tuple[int, int]], PairTaps]  # (child's ingestor, session, runs) -> taps


@dataclass(frozen=True)
class _Progress:  # child to server: bytes copied of the run's total
    run_id: int
    done: int
    total: int


@dataclass(frozen=True)
class _Stored:  # child to server: the tensors of one file are stored
    run_id: int
    notes: tuple[StoredNote, ...]


@dataclass(frozen=True)
class _Found:  # child to server: what the taps of a pair of runs found (`PairTaps.take_found`), before a _Stored
    run_id: int
    found: tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class _PairDone:  # a child's answer to `complete_pair`: each run's outcome, and what its taps found last
    outcomes: tuple[IngestResult | BaseException, ...]
    found: tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class _Reading:  # child to server: the run's ingest opens the file `label`
    run_id: int
    label: str


@dataclass(frozen=True)
class _Started:  # child to server: the child of the slot is process `pid`
    slot: int
    pid: int


@dataclass(frozen=True)
class _Settle:  # child to server: the run's arrays are about to move; reply with the run's id on `replies[slot]`
    run_id: int
    slot: int


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
        self._messages: Any = None  # a multiprocessing queue of _Progress, _Stored, _Reading and _Settle
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
            task = functools.partial(_complete, pending, inputs, keep_failure, notes, again)
        else:
            task = functools.partial(
                _complete_pair, pendings, [i for _, i, _, _ in runs], keep_failure, notes, again, self.pair_taps
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
            if isinstance(done, _PairDone):
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
                        _start,
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
                if isinstance(message, _Started):
                    self._pids[message.slot] = message.pid
                    self._began[message.slot] = time.monotonic()
                    continue
                if isinstance(message, _Reading):
                    self._reading[message.run_id] = message.label
                    continue
                callback = self._callbacks.get(message.run_id)
                listener = self._listeners.get(message.run_id)
                found = self._found.get(message.run_id)
                replies = self._replies
            try:
                if isinstance(message, _Progress) and callback is not None:
                    callback(message.done, message.total)
                elif isinstance(message, _Found) and found is not None:
                    found(message.found)
                elif isinstance(message, _Stored) and listener is not None:
                    listener.stored(message.notes)
                elif isinstance(message, _Settle):  # in a thread of its own: progress of other runs goes on
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


_child: dict[str, Any] = {}  # in a child only, filled by `_start`: its ingestor, queue and stop signal


def _start(
    server: int,
    settings: Settings,
    store_environ: dict[str, str],
    messages: Any,
    cancel: Event | None,
    replies: Any,
    slot: int,
) -> None:
    """A child's set-up: its memory limit, its own database engine, and the server's array store opened with the
    server's AWS variables (`store_environ`: an s3:// store's endpoint and credentials, which the server may have
    been given otherwise than in its environment); `replies`: its slot's queue of replies to its `_Settle`s.
    `server`: the server's process id."""
    limit = _limit_memory(settings.ingest_memory_limit)
    os.nice(NICENESS)
    # the server's id as it gave it: one killed before this child got here is already gone, and its id read here
    # would be that of the process that adopted the child, which `_die_with` would wait on for ever
    threading.Thread(target=_die_with, args=(server,), name="die-with-server", daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which stops the children
    messages.put(_Started(slot, os.getpid()))
    _child.update(messages=messages, cancel=cancel, server=server, slot=slot, replies=replies)
    _child.update(settings=settings, store_environ=store_environ, limit=limit)
    # the replies one run's `_Notes.settle` took that are another's (a pair's two runs settle through one queue)
    _child.update(settled=set(), settled_lock=threading.Lock())
    # opened by the first ingest (`_ingestor`): a store that does not answer now postpones that ingest, where
    # failing here would break the pool, a child's death that fails the run
    with contextlib.suppress(Exception):
        _ingestor()


def _ingestor() -> Ingestor:
    """The child's Ingestor: its own database engine and the server's array store, opened once."""
    if "ingestor" not in _child:
        settings: Settings = _child["settings"]
        store = ArrayStore(
            settings.store_url, _child["store_environ"], settings.direct_writes, settings.store_retry_seconds
        )
        made = Ingestor(settings, make_sessionmaker(create_db_engine(settings.database_url)), store)
        made.memory_limit = _child["limit"]
        messages = _child["messages"]
        made.reading = lambda run_id, label: messages.put(_Reading(run_id, label))
        _child["ingestor"] = made
    ingestor: Ingestor = _child["ingestor"]
    return ingestor


def _limit_memory(limit: int) -> int:
    """Limit this process's data (its heap and private writable mappings: RLIMIT_DATA, which unlike RLIMIT_AS
    leaves alone the address space that threads' malloc arenas reserve and never use) to `limit` bytes, or to the
    hard limit where that is lower; what was set. An allocation past it fails: MemoryError in Python."""
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    return limit


def _die_with(server: int) -> None:
    """End this child as soon as the server is gone, whatever killed it: it is then adopted by another process."""
    while os.getppid() == server:
        time.sleep(PARENT_POLL)
    os._exit(1)


def _check(cancel: Event) -> None:
    if cancel.is_set():
        raise IngestCancelled("the server is stopping")
    if os.getppid() != _child["server"]:  # killed: `_die_with` may not have woken yet; commit nothing
        raise IngestCancelled("the server is gone")


class _Notes:
    """The child's `StoredListener`: tells the server what is stored, and waits for its listener to settle.
    `taps`: of the pair of runs this one is ingested with: what they found is told first."""

    def __init__(self, run_id: int, taps: PairTaps | None = None) -> None:
        self.run_id = run_id
        self.taps = taps

    def stored(self, tensors: Sequence[Stored]) -> None:
        self.tell_found()
        _child["messages"].put(_Stored(self.run_id, tuple(note_of(*item) for item in tensors)))

    def tell_found(self) -> None:
        found = self.taps.take_found() if self.taps is not None else ()
        if found:
            _child["messages"].put(_Found(self.run_id, tuple(found)))

    def settle(self) -> None:
        replies, cancel = _child["replies"], _child["cancel"]
        _child["messages"].put(_Settle(self.run_id, _child["slot"]))
        settled_lock, others = _child["settled_lock"], _child["settled"]
        while True:
            _check(cancel)
            with settled_lock:
                if self.run_id in others:  # taken by the other run of a pair
                    others.discard(self.run_id)
                    return
            try:
                settled = replies.get(timeout=PARENT_POLL)
            except queue.Empty:
                continue
            if settled == self.run_id:
                return
            with settled_lock:
                others.add(settled)


def _opened_ingestor() -> Ingestor:
    try:
        return _ingestor()
    except Exception as exc:
        if is_outage(exc):  # the store did not answer the child opening it: tried again, as any outage
            raise IngestPostponed(
                f"the array store did not answer when the ingest's process opened it: {exc}"
            ) from None
        raise


def _progress(run_id: int) -> ProgressCallback:
    messages, cancel = _child["messages"], _child["cancel"]
    last = [0.0]

    def progress(done: int, total: int) -> None:
        _check(cancel)
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY or done >= total:
            last[0] = now
            with contextlib.suppress(queue.Full):
                messages.put_nowait(_Progress(run_id, done, total))

    return progress


def _complete(
    pending: PendingRun, inputs: list[InputFile], keep_failure: bool, notes: bool, again: bool
) -> IngestResult:
    ingestor = _opened_ingestor()
    listener = _Notes(pending.run_id) if notes else None
    return ingestor.complete(pending, inputs, _progress(pending.run_id), keep_failure, listener=listener, again=again)


def _complete_pair(
    pendings: list[PendingRun],
    inputs: list[list[InputFile]],
    keep_failure: bool,
    notes: bool,
    again: bool,
    pair_taps: PairTapsOf,
) -> _PairDone:
    """`_complete` of a reference and a candidate at once, in two threads, their blocks handed to the taps
    `pair_taps` makes (without them where it fails: the pairs are then compared from the stored copies); each run's
    result or what it raised. The memory limit is twice one ingest's meanwhile: two ingests share it."""
    ingestor = _opened_ingestor()
    run_ids = (pendings[0].run_id, pendings[1].run_id)
    taps: PairTaps | None = None
    if notes:  # what the taps find is for the server's listeners
        try:
            taps = pair_taps(ingestor, pendings[0].session_id, run_ids)
        except Exception:
            log.exception("the taps of runs %s could not be set up: their pairs are read from the store", run_ids)
    listeners = [_Notes(run_id, taps) if notes else None for run_id in run_ids]

    def ingest(side: int) -> IngestResult | BaseException:
        tap = taps.tap(side) if taps is not None else None
        try:
            return ingestor.complete(
                pendings[side],
                inputs[side],
                _progress(run_ids[side]),
                keep_failure,
                listener=listeners[side],
                again=again,
                tap=tap,
            )
        except Exception as exc:  # raised for this run alone, as `_complete` would
            return exc

    limit = _child["limit"]
    _limit_memory(2 * limit)
    try:
        with ThreadPoolExecutor(2, thread_name_prefix="ingest-pair") as pool:
            outcomes = list(pool.map(ingest, (0, 1)))
    finally:
        _limit_memory(limit)
    # both closed: why the pairs not found in memory were not (with the answer: a message could come after it)
    return _PairDone(tuple(outcomes), tuple(taps.take_found()) if taps is not None else ())
