"""Keeping the sessions list's figures waits at most `LOCK_WAIT_MS` for SQLite's locks, on its own connection only:
every connection the pool hands out afterwards waits the database's usual `SQLITE_BUSY_MS`. (It once set the short
wait on one pooled connection and the usual one back on another: a later ingest or comparison given the first
failed with "database is locked" after a tenth of a second.)"""

from __future__ import annotations

import sqlite3
from contextlib import ExitStack
from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.orm import sessionmaker
from tensor_debugger.store.database import SQLITE_BUSY_MS, create_db_engine, upgrade_database
from tensor_debugger.store.models import SessionFiguresRecord, SessionRecord
from tensor_debugger.store.session_figures import JudgedFigures, keep_figures

CONNECTIONS = 4


def _database(tmp_path: Path) -> tuple[Engine, sessionmaker, int]:  # type: ignore[type-arg]
    engine = create_db_engine(f"sqlite:///{tmp_path / 'metadata.sqlite3'}")
    upgrade_database(engine)
    sessions = sessionmaker(engine)
    with sessions.begin() as db:
        session = SessionRecord(name="figures")
        db.add(session)
        db.flush()
        session_id = session.id
    return engine, sessions, session_id


def _waits(engine: Engine) -> list[int]:
    """The busy timeout of each of `CONNECTIONS` connections the pool hands out at once (its idle ones first)."""
    with ExitStack() as held:
        connections = [held.enter_context(engine.connect()) for _ in range(CONNECTIONS)]
        return [int(c.exec_driver_sql("PRAGMA busy_timeout").scalar_one()) for c in connections]


def _fill_pool(engine: Engine) -> None:
    """`CONNECTIONS` connections made and given back: the pool holds that many idle."""
    _waits(engine)


def test_keeping_figures_leaves_every_pooled_connection_waiting_as_usual(tmp_path: Path) -> None:
    engine, sessions, session_id = _database(tmp_path)
    _fill_pool(engine)
    for fingerprint in ("first", "second", "third"):
        keep_figures(sessions, {session_id: (fingerprint, JudgedFigures(2, "1_attn", 7))})
        assert _waits(engine) == [SQLITE_BUSY_MS] * CONNECTIONS
    with sessions() as db:
        kept = db.scalars(select(SessionFiguresRecord.fingerprint)).all()
    assert kept == ["third"]


def test_figures_not_kept_while_another_process_writes_and_the_waits_are_as_usual(tmp_path: Path) -> None:
    """Another connection (another process's) holds the writer lock: nothing is kept, nothing raised."""
    engine, sessions, session_id = _database(tmp_path)
    _fill_pool(engine)
    writer = sqlite3.connect(tmp_path / "metadata.sqlite3", isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        keep_figures(sessions, {session_id: ("locked", JudgedFigures(0, None, None))})
        writer.execute("COMMIT")
    finally:
        writer.close()
    assert _waits(engine) == [SQLITE_BUSY_MS] * CONNECTIONS
    with sessions() as db:
        assert db.scalars(select(SessionFiguresRecord.fingerprint)).all() == []
