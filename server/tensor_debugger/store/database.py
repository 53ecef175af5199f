"""The metadata database: an engine for a SQLAlchemy URL, and Alembic migrations run on start-up.

Importing Alembic costs about 0.25 s (it loads every SQLAlchemy dialect, Mako and Pygments), more than a small
ingest does, so a start-up first reads the database's revision with plain SQLAlchemy and compares it with the
newest migration file's: Alembic is imported and run only where they differ. A new SQLite file (a first
`compare` into a new data dir) is not migrated step by step either: its tables are created from the models'
metadata and stamped with the newest revision, as Alembic stamps (0.13 s -> 0.02 s). A test checks that such a
database has the schema of one migrated step by step (the same tables, columns, keys and indexes; only the
columns' order differs, which nothing reads). A process that opens several data dirs (captures in a notebook) reads
the migration files' head and compiles the new schema's statements once (`head_revision`, `_schema_statements`).
"""

from __future__ import annotations

import ast
import fcntl
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Column,
    Connection,
    Dialect,
    Engine,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    create_engine,
    event,
    text,
)
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from tensor_debugger.errors import DatabaseSettingError, DatabaseUnavailableError, is_disk_full
from tensor_debugger.resources import resource_dir

if TYPE_CHECKING:
    from alembic.config import Config


SQLITE_BUSY_MS = 30_000  # how long a SQLite statement waits for another connection's lock before it fails


def create_db_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    if cursor.execute("PRAGMA page_count").fetchone()[0] == 0:
        # A new, empty file: turning on WAL writes its first page (the header saying WAL) through a rollback
        # journal, with 4 file syncs (journal, folder, journal, database) that protect no data: there is none yet.
        # What a crash may lose is that header of an empty database (the next open finds an empty file and makes
        # the database again). The schema and every row after it are written in WAL mode, synced as before.
        cursor.execute("PRAGMA synchronous=OFF")
    cursor.execute("PRAGMA journal_mode=WAL")  # readers never wait on the ingest writing
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
    cursor.close()


def alembic_config(url: str) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(resource_dir("migrations")))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade_database(engine: Engine) -> None:
    """Bring the schema to the newest migration (creating it in an empty database)."""
    head = head_revision(resource_dir("migrations") / "versions")  # read once: parsing the files is most of a check
    if schema_is_current(engine, head):
        return
    with _migration_lock(engine):
        if schema_is_current(engine, head):  # another process migrated it while this one waited
            return
        if head is not None and engine.dialect.name == "sqlite":
            with engine.begin() as connection:
                # pysqlite begins transactions before writes only, not DDL: begun here, the tables and the stamp
                # are committed together or not at all
                connection.exec_driver_sql("BEGIN IMMEDIATE")
                if _empty_sqlite(connection):
                    create_at_head(connection, head)
                    return
        from alembic import command

        config = alembic_config(engine.url.render_as_string(hide_password=False))
        if engine.dialect.name == "sqlite":
            _upgrade_sqlite(engine, config)
            return
        with engine.begin() as connection:
            if engine.dialect.name == "postgresql":
                # One migrates at a time: replicas starting together on an empty database each created the tables
                # at once, and all but one failed (UniqueViolation on pg_type_typname_nsp_index). Taken in the
                # migration's own transaction, the lock is held until its DDL is committed or rolled back.
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
                if _current_on(connection, head):  # another process migrated it while this one waited
                    return
            config.attributes["connection"] = connection
            command.upgrade(config, "head")


def _upgrade_sqlite(engine: Engine, config: Config) -> None:
    """Alembic's upgrade of a SQLite file, with foreign keys off, in one transaction.

    A migration that changes a table SQLite cannot ALTER copies it and drops the old one; with foreign keys on, that
    DROP deletes every row pointing at the table (a copy of `sessions` emptied runs, tensors and pairs). The pragma
    only changes outside a transaction: set first, then BEGIN IMMEDIATE (pysqlite begins none before DDL), and
    every foreign key checked before the commit: a migration that left a row pointing at nothing (one that did not
    before: a file may hold such rows from a connection without the pragma, which migrating neither mends nor
    refuses) is rolled back whole. The connection goes back to the pool with them on again."""
    from alembic import command

    with engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
        connection.commit()  # SQLAlchemy's own transaction, begun by that statement; SQLite began none
        try:
            with connection.begin():
                connection.exec_driver_sql("BEGIN IMMEDIATE")
                before = set(connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall())
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
                broken = [row for row in connection.exec_driver_sql("PRAGMA foreign_key_check") if row not in before]
                if broken:
                    table, rowid, parent, _ = broken[0]
                    raise RuntimeError(
                        f"migrating {engine.url.database} left {len(broken)} row(s) pointing at nothing (first: "
                        f"{table} row {rowid}, to {parent}); rolled back, nothing was changed"
                    )
        finally:
            connection.exec_driver_sql("PRAGMA foreign_keys=ON")
            connection.commit()


