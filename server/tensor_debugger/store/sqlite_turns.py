"""One writer at a time among this process's connections to a SQLite file, each let in as soon as the one before it
is done.

SQLite lets one connection write at a time. A connection that finds the file's write lock taken waits in SQLite's
busy handler, which sleeps and looks again, 1, 2, 5, 10, 15, 20, 25, 25, ... ms apart (up to `busy_timeout`): it
does not wake when the lock is released, but when its sleep ends. Where two threads of one process write at once (a
first `compare`: both runs' ingests ending together, and the early comparisons' results), the one that waits
slept 30 to 150 ms past the other's commit, on the way to the answer.

Here each connection of an engine (`create_db_engine`) takes its file's `_Turns` lock before its first write
statement of a transaction (INSERT, UPDATE, DELETE, REPLACE, BEGIN IMMEDIATE or EXCLUSIVE, DDL), as SQLite takes
its write lock there, and gives it back once the transaction is over (commit, rollback, close, or a statement after
which no transaction is open: pysqlite begins none before DDL). A writer that waits for it is woken by the release.
The lock mirrors SQLite's own, so no wait arises that SQLite would not have made: it is held exactly while the
connection could hold the write lock, and it is waited for at most the connection's `busy_timeout` (which a
`PRAGMA busy_timeout` sets, as for SQLite), after which the statement fails as SQLite's would ("database is
locked"). Other processes still meet SQLite's busy handler; reads (WAL) never wait.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
from typing import Any

# what takes SQLite's write lock: a write statement, or a transaction begun for writing
_WRITES = re.compile(
    r"\s*(?:INSERT|UPDATE|DELETE|REPLACE|CREATE|DROP|ALTER|BEGIN\s+(?:IMMEDIATE|EXCLUSIVE))\b", re.IGNORECASE
)
_BUSY_TIMEOUT = re.compile(r"\s*PRAGMA\s+busy_timeout\s*=\s*(\d+)\s*;?\s*$", re.IGNORECASE)

_turns: dict[str, threading.Lock] = {}
_turns_made = threading.Lock()


def _forked() -> None:
    """A forked child's turns are its own: a lock some thread of the parent held would stay held in it."""
    global _turns_made
    _turns.clear()
    _turns_made = threading.Lock()


os.register_at_fork(after_in_child=_forked)


def turns_of(database: str) -> threading.Lock:
    """The lock of the SQLite file `database` (one per file in this process, whichever engine opens it)."""
    return _lock_of(os.path.realpath(database))


def _lock_of(key: str) -> threading.Lock:
    with _turns_made:
        return _turns.setdefault(key, threading.Lock())


def connection_factory(database: str, busy_ms: int) -> type[sqlite3.Connection]:
    """A `sqlite3.Connection` class (`sqlite3.connect(factory=...)`) whose connections take turns writing to
    `database` through its lock, waiting at most `busy_ms` (until a `PRAGMA busy_timeout` says otherwise)."""
    key = os.path.realpath(database)

    class TurnConnection(sqlite3.Connection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._held: threading.Lock | None = None  # the turn, while this connection has it
            self._busy_ms = busy_ms

        def cursor(self, factory: Any = None) -> Any:  # noqa: ARG002 - the turns' cursor, whatever is asked
            return TurnCursor(self)

        def execute(self, sql: str, parameters: Any = (), /) -> Any:
            return self.cursor().execute(sql, parameters)

        def executemany(self, sql: str, parameters: Any, /) -> Any:
            return self.cursor().executemany(sql, parameters)

        def executescript(self, script: str, /) -> Any:
            return self.cursor().executescript(script)

        def commit(self) -> None:
            try:
                super().commit()
            finally:
                self._settle()

        def rollback(self) -> None:
            try:
                super().rollback()
            finally:
                self._settle()

        def close(self) -> None:
            try:
                super().close()
            finally:
                self._release()

        def __del__(self) -> None:  # dropped unclosed: SQLite lets its lock go with it, and so does the turn
            if getattr(self, "_held", None) is not None:
                self._release()

        def _before(self, sql: str) -> None:
            busy = _BUSY_TIMEOUT.match(sql)
            if busy is not None:
                self._busy_ms = int(busy.group(1))
            if self._held is not None or not _WRITES.match(sql):
                return
            turns = _lock_of(key)  # looked up each time: a forked child has new ones
            if not turns.acquire(timeout=max(self._busy_ms, 0) / 1000):
                raise sqlite3.OperationalError("database is locked")
            self._held = turns

        def _settle(self) -> None:
            """Give the turn back where no transaction is open (any more)."""
            if self._held is not None and not self.in_transaction:
                self._release()

        def _release(self) -> None:
            held, self._held = self._held, None
            if held is not None:
                held.release()

    class TurnCursor(sqlite3.Cursor):
        connection: TurnConnection

        def execute(self, sql: str, parameters: Any = (), /) -> Any:
            self.connection._before(sql)
            try:
                return super().execute(sql, parameters)
            finally:
                self.connection._settle()

        def executemany(self, sql: str, parameters: Any, /) -> Any:
            self.connection._before(sql)
            try:
                return super().executemany(sql, parameters)
            finally:
                self.connection._settle()

        def executescript(self, script: str, /) -> Any:
            self.connection._before("BEGIN IMMEDIATE")  # a script may write anywhere in it
            try:
                return super().executescript(script)
            finally:
                self.connection._settle()

    return TurnConnection
