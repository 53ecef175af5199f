"""Start-up recovery: remove what an ingest killed midway (kill -9, power loss) left behind.

A run still "ingesting" whose process is gone on this host, or whose ingest on another host (a server replica)
stopped renewing its lease (store/claims.py), is deleted with its arrays, and so is its session when one of the
dead ingests made it and nothing is left in it once they are all gone (a `compare` killed mid-ingest leaves no
empty session); the server also does this on its claims' heartbeat. A run of an accepted upload whose staged files
are still there is not deleted but taken over by a server (`remove_dead_ingests`'s `take_over`): ingested again
from those files. The folder under "runs/" of a run that no longer exists (a deletion cut short between its rows and
its arrays) is deleted too, but for the arrays in it that tensor rows of other runs still name (arrays are shared:
see `catalog.release_arrays`), and so are the arrays under a failed run's folder (its ingest's, whose deletion the
store failed) once the store answers. Only folders this database recorded when it created their runs
(`ArrayFolderRecord`) are looked at: the store is never listed for what to delete, so nothing another database
wrote is deleted (store/identity.py keeps a process from being given another database's store at all).

A run that names this very process is alive only if it is one of `live` (the runs this process's ingestor is
working on, in its background threads): otherwise it was left by an earlier process that had the same id, as
happens when a container restarts and the server is process 1 again.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from tensor_debugger.store.arrays import ArrayStore, run_prefix
from tensor_debugger.store.catalog import keys_under
from tensor_debugger.store.claims import DEFAULT_LEASE_SECONDS, Claims
from tensor_debugger.store.compared_against import forget
from tensor_debugger.store.database import lock_arrays
from tensor_debugger.store.models import ArrayFolderRecord, ProblemRecord, RunRecord, SessionRecord, TensorRecord

log = logging.getLogger(__name__)
# a run's problem when its ingest died and the uploaded files it was to be ingested from again are gone
LOST = "its ingest stopped (its process died) and the uploaded files were gone before it could be tried again"
# readies a dead ingest's run for this process in recovery's transaction; what it returns queues the ingest
TakeOver = Callable[[DbSession, RunRecord], Callable[[], object]]


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


def stale(run: RunRecord, host: str, now: float, live: Collection[int]) -> bool:
    """Whether the run's ingest is dead: on this host, its process is gone (or is this one, not ingesting it);
    on another host, its lease has expired (that process renewed it while it lived)."""
    if run.ingest_host == host:
        return not ingest_alive(run.ingest_pid, run.id, live)
    return run.claimed_until is not None and run.claimed_until < now


def recover(
    sessions: sessionmaker[DbSession],
    store: ArrayStore,
    live: Callable[[], Collection[int]] = frozenset,
    claims: Claims | None = None,
    resumable: Callable[[RunRecord], bool] = lambda run: False,
    take_over: TakeOver | None = None,
) -> RecoveryReport:
    """Remove the runs whose ingest died (or take them over: see `remove_dead_ingests`), then what the folders of
    runs gone hold that no row names, and what a failed run's folder holds (see the module's docstring)."""
    removed = remove_dead_ingests(sessions, store, live, claims, resumable, take_over)
    return RecoveryReport(removed, remove_orphan_arrays(sessions, store))


def remove_orphan_arrays(sessions: sessionmaker[DbSession], store: ArrayStore) -> int:
    """Delete, in each folder this database recorded (`ArrayFolderRecord`) whose run is gone or failed, the arrays
    no tensor row names, and the record once nothing in the folder is named; returns how many deletions were made (a
    whole folder counts once). A failed run has no arrays: any in its folder are what its ingest wrote before the
    store failed it (deleted here once the store answers). The store itself is never listed for folders: one this
    database did not record (another database's, in a store they were wrongly given both) is left alone."""
    alive = select(RunRecord.id).where(RunRecord.id == ArrayFolderRecord.run_id, RunRecord.status != "failed")
    with sessions() as db:
        query = select(ArrayFolderRecord.run_id).where(~alive.exists()).order_by(ArrayFolderRecord.run_id)
        gone = list(db.scalars(query))
    removed = 0
    for run_id in gone:
        with sessions.begin() as db:
            # A write first (SQLite's writer lock from here) and the arrays' lock: no ingest points a new row at an
            # array of this folder while it is read and deleted. The record gone: another process did it meanwhile.
            touched = db.execute(
                update(ArrayFolderRecord)
                .where(ArrayFolderRecord.run_id == run_id)
                .values(run_id=ArrayFolderRecord.run_id)
            )
            if not touched.rowcount:  # type: ignore[attr-defined]
                continue
            lock_arrays(db)
            run = db.get(RunRecord, run_id)
            if run is not None and run.status != "failed":  # a new run took the id (SQLite reuses a deleted one's)
                continue
            prefix = run_prefix(run_id)
            named = set(db.scalars(select(TensorRecord.store_key).where(keys_under(prefix))))
            stored = store.children(prefix)
            if not named:
                if stored:
                    store.delete(prefix)
                    removed += 1
                db.execute(delete(ArrayFolderRecord).where(ArrayFolderRecord.run_id == run_id))
                continue
            for child in stored:
                key = f"{prefix}/{child}"
                if child.isdigit() and key not in named:
                    store.delete(key)
                    removed += 1
    return removed


def remove_dead_ingests(
    sessions: sessionmaker[DbSession],
    store: ArrayStore,
    live: Callable[[], Collection[int]] = frozenset,
    claims: Claims | None = None,
    resumable: Callable[[RunRecord], bool] = lambda run: False,
    take_over: TakeOver | None = None,
) -> int:
    """Remove each run left "ingesting" by a dead ingest, with its arrays (and its session, when that ingest made
    it and nothing else is in it); returns how many. A run of an accepted upload whose staged files are all there
    (`resumable`) is never removed: with `take_over` (a server's), this process claims it and `take_over` readies
    it in the claim's transaction, returning what queues its ingest once committed; without, it is left for a
    server. One whose staged files are gone is kept "failed", saying so. Each is first claimed from the claim it
    was read with, so of several processes recovering at once (server replicas) one removes or takes it. `live`
    gives the runs this process is ingesting (`Ingestor.live_runs`), asked after the runs are read: a run joins it
    before its row is committed, so every run of this process that the query sees is in it (asked before, a run
    begun in between was taken for dead and deleted under its ingest)."""
    host, now = socket.gethostname(), time.time()
    claims = claims or Claims(sessions, DEFAULT_LEASE_SECONDS)
    with sessions() as db:
        ingesting = list(db.scalars(select(RunRecord).where(RunRecord.status == "ingesting")))
        alive = live()
        dead = [
            (run.id, run.claimed_by, run.claimed_until, resumable(run))
            for run in ingesting
            if stale(run, host, now, alive)
        ]
    removed = 0
    queued: list[Callable[[], object]] = []
    made: set[int] = set()  # the sessions a removed run's ingest made
    for run_id, owner, until, waiting in dead:
        if waiting and take_over is None:
            continue  # a server takes it over
        with sessions.begin() as db:
            if not claims.take_run(db, run_id, owner, until):
                continue  # another process took it meanwhile (or its ingest finished)
            lock_arrays(db)
            run = db.get_one(RunRecord, run_id)
            if waiting and take_over is not None:
                try:  # its arrays deleted first: where the store does not answer, the claim is undone
                    queued.append(take_over(db, run))
                    continue
                except Exception:
                    log.exception("taking over run %s failed; tried again later", run_id)
                    db.rollback()
                    continue
            store.delete(run_prefix(run.id))
            if run.staged_inputs:  # an accepted upload: its page says why it is gone
                db.add(ProblemRecord(run_id=run.id, file=", ".join(run.sources) or "upload", reason=LOST))
                run.status, run.ingest_pid, run.staged_inputs = "failed", None, None
                continue
            if run.created_session:
                made.add(run.session_id)
            forget(db, run.id)
            db.delete(run)
            removed += 1
    # once all are gone: a compare killed mid-ingest left two runs, the first of which made the session; removed
    # first, the other still held the session, which was then left empty
    for session_id in made:
        with sessions.begin() as db:
            if not db.scalar(select(func.count()).where(RunRecord.session_id == session_id)):
                session = db.get(SessionRecord, session_id)
                if session is not None:
                    db.delete(session)
    for queue_it in queued:
        try:
            queue_it()
        except Exception:  # the server is stopping: the run stays this process's until it exits, then another's
            log.exception("queueing a taken-over ingest failed")
    return removed
