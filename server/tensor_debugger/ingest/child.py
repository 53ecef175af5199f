"""The server's ingests, run in child processes so that they cannot starve request handling.

An ingest in one of the server's threads competes with every request for the interpreter lock (unpickling,
Python loops between the C calls) and, on a machine with few cores, for the CPU. Here each runs in a child process
(started with spawn: no lock or thread is inherited), at a lower CPU priority (nice 5): the server's threads keep
their interpreter lock to themselves, and its requests get the CPU first. The children are started on the first
ingest, `at_once` of them at most, and kept for the next ones; each ends within a fraction of a second of the
server's death, whatever killed it, so a killed server leaves no ingest running (the next start cleans up).

The server makes the run's row (`Ingestor.begin`) and keeps it among its live runs while a child fills it; the child
reports progress through a queue and stops at its next block when the server asks (`close`). Given a listener, the
child also tells each file's stored tensors (`stored.StoredNote`) and, before its run's arrays may move, waits
until the server's listener has settled (its comparisons reading them are done: `compare/early_uploads.py`). A
child that dies midway (killed, out of memory) leaves the run to the server, which removes it or marks it failed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from typing import Any

from tensor_debugger.engine.fused import configure as configure_kernels
from tensor_debugger.errors import FileProblem, IngestPostponed
from tensor_debugger.ingest import staging
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.runs import IngestCancelled, Ingestor, IngestResult, PendingRun, Stored
from tensor_debugger.ingest.stored import NoteListener, StoredNote, note_of
from tensor_debugger.settings import Settings
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.database import create_db_engine, make_sessionmaker

log = logging.getLogger(__name__)

NICENESS = 5  # added to the child's CPU priority: the server's requests come first, ingests still progress
PROGRESS_EVERY = 0.1  # seconds between two progress messages of one ingest
PARENT_POLL = 0.2  # seconds between a child's checks that the server is still there

ProgressCallback = Callable[[int, int], None]


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
class _Settle:  # child to server: the run's arrays are about to move; reply with the run's id on `replies[slot]`
    run_id: int
    slot: int


class ChildIngests:
    """Runs `Ingestor.complete` in child processes, `at_once` at most."""

    def __init__(self, settings: Settings, ingestor: Ingestor, at_once: int) -> None:
        self.settings = settings
        self.ingestor = ingestor  # the server's: it began the runs, and takes them back from a child that died
        self.at_once = at_once
        self._context = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._messages: Any = None  # a multiprocessing queue of _Progress, _Stored and _Settle, made with the pool
        self._replies: list[Any] = []  # the pool's children's queues of settled run ids, one per child
        self._cancel: Event | None = None
        self._callbacks: dict[int, ProgressCallback] = {}
        self._listeners: dict[int, NoteListener] = {}
        self._reader: threading.Thread | None = None
        self._closed = False

    def complete(
        self,
        pending: PendingRun,
        inputs: list[InputFile],
        keep_failure: bool,
        progress: ProgressCallback,
        listener: NoteListener | None = None,
        again: bool = False,
    ) -> IngestResult:
        """`Ingestor.complete` in a child process; raises what it raises (NothingUsableError, DiskFullError,
        IngestCancelled, IngestPostponed: then the run stays among the server's live runs, ...). `listener` hears,
        in the server, of the tensors the child stores."""
        notes, postponed = listener is not None, False
        with self._lock:
            self._callbacks[pending.run_id] = progress
            if listener is not None:
                self._listeners[pending.run_id] = listener
        try:
            try:
                pool = self._open()
            except IngestCancelled:  # the server is stopping: the run is undone as if it never began
                if not pending.staged:  # but an accepted upload's, which the next start takes over
                    self.ingestor.cancel(pending)
                raise
            try:
                future = pool.submit(_complete, pending, inputs, keep_failure, notes, again)
            except BrokenProcessPool:  # an idle child died (killed, say): the ingest has not begun; new children
                self._reset(pool)
                pool = self._open()
                future = pool.submit(_complete, pending, inputs, keep_failure, notes, again)
            return future.result()
        except IngestPostponed:
            postponed = True
            raise
        except CancelledError:  # the server stopped before a child took it: as an ingest that never began
            if not pending.staged:  # but an accepted upload's run stays, for the next start to take over
                self.ingestor.cancel(pending)
            raise IngestCancelled("the server stopped before this ingest began") from None
        except BrokenProcessPool:
            # waiting for the pool's own thread, which reaps the dead child: its pipe closes before it is a zombie,
            # and until then the sweep below would take its staging folder for a live process's
            self._reset(pool, wait=True)
            try:  # what the dead child left; an upload waiting to be ingested stays
                staging.sweep(self.settings.staging_dir, self.ingestor.staged_folders())
            except Exception:  # the database did not answer: the next sweep removes it
                log.exception("sweeping what the ingest of run %s left", pending.run_id)
            what = ", ".join(i.label for i in inputs) or "upload"
            if self._closed:
                if not pending.staged:  # an accepted upload's run stays, for the next start to take over
                    self.ingestor.give_up(pending, [], False)
                raise IngestCancelled("the server is stopping") from None
            self.ingestor.give_up(pending, [FileProblem(what, "the ingest's process died")], keep_failure)
            raise
        finally:
            with self._lock:
                self._callbacks.pop(pending.run_id, None)
                self._listeners.pop(pending.run_id, None)
            if not postponed:
                self.ingestor.forget(pending.run_id)

    def _reset(self, pool: ProcessPoolExecutor, wait: bool = False) -> None:
        """Let go of a pool one of whose children died; the next ingest starts new ones. `wait`: until the pool's
        thread has reaped its children."""
        with self._lock:
            if self._pool is pool:
                self._pool = None
        pool.shutdown(wait=wait)

    def close(self) -> None:
        """Ask every child to stop at its next block of bytes, and let them go."""
        with self._lock:
            self._closed = True
            pool, cancel, messages = self._pool, self._cancel, self._messages
            self._pool = None
        if cancel is not None:
            cancel.set()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if messages is not None:
            messages.put(None)  # ends the reader

    def _open(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._closed:
                raise IngestCancelled("the server is stopping")
            if self._pool is None:
                if self._messages is None:
                    self._messages = self._context.Queue()
                    self._cancel = self._context.Event()
                    self._reader = threading.Thread(target=self._read, name="ingest-progress", daemon=True)
                    self._reader.start()
                # per pool: a pool's children take a slot each (its queue of replies) as they start
                self._replies = [self._context.Queue() for _ in range(self.at_once)]
                slots = self._context.Value("i", 0)
                self._pool = ProcessPoolExecutor(
                    self.at_once,
                    mp_context=self._context,
                    initializer=functools.partial(
                        _start,
                        os.getpid(),
                        self.settings,
                        self.ingestor.store.environ,
                        self._messages,
                        self._cancel,
                        self._replies,
                        slots,
                    ),
                )
            return self._pool

    def _read(self) -> None:
        while True:
            message = self._messages.get()
            if message is None:
                return
            with self._lock:
                callback = self._callbacks.get(message.run_id)
                listener = self._listeners.get(message.run_id)
                replies = self._replies
            try:
                if isinstance(message, _Progress) and callback is not None:
                    callback(message.done, message.total)
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
    replies: list[Any],
    slots: Any,
) -> None:
    """A child's set-up: its own database engine, and the server's array store opened with the server's AWS
    variables (`store_environ`: an s3:// store's endpoint and credentials, which the server may have been given
    otherwise than in its environment); its slot, the queue of replies to its `_Settle`s. `server`: the server's
    process id."""
    with slots.get_lock():
        slot = slots.value % len(replies)
        slots.value += 1
    os.nice(NICENESS)
    # the server's id as it gave it: one killed before this child got here is already gone, and its id read here
    # would be that of the process that adopted the child, which `_die_with` would wait on for ever
    threading.Thread(target=_die_with, args=(server,), name="die-with-server", daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which stops the children
    configure_kernels(settings.kernel, settings.kernel_family)
    engine = create_db_engine(settings.database_url)
    _child.update(
        ingestor=Ingestor(
            settings, make_sessionmaker(engine), ArrayStore(settings.store_url, store_environ, settings.direct_writes)
        ),
        messages=messages,
        cancel=cancel,
        server=server,
        slot=slot,
        replies=replies[slot],
    )


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
    """The child's `StoredListener`: tells the server what is stored, and waits for its listener to settle."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id

    def stored(self, tensors: Sequence[Stored]) -> None:
        _child["messages"].put(_Stored(self.run_id, tuple(note_of(*item) for item in tensors)))

    def settle(self) -> None:
        replies, cancel = _child["replies"], _child["cancel"]
        _child["messages"].put(_Settle(self.run_id, _child["slot"]))
        while True:
            _check(cancel)
            try:
                settled = replies.get(timeout=PARENT_POLL)
            except queue.Empty:
                continue
            if settled == self.run_id:
                return


def _complete(
    pending: PendingRun, inputs: list[InputFile], keep_failure: bool, notes: bool, again: bool
) -> IngestResult:
    ingestor: Ingestor = _child["ingestor"]
    messages, cancel = _child["messages"], _child["cancel"]
    last = [0.0]

    def progress(done: int, total: int) -> None:
        _check(cancel)
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY or done >= total:
            last[0] = now
            with contextlib.suppress(queue.Full):
                messages.put_nowait(_Progress(pending.run_id, done, total))

    listener = _Notes(pending.run_id) if notes else None
    return ingestor.complete(pending, inputs, progress, keep_failure, listener=listener, again=again)
