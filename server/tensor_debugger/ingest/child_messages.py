"""What an ingest's child process and the server say to each other (through the child's queue, and the
answer of `complete_pair`), and the callables each is handed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tensor_debugger.ingest.runs import Ingestor, IngestResult
from tensor_debugger.ingest.stored import StoredNote
from tensor_debugger.ingest.taps import PairTaps

ProgressCallback = Callable[[int, int], None]
PairTapsOf = Callable[[Ingestor, int, tuple[int, int]], PairTaps]  # (child's ingestor, session, runs) -> taps


@dataclass(frozen=True)
class ProgressMessage:  # child to server: bytes copied of the run's total
    run_id: int
    done: int
    total: int


@dataclass(frozen=True)
class StoredMessage:  # child to server: the tensors of one file are stored
    run_id: int
    notes: tuple[StoredNote, ...]


@dataclass(frozen=True)
class FoundMessage:  # child to server: what a pair of runs' taps found (`PairTaps.take_found`), before a StoredMessage
    run_id: int
    found: tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class PairDone:  # a child's answer to `complete_pair`: each run's outcome, and what its taps found last
    outcomes: tuple[IngestResult | BaseException, ...]
    found: tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class ReadingMessage:  # child to server: the run's ingest opens the file `label`
    run_id: int
    label: str


@dataclass(frozen=True)
class StartedMessage:  # child to server: the child of the slot is process `pid`
    slot: int
    pid: int


@dataclass(frozen=True)
class SettleMessage:  # child to server: the run's arrays are about to move; reply with the run's id on `replies[slot]`
    run_id: int
    slot: int
