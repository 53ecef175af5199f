"""Every connection to a SQLite data dir's database runs in WAL mode with synchronous=NORMAL and foreign keys on,
whether its file is new (its WAL header written without the rollback journal's syncs, there being no data yet) or
in use; and the data it is given survives the connection (read back by another process's sqlite3)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from sqlalchemy import text
from tensor_debugger.store.database import create_db_engine, upgrade_database


def settings_of(url: str) -> tuple[str, int, int]:
    engine = create_db_engine(url)
    try:
        with engine.connect() as connection:
            mode = connection.scalar(text("PRAGMA journal_mode"))
            synchronous = connection.scalar(text("PRAGMA synchronous"))
            keys = connection.scalar(text("PRAGMA foreign_keys"))
            return str(mode), int(synchronous or 0), int(keys or 0)
    finally:
        engine.dispose()


def test_a_new_and_a_used_database_get_the_same_settings(tmp_path: Path) -> None:
    path = tmp_path / "metadata.sqlite3"
    url = f"sqlite:///{path}"
    assert settings_of(url) == ("wal", 1, 1)  # new: the file made by this connection
    engine = create_db_engine(url)
    upgrade_database(engine)  # the schema, made from the models and stamped, in WAL mode
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE kept (name TEXT)"))
        connection.execute(text("INSERT INTO kept VALUES ('kept')"))
    engine.dispose()
    assert settings_of(url) == ("wal", 1, 1)  # in use
    with sqlite3.connect(path) as plain:  # outside SQLAlchemy: the file's header says WAL
        assert plain.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    read = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sqlite3; print(sqlite3.connect({str(path)!r}).execute('SELECT name FROM kept').fetchall())",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert read.stdout.strip() == "[('kept',)]"


def test_a_file_that_is_not_a_database_is_refused_as_before(tmp_path: Path) -> None:
    path = tmp_path / "metadata.sqlite3"
    path.write_bytes(b"not a database, " * 512)
    engine = create_db_engine(f"sqlite:///{path}")
    try:
        try:
            with engine.connect():
                raise AssertionError("a file that is not a database was opened")
        except Exception as exc:  # SQLAlchemy's DatabaseError, from sqlite3's
            assert "not a database" in str(exc)
    finally:
        engine.dispose()
    assert path.read_bytes() == b"not a database, " * 512
