"""What runs in an ingest's child process (`child.py`): its start, its ingestor, its ingests (one run, or a
reference and a candidate at once), each telling the server its progress and stored tensors, stopping when asked
or when the server is gone."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import resource
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.synchronize import Event
from typing import Any

from tensor_debugger.errors import IngestPostponed, is_outage
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
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.outcomes import IngestCancelled
from tensor_debugger.ingest.runs import Ingestor, IngestResult, PendingRun
from tensor_debugger.ingest.stored import Stored, note_of
from tensor_debugger.ingest.taps import PairTaps
from tensor_debugger.settings import Settings
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.database import create_db_engine, make_sessionmaker

log = logging.getLogger(__name__)

NICENESS = 5  # added to the child's CPU priority: the server's requests come first, ingests still progress
PROGRESS_EVERY = 0.1  # seconds between two progress messages of one ingest
PARENT_POLL = 0.2  # seconds between a child's checks that the server is still there


_child: dict[str, Any] = {}  # in a child only, filled by `start_child`: its ingestor, queue and stop signal


def start_child(
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
    been given otherwise than in its environment); `replies`: its slot's queue of replies to its `SettleMessage`s.
    `server`: the server's process id."""
    limit = _limit_memory(settings.ingest_memory_limit)
    os.nice(NICENESS)
    # the server's id as it gave it: one killed before this child got here is already gone, and its id read here
    # would be that of the process that adopted the child, which `_die_with` would wait on for ever
    threading.Thread(target=_die_with, args=(server,), name="die-with-server", daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which stops the children
    messages.put(StartedMessage(slot, os.getpid()))
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
        made.reading = lambda run_id, label: messages.put(ReadingMessage(run_id, label))
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
        _child["messages"].put(StoredMessage(self.run_id, tuple(note_of(*item) for item in tensors)))

    def tell_found(self) -> None:
        found = self.taps.take_found() if self.taps is not None else ()
        if found:
            _child["messages"].put(FoundMessage(self.run_id, tuple(found)))

    def settle(self) -> None:
        replies, cancel = _child["replies"], _child["cancel"]
        _child["messages"].put(SettleMessage(self.run_id, _child["slot"]))
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
                messages.put_nowait(ProgressMessage(run_id, done, total))

    return progress


def complete_in_child(
    pending: PendingRun, inputs: list[InputFile], keep_failure: bool, notes: bool, again: bool
) -> IngestResult:
    ingestor = _opened_ingestor()
    listener = _Notes(pending.run_id) if notes else None
    return ingestor.complete(pending, inputs, _progress(pending.run_id), keep_failure, listener=listener, again=again)


def complete_pair_in_child(
    pendings: list[PendingRun],
    inputs: list[list[InputFile]],
    keep_failure: bool,
    notes: bool,
    again: bool,
    pair_taps: PairTapsOf,
) -> PairDone:
    """`complete_in_child` of a reference and a candidate at once, in two threads, their blocks handed to the taps
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
        except Exception as exc:  # raised for this run alone, as `complete_in_child` would
            return exc

    limit = _child["limit"]
    _limit_memory(2 * limit)
    try:
        with ThreadPoolExecutor(2, thread_name_prefix="ingest-pair") as pool:
            outcomes = list(pool.map(ingest, (0, 1)))
    finally:
        _limit_memory(limit)
    # both closed: why the pairs not found in memory were not (with the answer: a message could come after it)
    return PairDone(tuple(outcomes), tuple(taps.take_found()) if taps is not None else ())