def _empty_sqlite(connection: Connection) -> bool:
    """Whether the SQLite database holds nothing at all (no table, index, view or trigger)."""
    return bool(connection.scalar(text("SELECT count(*) FROM sqlite_master")) == 0)


def create_at_head(connection: Connection, head: str) -> None:
    """Create the models' tables in an empty database and stamp it with revision `head`, in `connection`'s
    transaction: what `alembic upgrade head` leaves (the alembic_version table as Alembic makes it)."""
    for statement in _schema_statements(connection.dialect):
        connection.exec_driver_sql(statement)
    connection.execute(text("INSERT INTO alembic_version (version_num) VALUES (:head)"), {"head": head})


# The CREATE statements of a new database, by dialect (its name and server version): the same each time, and
# compiling them through SQLAlchemy's DDL compiler is most of making the schema (25 statements, about 10 ms of CPU
# a new data dir), so a process compiles them once
_SCHEMAS: dict[tuple[str, tuple[Any, ...] | None], tuple[str, ...]] = {}


def _schema_statements(dialect: Dialect) -> tuple[str, ...]:
    """The statements `create_all` of the models' metadata (checkfirst=False: the database is empty) and of Alembic's
    version table runs on `dialect`, in its order, compiled: collected through a mock engine, which runs nothing."""
    key = (dialect.name, dialect.server_version_info)
    known = _SCHEMAS.get(key)
    if known is not None:
        return known
    from sqlalchemy import create_mock_engine

    from tensor_debugger.store.models import Base

    elements: list[Any] = []
    mock = create_mock_engine(f"{dialect.name}://", lambda element, *_, **__: elements.append(element))
    Base.metadata.create_all(mock, checkfirst=False)
    stamp = MetaData()
    Table(
        "alembic_version",
        stamp,
        Column("version_num", String(32), nullable=False),
        PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
    )
    stamp.create_all(mock, checkfirst=False)
    statements = tuple(str(element.compile(dialect=dialect)) for element in elements)
    _SCHEMAS[key] = statements
    return statements


@contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    """Held while migrating a SQLite file: two processes opening a new data dir at once (two CLI ingests) would
    otherwise both create the tables, and one fail. PostgreSQL's lock is an advisory one, taken in the migration's
    transaction (`upgrade_database`)."""
    database = engine.url.database if engine.url.get_backend_name() == "sqlite" else None
    if not database or database == ":memory:":
        yield
        return
    with open(f"{database}.migrate-lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def schema_is_current(engine: Engine, head: str | None = None) -> bool:
    """Whether the database is at the newest migration, asked without Alembic. False when in doubt: no
    alembic_version table yet, several rows in it (branches), or migration files this function cannot read.
    `head`: the migration files' `head_revision`, where the caller has read it (read here otherwise)."""
    if head is None:
        head = head_revision(resource_dir("migrations") / "versions")
    if head is None:
        return False
    try:
        with engine.connect() as connection:
            stamped: list[str] = list(connection.execute(text("SELECT version_num FROM alembic_version")).scalars())
    except DBAPIError:  # no such table: a new database
        return False
    return stamped == [head]


def _current_on(connection: Connection, head: str | None) -> bool:
    """`schema_is_current` at `head`, asked in `connection`'s transaction (which a failed query would abort: the
    table's existence is asked first)."""
    if head is None or not connection.dialect.has_table(connection, "alembic_version"):
        return False
    return list(connection.execute(text("SELECT version_num FROM alembic_version")).scalars()) == [head]


def head_revision(versions: Path) -> str | None:
    """The one revision no migration in `versions` revises, read from the files' `revision` and `down_revision`
    assignments as Alembic writes them. None where that is not a single revision (a branch, a file without the
    assignments): the caller then asks Alembic. A test checks this against Alembic's own head.

    Parsing the files is most of a start-up's check (23 files: about 11 ms of CPU), so a process remembers the head
    of a folder whose files it has read, under their names, sizes, modification times and inodes (a file added,
    removed or written since is read again)."""
    paths = sorted(path for path in versions.glob("*.py") if not path.name.startswith(("__init__", ".#")))
    try:  # files Alembic skips too are left out above
        listing = tuple((path.name, *_stat_key(path)) for path in paths)
    except OSError:  # a file removed meanwhile: read what is there, without remembering it
        return _read_head(paths)
    key = (str(versions), listing)
    if key not in _HEADS:
        _HEADS[key] = _read_head(paths)
    return _HEADS[key]


_HEADS: dict[tuple[str, tuple[tuple[Any, ...], ...]], str | None] = {}


def _stat_key(path: Path) -> tuple[int, int, int]:
    found = path.stat()
    return found.st_size, found.st_mtime_ns, found.st_ino


def _read_head(paths: list[Path]) -> str | None:
    revisions: set[str] = set()
    revised: set[str] = set()
    for path in paths:
        values: dict[str, Any] = {}  # a migration file's module-level assignments, whatever they hold
        try:
            for node in ast.parse(path.read_bytes(), str(path)).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target, value = node.targets[0], node.value
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    target, value = node.target, node.value
                else:
                    continue
                if isinstance(target, ast.Name) and target.id in ("revision", "down_revision"):
                    values[target.id] = ast.literal_eval(value)
        except (SyntaxError, ValueError):
            return None
        revision, down = values.get("revision"), values.get("down_revision")
        if not isinstance(revision, str):
            return None
        revisions.add(revision)
        if isinstance(down, str):
            revised.add(down)
        elif isinstance(down, tuple | list):
            revised.update(str(d) for d in down)
        elif down is not None:
            return None
    heads = revisions - revised
    return heads.pop() if len(heads) == 1 else None


ARRAYS_LOCK = 0x7464_6172_7261_7973  # "tdarrays": the advisory lock key of `lock_arrays`
MIGRATION_LOCK = 0x7464_6D69_6772_6174  # "tdmigrat": held on PostgreSQL while migrating (`upgrade_database`)


def lock_arrays(db: DbSession) -> None:
    """Hold, until `db`'s transaction ends, the right to share or release arrays: on PostgreSQL a transaction-level
    advisory lock, taken by an ingest before it points new rows at arrays older rows name and by a deletion before
    it deletes rows (whose arrays it then releases), so that neither reads the other's half-done work. On SQLite the
    writer lock, which both already hold, does the same."""
    if db.get_bind().dialect.name == "postgresql":
        db.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ARRAYS_LOCK})


def make_sessionmaker(engine: Engine) -> sessionmaker[Any]:
    return sessionmaker(engine, expire_on_commit=False)


def shown_url(url: str) -> str:
    """A database URL as messages may show it: its password hidden."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # as given, but for what looks like a password: user:password@
        return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def database_setting_problem(exc: BaseException, url: str) -> DatabaseSettingError | None:
    """What to say when creating an engine for `url` raised `exc` because the URL cannot be used: not a SQLAlchemy
    URL (a port not a number: ValueError), a database SQLAlchemy has no dialect for, a driver that is not installed.
    None for anything else."""
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    shown = shown_url(url)
    if isinstance(exc, NoSuchModuleError):
        scheme = url.split("://", 1)[0]
        cause = f"no database driver for {scheme!r} (sqlite, postgresql or postgresql+psycopg)"
    elif isinstance(exc, ArgumentError | ValueError):
        cause = "not a database URL (dialect+driver://user:password@host:port/database)"
    elif isinstance(exc, ImportError):
        cause = f"its driver is not installed ({exc})"
    else:
        return None
    return DatabaseSettingError(f"cannot use the database {shown!r} (TENSOR_DEBUGGER_DATABASE_URL): {cause}")


def database_outage(exc: BaseException, url: str) -> DatabaseUnavailableError | None:
    """What to say when `exc` (raised by SQLAlchemy) means the database at `url` did not answer: a refused or
    dropped connection, a server shutting down, SQLite's file locked past its timeout. None for an error that
    retrying would not mend (a constraint, a bad statement), and for a full disk (errors.is_disk_full)."""
    if is_disk_full(exc):
        return None
    if isinstance(exc, OperationalError | InterfaceError) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        detail = cause[0][:300] if cause else type(exc).__name__
        return DatabaseUnavailableError(f"the database did not answer ({shown_url(url)}): {detail}")
    return None
