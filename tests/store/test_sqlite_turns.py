"""Writers of one process to one SQLite file take turns (`store/sqlite_turns.py`): a second writer waits in this
process until the first is done, instead of in SQLite's busy handler (which sleeps past the first one's commit);
a turn is held exactly while SQLite's write lock could be, and waited for at most the connection's busy timeout."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError
from tensor_debugger.store.database import create_db_engine
from tensor_debugger.store.sqlite_turns import turns_of

WAIT_S = 30  # for a thread to get where it is going: ample, never reached when things work


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    made = create_db_engine(f"sqlite:///{tmp_path / 'metadata.sqlite3'}")
    with made.begin() as connection:
        connection.execute(text("CREATE TABLE kept (name TEXT)"))
    yield made
    made.dispose()


def waiting_for_turn(thread: threading.Thread) -> bool:
    """Whether `thread` is waiting for its turn (in `sqlite_turns`' `_before`)."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code.co_name == "_before" and frame.f_code.co_filename.endswith("sqlite_turns.py"):
            return True
        frame = frame.f_back
    return False


def test_a_second_writer_reaches_sqlite_only_once_the_first_committed(engine: Engine) -> None:
    events: list[str] = []
    lock = threading.Lock()

    def note(what: str) -> None:
        with lock:
            events.append(what)

    first = engine.connect()
    first.execute(text("INSERT INTO kept VALUES ('first')"))  # its transaction open: it holds the write lock
    failed: list[BaseException] = []

    def second_writer() -> None:
        try:
            with engine.begin() as connection:
                raw = connection.connection.dbapi_connection
                assert raw is not None
                raw.set_trace_callback(lambda sql: note(f"second: {sql}") if sql.startswith("INSERT") else None)
                connection.execute(text("INSERT INTO kept VALUES ('second')"))
                raw.set_trace_callback(None)
        except BaseException as exc:  # noqa: BLE001 - said by the test below
            failed.append(exc)

    thread = threading.Thread(target=second_writer)
    thread.start()
    seen = threading.Event()
    for _ in range(WAIT_S * 1000):  # until it waits for its turn, or (without turns) its INSERT reached SQLite
        if waiting_for_turn(thread) or any(e.startswith("second") for e in events):
            break
        seen.wait(0.001)
    note("first: commit")
    first.commit()
    first.close()
    thread.join(WAIT_S)
    assert not thread.is_alive() and not failed, failed
    assert events[0] == "first: commit", events  # the second INSERT ran in SQLite after the commit, not before
    assert events[1:] == ["second: INSERT INTO kept VALUES ('second')"]
    with engine.connect() as connection:
        assert sorted(connection.scalars(text("SELECT name FROM kept"))) == ["first", "second"]
    assert not turns_of(str(engine.url.database)).locked()


def test_a_writer_waits_no_longer_than_its_busy_timeout_and_a_rollback_gives_the_turn_back(engine: Engine) -> None:
    first = engine.connect()
    first.execute(text("INSERT INTO kept VALUES ('first')"))
    with engine.connect() as second:
        second.exec_driver_sql("PRAGMA busy_timeout=20")  # as a short lock wait sets it (session_figures.py)
        with pytest.raises(OperationalError, match="database is locked"):
            second.execute(text("INSERT INTO kept VALUES ('second')"))
        second.rollback()
        first.rollback()  # the turn given back: the second writes at once
        first.close()
        second.execute(text("INSERT INTO kept VALUES ('second')"))
        second.commit()
        assert list(second.scalars(text("SELECT name FROM kept"))) == ["second"]
    assert not turns_of(str(engine.url.database)).locked()


def test_ddl_outside_a_transaction_gives_its_turn_back_at_once(engine: Engine) -> None:
    turns = turns_of(str(engine.url.database))
    with engine.connect() as connection:
        connection.execute(text("CREATE TABLE other (name TEXT)"))  # pysqlite begins no transaction before DDL
        assert not turns.locked()
        connection.execute(text("INSERT INTO other VALUES ('x')"))  # a write begins one: the turn is held
        assert turns.locked()
        connection.commit()
        assert not turns.locked()
