"""Pairs of an upload compared in memory in its ingests' child process (`ingest/child.py`), taken by the server's
early comparisons (`early_uploads.py`) as from a `Lockstep` of their own.

An upload of a reference and a candidate ingests both runs at once in one child process, each handing its blocks
to a `Lockstep` there (`child_lockstep`). Before the child tells the server that a file's tensors are stored, it
sends the pairs finished in memory since (`Lockstep.take_found`: their statistics, blocks and where the error is,
as `in_memory_pairs.InMemoryPair`), so a pair is here before the note of its second tensor makes the server guess it; at
the end it sends why the other pairs were not. The server's guess of such a pair then takes its statistics from
here (`in_memory_pairs.replay`: the same checks as in one process), and reads nothing of the stored copy.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence

from tensor_debugger.compare.compute.in_memory_pairs import InMemoryPair, replay
from tensor_debugger.compare.compute.lockstep import Lockstep
from tensor_debugger.compare.compute.lockstep_handoff import LockstepCounts
from tensor_debugger.compare.compute.pending import PendingPair
from tensor_debugger.compare.context import open_context
from tensor_debugger.engine.streaming import PairJob
from tensor_debugger.ingest.runs import Ingestor
from tensor_debugger.store.models import SessionRecord


class SentPairs:
    """The server's side of a child's `Lockstep`: what it sent (`receive`), by pair name."""

    def __init__(self, runs: tuple[int, int]) -> None:
        self.runs = runs  # (reference run id, candidate run id), as `Lockstep.runs`
        self._lock = threading.Lock()
        self._found: dict[str, InMemoryPair | str] = {}  # by name: finished in memory, or why it was not
        self._why: dict[str, str] = {}  # by name: why the server read back a pair finished in memory
        self._early: set[str] = set()  # guessed before the child sent anything of them
        self._replayed: set[str] = set()

    def receive(self, found: Sequence[tuple[str, object]]) -> None:
        """What the child's `Lockstep.take_found` gave (anything else is ignored: the pair is read back)."""
        with self._lock:
            for name, what in found:
                if isinstance(what, InMemoryPair | str):
                    self._found[name] = what

    def replayed(self, name: str, job: PairJob[PendingPair]) -> PairJob[PendingPair] | None:
        """As `Lockstep.replayed`: `job` with the statistics sent, or None where it must be read from the store."""
        with self._lock:
            found = self._found.get(name)
            if not isinstance(found, InMemoryPair):
                if found is None:
                    self._early.add(name)
                return None
        replayed = replay(found, job)
        with self._lock:
            if replayed is None:
                self._why[name] = "compared otherwise than guessed"
            else:
                self._replayed.add(name)
        return replayed

    def counts(self) -> LockstepCounts:
        """As `Lockstep.counts`, of the pairs sent so far (all of them once the child's ingests are over)."""
        with self._lock:
            read_back: Counter[str] = Counter()
            for name, found in self._found.items():
                if isinstance(found, str):
                    read_back[found] += 1
                elif name in self._replayed:
                    continue
                elif name in self._early:
                    read_back["not finished in memory"] += 1
                else:
                    read_back[self._why.get(name, "not compared early")] += 1
            return LockstepCounts(len(self._replayed), dict(read_back))


def child_lockstep(ingestor: Ingestor, session_id: int, runs: tuple[int, int]) -> Lockstep:
    """In a child process (`ingest/child.py`'s `PairTapsOf`): the `Lockstep` of the session's reference and
    candidate runs `runs`, with the child's store and the kernel and worst-element count of the server's settings
    (those of the comparisons it sends its pairs to: `replay` checks them)."""
    settings = ingestor.settings
    context = open_context(ingestor.sessions, ingestor.store, 1, ingestor.claims, settings.top, ingestor.kernel)
    context.close()  # its pool is not used: a Lockstep computes in the ingests' threads
    with ingestor.sessions() as db:
        record = db.get_one(SessionRecord, session_id)
        db.expunge(record)
    return Lockstep(context, record, runs)
