"""Start-up recovery: remove what an ingest killed midway (kill -9, power loss) left behind.

A run still "ingesting" whose process is gone on this host is deleted with its arrays (and its session, when
that ingest created it and nothing else is in it). The folder under "runs/" of a run that no longer exists is
deleted too, but for the arrays in it that tensor rows of other runs still name (arrays are shared: see
`catalog.release_arrays`).

A run that names this very process is alive only if it is one of `live` (the runs this process's ingestor is
working on, in its background threads): otherwise it was left by an earlier process that had the same id, as
happens when a container restarts and the server is process 1 again.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from tensor_debugger.store.arrays import ArrayStore, run_prefix
from tensor_debugger.store.catalog import keys_under
from tensor_debugger.store.models import RunRecord, SessionRecord, TensorRecord


@dataclass(frozen=True)
class RecoveryReport:
    runs_removed: int
    orphan_arrays_removed: int


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs: one that exited but was not yet reaped by its parent (a zombie, such as a
    killed ingest child its pool has not joined yet) is dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (another OS): signal 0 is all there is to go by
    fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces and parentheses
    return not fields or fields[0] not in ("Z", "X")


def ingest_alive(pid: int | None, run_id: int, live: Collection[int]) -> bool:
    if pid is None:
        return False
    if pid == os.getpid():
        return run_id in live
    return process_alive(pid)


def recover(sessions: sessionmaker[DbSession], store: ArrayStore, live: Collection[int] = ()) -> RecoveryReport:
    host = socket.gethostname()
    removed = 0
    # Listed before the runs are read: a run row is always committed before its first array is written, so
    # every array seen here whose run is alive is known by the query below.
    stored = [name for name in store.children("runs") if name.isdigit()]  # not the group's zarr.json
    with sessions.begin() as db:
        stale = [
            run
            for run in db.scalars(select(RunRecord).where(RunRecord.status == "ingesting"))
            if run.ingest_host == host and not ingest_alive(run.ingest_pid, run.id, live)
        ]
        for run in stale:
            store.delete(run_prefix(run.id))
            session_id, created = run.session_id, run.created_session
            db.delete(run)
            db.flush()
            removed += 1
            if created and not db.scalar(select(func.count()).where(RunRecord.session_id == session_id)):
                session = db.get(SessionRecord, session_id)
                if session is not None:
                    db.delete(session)
        known = {str(run_id) for run_id in db.scalars(select(RunRecord.id))}
        orphans = [name for name in stored if name not in known]
        shared = {
            name: set(db.scalars(select(TensorRecord.store_key).where(keys_under(f"runs/{name}")))) for name in orphans
        }
    removed_arrays = 0
    for name in orphans:
        if not shared[name]:
            store.delete(f"runs/{name}")
            removed_arrays += 1
            continue
        for child in store.children(f"runs/{name}"):
            key = f"runs/{name}/{child}"
            if child.isdigit() and key not in shared[name]:
                store.delete(key)
                removed_arrays += 1
    return RecoveryReport(removed, removed_arrays)
