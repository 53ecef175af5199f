"""The runs this process is ingesting right now, by database, whichever of its Ingestors began them: recovery never
takes them for dead (a second `open_services` on the same data dir, say a capture beside a server)."""

from __future__ import annotations

import threading


class LiveRuns:
    """The runs this process is ingesting, by database: what a process is doing belongs to the process, not to
    one of the Ingestors it may hold for the same data dir."""

    _lock = threading.Lock()
    _runs: set[tuple[str, int]] = set()  # (database URL, run id)

    @classmethod
    def add(cls, database: str, run_id: int) -> None:
        with cls._lock:
            cls._runs.add((database, run_id))

    @classmethod
    def discard(cls, database: str, run_id: int) -> None:
        with cls._lock:
            cls._runs.discard((database, run_id))

    @classmethod
    def of(cls, database: str) -> frozenset[int]:
        with cls._lock:
            return frozenset(run for url, run in cls._runs if url == database)
