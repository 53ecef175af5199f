"""Alembic's `upgrade head` on an empty database gives exactly the models' schema; a start-up runs Alembic only
when the database is not at the newest migration already."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, Inspector, inspect, text
from tensor_debugger.resources import resource_dir
from tensor_debugger.store.database import (
    alembic_config,
    create_db_engine,
    head_revision,
    schema_is_current,
    upgrade_database,
)
from tensor_debugger.store.models import Base

from tests.support.migrations import migrate_to
from tests.support.postgres import DATABASES, PostgresCluster


def assert_schema_matches_models(engine: Engine) -> None:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
        assert context.get_current_revision() == alembic_head()


def alembic_head() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


@pytest.mark.parametrize("database", DATABASES)
def test_upgrade_head_matches_models(tmp_path: Path, database: str, request: pytest.FixtureRequest) -> None:
    if database == "sqlite":
        engine = create_db_engine(f"sqlite:///{tmp_path / 'fresh.sqlite3'}")
    else:
        cluster: PostgresCluster = request.getfixturevalue("postgres")
        engine = create_db_engine(cluster.create_database("schema", migrated=False))
    assert not schema_is_current(engine)  # no alembic_version table yet
    upgrade_database(engine)
    assert schema_is_current(engine)
    assert_schema_matches_models(engine)
    assert set(inspect(engine).get_table_names()) == {
        "alembic_version",
        "sessions",
        "runs",
        "tensors",
        "problems",
        "pairs",
        "comparison_results",
        "pair_overrides",
        "unmatched",
        "sign_outs",
        "database_identity",
        "array_folders",
        "session_figures",
    }
    upgrade_database(engine)  # a second start is a no-op
    engine.dispose()


def test_head_read_from_the_files_is_alembics_head() -> None:
    """The start-up's shortcut reads the head revision from the migration files; it must be Alembic's."""
    head = head_revision(resource_dir("migrations") / "versions")
    assert head is not None and head == alembic_head()


def test_an_older_schema_is_upgraded(tmp_path: Path) -> None:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'old.sqlite3'}")
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0003")  # the schema before module traces
    assert not schema_is_current(engine)
    upgrade_database(engine)
    assert schema_is_current(engine)
    assert_schema_matches_models(engine)
    engine.dispose()


def test_problems_stored_before_0012_are_sorted_by_their_words(tmp_path: Path) -> None:
    """What held no tensor (the words the ingest gave it) is marked ignored; what could not be read is not."""
    engine = create_db_engine(f"sqlite:///{tmp_path / 'old.sqlite3'}")
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0011")
    stored = {
        "config.json": "not a tensor file or archive (unknown extension '.json'); skipped",
        "a.npz/notes.txt": "not a .npy member; skipped",
        "state.pth/step": "not a tensor (int); skipped",
        "trace.json": "not a model_addition_debugger_context trace: no root 'module_path'",
        "1_query.pth": "not a readable PyTorch file (OSError: [Errno 22] Invalid argument)",
        "model.safetensors.index.json": "names shard 'model-00002-of-00002.safetensors' (6 weights), missing",
    }
    with sqlite3.connect(tmp_path / "old.sqlite3") as raw:
        for table in ("sessions", "runs"):  # a run for the problems: any value in each column that needs one
            columns = [c for c in raw.execute(f"PRAGMA table_info({table})") if c[3] and c[4] is None and not c[5]]
            values = {name: 1 if "INT" in kind or "BOOL" in kind else "2026-01-01" for _, name, kind, *_ in columns}
            raw.execute(
                f"INSERT INTO {table} (id, {', '.join(values)}) VALUES (1, {', '.join('?' * len(values))})",
                list(values.values()),
            )
        raw.executemany("INSERT INTO problems (run_id, file, reason) VALUES (1, ?, ?)", stored.items())
    raw.close()
    upgrade_database(engine)
    with engine.connect() as connection:
        ignored: dict[str, bool] = dict(connection.execute(text("SELECT file, ignored FROM problems")).all())
    engine.dispose()
    assert {file for file, flag in ignored.items() if flag} == {
        "config.json",
        "a.npz/notes.txt",
        "state.pth/step",
        "trace.json",
    }


def test_capture_notes_stored_before_0019_are_marked_notes(tmp_path: Path) -> None:
    """A capture's note (stored ignored, under its trace's file) becomes a note; a file that held no tensor, even a
    trace's, and what could not be read do not."""
    engine = create_db_engine(f"sqlite:///{tmp_path / 'old.sqlite3'}")
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0018")
    stored = [
        ("compiled/Net_debug_tree_FULL_TENSORS.json", "Net ran compiled (torch.compile): its ops are not visible", 1),
        ("config.json", "not a tensor file or archive (unknown extension '.json'); skipped", 1),
        ("broken_debug_tree_FULL_TENSORS.json", "not a model_addition_debugger_context trace", 0),
        ("x_debug_tree_FULL_TENSORSXjson", "not a tensor file or archive; skipped", 1),  # _ and . are no wildcards
    ]
    with sqlite3.connect(tmp_path / "old.sqlite3") as raw:
        for table in ("sessions", "runs"):  # a run for the problems: any value in each column that needs one
            columns = [c for c in raw.execute(f"PRAGMA table_info({table})") if c[3] and c[4] is None and not c[5]]
            values = {name: 1 if "INT" in kind or "BOOL" in kind else "2026-01-01" for _, name, kind, *_ in columns}
            raw.execute(
                f"INSERT INTO {table} (id, {', '.join(values)}) VALUES (1, {', '.join('?' * len(values))})",
                list(values.values()),
            )
        raw.executemany("INSERT INTO problems (run_id, file, reason, ignored) VALUES (1, ?, ?, ?)", stored)
    raw.close()
    upgrade_database(engine)
    with engine.connect() as connection:
        notes: dict[str, bool] = dict(connection.execute(text("SELECT file, note FROM problems")).all())
    engine.dispose()
    assert {file for file, flag in notes.items() if flag} == {"compiled/Net_debug_tree_FULL_TENSORS.json"}
    assert len(notes) == 4


