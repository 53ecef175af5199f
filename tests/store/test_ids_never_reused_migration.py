"""Revision 0021 copies the sessions, runs and tensors tables of a SQLite data dir into AUTOINCREMENT ones: a data
dir at 0020 holding two compared sessions opens at the next start with every row of every table kept (ids and all:
pairs and problems still point at their runs and tensors), and from then on a deleted session's ids are never
given again. Run with foreign keys on, the revision refuses before it changes anything."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch
from alembic import command
from sqlalchemy import text
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store import catalog
from tensor_debugger.store.database import alembic_config, create_db_engine

from tests.support.cli_main import main_cli
from tests.support.migrations import migrate_to

TABLES = ("sessions", "runs", "tensors", "pairs", "problems", "unmatched", "array_folders", "comparison_results")


def dump(folder: Path, seed: int) -> Path:
    folder.mkdir(parents=True)
    generator = torch.Generator().manual_seed(seed)
    for name in ("0_embed", "1_attn", "2_mlp"):
        torch.save(torch.randn(16, 8, generator=generator), folder / f"{name}.pth")
    (folder / "notes.txt").write_text("not a tensor")  # a problem row
    return folder


def compare(data: Path, name: str, a: Path, b: Path) -> None:
    done = main_cli("--data-dir", str(data), "compare", str(a), str(b), "--name", name, "--json")
    assert done.returncode == 1, done.stderr  # they differ
    assert json.loads(done.stdout)["session"]["name"] == name


def rows(data: Path, columns: dict[str, list[str]] | None = None) -> dict[str, list[tuple[Any, ...]]]:
    """Each table's rows; of `columns` only (a table's columns at an earlier revision), where given."""
    with sqlite3.connect(data / "metadata.sqlite3") as conn:
        found = {
            t: conn.execute(f"SELECT {', '.join(columns[t]) if columns else '*'} FROM {t} ORDER BY 1").fetchall()
            for t in TABLES
        }
    conn.close()
    return found


def column_names(data: Path) -> dict[str, list[str]]:
    with sqlite3.connect(data / "metadata.sqlite3") as conn:
        found = {t: [row[1] for row in conn.execute(f"PRAGMA table_info({t})")] for t in TABLES}
    conn.close()
    return found


def at_revision(data: Path, revision: str) -> None:
    """The file's schema as `revision` left it, with foreign keys off as a copy of a table needs."""
    engine = create_db_engine(f"sqlite:///{data / 'metadata.sqlite3'}")
    migrate_to(engine, revision, downgrade=True)
    engine.dispose()


def autoincrement(data: Path) -> dict[str, bool]:
    with sqlite3.connect(data / "metadata.sqlite3") as conn:
        sql = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall())
    conn.close()
    return {t: "AUTOINCREMENT" in sql[t] for t in ("sessions", "runs", "tensors", "pairs")}


def test_a_data_dir_at_0020_keeps_every_row_and_then_never_reuses_ids(tmp_path: Path) -> None:
    data = tmp_path / "data"
    a, b = dump(tmp_path / "a", 1), dump(tmp_path / "b", 2)
    compare(data, "first", a, b)
    compare(data, "second", b, a)
    at_revision(data, "0020")
    assert autoincrement(data) == {"sessions": False, "runs": False, "tensors": False, "pairs": True}
    before, columns = rows(data), column_names(data)
    assert all(before[t] for t in ("sessions", "runs", "tensors", "pairs", "problems", "comparison_results"))

    listed = main_cli("--data-dir", str(data), "sessions", "--json")  # a start: migrated to the head
    assert listed.returncode == 0, listed.stderr
    assert [s["name"] for s in json.loads(listed.stdout)] == ["second", "first"]
    assert autoincrement(data) == {"sessions": True, "runs": True, "tensors": True, "pairs": True}
    assert rows(data, columns) == before  # the later revisions' new columns aside

    newest = max(r[0] for r in before["sessions"])
    services = open_services(Settings(data_dir=data, demo=False))
    try:
        with services.sessions() as db:  # as DELETE /api/sessions/<id> does
            catalog.delete_session(db, services.store, newest)
    finally:
        services.close()
    compare(data, "third", a, b)
    after = rows(data)
    for table, column in (("sessions", 0), ("runs", 0), ("tensors", 0)):
        old = {r[column] for r in before[table]}
        new = {r[column] for r in after[table]} - old
        assert new and min(new) > max(old), (table, old, new)
    assert newest not in {r[0] for r in after["sessions"]}


def test_0021_refuses_to_run_with_foreign_keys_on(tmp_path: Path) -> None:
    data = tmp_path / "data"
    compare(data, "first", dump(tmp_path / "a", 1), dump(tmp_path / "b", 2))
    at_revision(data, "0020")
    before = rows(data)
    engine = create_db_engine(f"sqlite:///{data / 'metadata.sqlite3'}")  # its connections turn foreign keys on
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with pytest.raises(RuntimeError, match="foreign keys on"), engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    with engine.connect() as connection:
        assert connection.scalar(text("SELECT version_num FROM alembic_version")) == "0020"
    engine.dispose()
    assert rows(data) == before


def test_a_row_pointing_at_nothing_before_the_migration_neither_stops_it_nor_is_dropped(tmp_path: Path) -> None:
    """The app migrates with foreign keys off and refuses a migration that leaves a row pointing at nothing; a row
    that did so already (written by a connection without the pragma: sqlite3's default) is no migration's doing:
    the start goes on, the row kept as it was."""
    data = tmp_path / "data"
    compare(data, "first", dump(tmp_path / "a", 1), dump(tmp_path / "b", 2))
    at_revision(data, "0020")
    with sqlite3.connect(data / "metadata.sqlite3") as conn:  # foreign keys off: sqlite3's default
        conn.execute("INSERT INTO problems (run_id, file, reason, ignored, note) VALUES (999, 'gone', 'x', 0, 0)")
    conn.close()
    before, columns = rows(data), column_names(data)
    listed = main_cli("--data-dir", str(data), "sessions", "--json")
    assert listed.returncode == 0, listed.stderr
    # the later revisions' new columns aside (tensors.parameter, 0022), every row as it was
    assert autoincrement(data)["sessions"] and rows(data, columns) == before
