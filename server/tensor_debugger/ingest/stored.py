"""What an ingest tells of a run's tensors as their arrays are stored, before the run is ready: each tensor's name
(as its row will have it), array and digest. Small and typed, so that an ingest in a child process (`child.py`)
can send it to the server, which compares pairs whose two tensors are stored (`compare/compute/early_uploads.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Protocol

from tensor_debugger.engine.names import tensor_name
from tensor_debugger.ingest.inputs import TensorFileEntry
from tensor_debugger.ingest.writer import StoredTensor

Stored = tuple[TensorFileEntry, tuple[str, ...], StoredTensor]  # a tensor's file, key path and array


class StoredListener(Protocol):
    """Told of a run's tensors as their arrays are written, before the run is ready (a comparison that starts
    while the rest ingests: `compare/early.py`)."""

    def stored(self, tensors: Sequence[Stored]) -> None:
        """The tensors of one file, their arrays complete, under the run's prefix."""

    def settle(self) -> None:
        """Return once done with the arrays `stored` named: the ingest may now move or delete them (sharing an
        identical array, removing a failed run)."""


@dataclass(frozen=True)
class StoredNote:
    """One stored tensor of a run being ingested."""

    name: str  # as the run's row will name it, unless a second tensor of the run has the same name
    store_key: str  # its array, under the run's prefix until the run is ready
    digest: str
    dtype: str  # a LogicalDtype's name
    shape: tuple[int, ...]


class NoteListener(Protocol):
    """Told of a run's tensors as they are stored (the server's side of a `StoredListener`)."""

    def stored(self, notes: Sequence[StoredNote]) -> None:
        """The tensors of one file, their arrays complete."""

    def settle(self) -> None:
        """Return once done with the arrays `stored` named: the ingest may now move or delete them."""


def stored_name(entry: TensorFileEntry, key_path: tuple[str, ...]) -> str:
    """A stored tensor's name: its file's path inside the run and its key path in the file."""
    if entry.module_path is not None and key_path == ("data",):
        key_path = ()  # a trace's file holds one tensor under "data": the file names it
    return tensor_name(PurePosixPath(entry.relpath), key_path)


def note_of(entry: TensorFileEntry, key_path: tuple[str, ...], tensor: StoredTensor) -> StoredNote:
    return StoredNote(stored_name(entry, key_path), tensor.store_key, tensor.digest, tensor.dtype.name, tensor.shape)


class NotesOf:
    """A `StoredListener` (runs.py) that hands a `NoteListener` the notes of what is stored."""

    def __init__(self, listener: NoteListener) -> None:
        self._listener = listener

    def stored(self, tensors: Sequence[tuple[TensorFileEntry, tuple[str, ...], StoredTensor]]) -> None:
        self._listener.stored([note_of(*item) for item in tensors])

    def settle(self) -> None:
        self._listener.settle()