def test_0020_adds_compared_against_in_place_keeping_every_row_that_points_at_a_run(tmp_path: Path) -> None:
    """On SQLite with foreign keys on, a copy of `runs` would delete every row pointing at it (tensors, pairs,
    problems): 0020 adds its column in place, and its downgrade drops it in place."""
    engine = create_db_engine(f"sqlite:///{tmp_path / 'old.sqlite3'}")
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0019")
    with sqlite3.connect(tmp_path / "old.sqlite3") as raw:
        for table in ("sessions", "runs"):  # a run for the problems: any value in each column that needs one
            columns = [c for c in raw.execute(f"PRAGMA table_info({table})") if c[3] and c[4] is None and not c[5]]
            values = {name: 1 if "INT" in kind or "BOOL" in kind else "2026-01-01" for _, name, kind, *_ in columns}
            raw.execute(
                f"INSERT INTO {table} (id, {', '.join(values)}) VALUES (1, {', '.join('?' * len(values))})",
                list(values.values()),
            )
        raw.executemany("INSERT INTO problems (run_id, file, reason) VALUES (1, ?, 'x')", [("a",), ("b",)])
    raw.close()

    def counts() -> tuple[int, int, list[str]]:
        with engine.connect() as connection:
            runs = connection.scalar(text("SELECT count(*) FROM runs")) or 0
            problems = connection.scalar(text("SELECT count(*) FROM problems")) or 0
            columns = [c["name"] for c in inspect(connection).get_columns("runs")]
        return runs, problems, columns

    upgrade_database(engine)
    runs, problems, columns = counts()
    assert (runs, problems) == (1, 2) and "compared_against_id" in columns
    assert_schema_matches_models(engine)
    migrate_to(engine, "0019", downgrade=True)  # through 0021's, which copies `runs`: foreign keys off
    runs, problems, columns = counts()
    assert (runs, problems) == (1, 2) and "compared_against_id" not in columns
    engine.dispose()


def test_a_stamp_other_than_the_head_is_not_current(tmp_path: Path) -> None:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'odd.sqlite3'}")
    upgrade_database(engine)
    head = alembic_head()
    with engine.begin() as connection:
        connection.execute(text("INSERT INTO alembic_version (version_num) VALUES ('other')"))
    assert not schema_is_current(engine)  # two rows: branches, left to Alembic
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM alembic_version WHERE version_num = :head"), {"head": head})
    assert not schema_is_current(engine)  # a revision these files do not know (a newer release's): Alembic says so
    engine.dispose()


def test_head_revision_of_branches_merges_and_odd_files(tmp_path: Path) -> None:
    def migration(name: str, body: str) -> None:
        (tmp_path / f"{name}.py").write_text(
            f'"""{name}"""\nfrom alembic import op\n{body}\n\ndef upgrade() -> None:\n    pass\n'
        )

    assert head_revision(tmp_path) is None  # no migrations at all
    migration("a", "revision = 'a'\ndown_revision = None")
    migration("b", "revision: str = 'b'\ndown_revision: str | None = 'a'")  # the newer template's annotations
    assert head_revision(tmp_path) == "b"
    migration("c", "revision = 'c'\ndown_revision = 'a'")
    assert head_revision(tmp_path) is None  # two heads
    migration("d", "revision = 'd'\ndown_revision = ('b', 'c')")
    assert head_revision(tmp_path) == "d"  # merged
    (tmp_path / "__init__.py").write_text("")
    assert head_revision(tmp_path) == "d"
    migration("e", "revision = compute()\ndown_revision = 'd'")
    assert head_revision(tmp_path) is None  # not a literal: left to Alembic
    migration("e", "revision = 'e'\ndown_revision = 'd'")  # written again: read again, not remembered
    assert head_revision(tmp_path) == "e"
    (tmp_path / "e.py").unlink()
    assert head_revision(tmp_path) == "d"


def described(engine: Engine) -> dict[str, dict[str, Any]]:
    """Every table as SQLAlchemy's inspector reads it from the file: columns (by name: their order aside),
    primary key, foreign keys, indexes, unique and check constraints, and whether SQLite's AUTOINCREMENT is declared
    (which the inspector does not say: ids never reused)."""
    inspector: Inspector = inspect(engine)
    with engine.connect() as connection:
        sql: dict[str, str] = dict(
            connection.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'table'")).all()
        )
    tables: dict[str, dict[str, Any]] = {}
    for table in inspector.get_table_names():
        tables[table] = {
            "autoincrement": "AUTOINCREMENT" in str(sql[table]).upper(),
            "columns": {c["name"]: {k: str(v) for k, v in c.items()} for c in inspector.get_columns(table)},
            "primary key": inspector.get_pk_constraint(table),
            "foreign keys": sorted(map(str, inspector.get_foreign_keys(table))),
            "indexes": sorted(map(str, inspector.get_indexes(table))),
            "unique": sorted(map(str, inspector.get_unique_constraints(table))),
            "checks": sorted(map(str, inspector.get_check_constraints(table))),
        }
    return tables


def test_a_new_data_dir_made_from_the_models_is_the_migrated_schema(tmp_path: Path) -> None:
    """A new SQLite database is created from the models' metadata and stamped (no Alembic): the same schema, read
    back from the files, as the migrations run one by one give, and Alembic takes it as at its head. The second new
    database of the process is made from the statements the first compiled: the same schema again."""
    stepwise = create_db_engine(f"sqlite:///{tmp_path / 'stepwise.sqlite3'}")
    migrate_to(stepwise, "head")  # as the app migrates SQLite: foreign keys off (0021 copies tables)
    for name in ("fast.sqlite3", "again.sqlite3"):
        fast = create_db_engine(f"sqlite:///{tmp_path / name}")
        upgrade_database(fast)
        assert described(fast) == described(stepwise)
        assert "sessions" in described(fast) and "alembic_version" in described(fast)
        assert_schema_matches_models(fast)
        with fast.connect() as a, stepwise.connect() as b:
            version = "SELECT version_num FROM alembic_version"
            made: list[str] = list(a.execute(text(version)).scalars())
            migrated: list[str] = list(b.execute(text(version)).scalars())
        assert made == migrated == [alembic_head()]
        with fast.connect() as a, stepwise.connect() as b:  # SQLite's own record: every table, index and trigger
            schema = "SELECT type, name, tbl_name FROM sqlite_master ORDER BY type, name"
            assert a.execute(text(schema)).all() == b.execute(text(schema)).all()
        fast.dispose()
    stepwise.dispose()


def test_a_database_that_holds_anything_is_left_to_alembic(tmp_path: Path) -> None:
    """Only an empty file is created from the models: one holding a table (an older tool's, a half-made schema)
    goes through Alembic, which refuses what it cannot migrate instead of mixing schemas."""
    path = tmp_path / "odd.sqlite3"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE sessions (id INTEGER PRIMARY KEY)")
    raw.close()
    engine = create_db_engine(f"sqlite:///{path}")
    with pytest.raises(Exception, match="sessions"):
        upgrade_database(engine)
    assert not schema_is_current(engine)
    assert "runs" not in inspect(engine).get_table_names()  # the models' tables were not made around it
    engine.dispose()
