"""A store belongs to one database (store/identity.py): a process given a database and a store of different pairs
exits 2 at start, saying which two it found and how to fix it, having written and deleted nothing in the store. The
refused starts run as the CLI in child processes (their exit status and their one line); the ingests that set a
test's data up (and must succeed) run `main(argv)` in this process (tests/support/cli_main.py); against real
SeaweedFS and PostgreSQL."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import obstore
import pytest
import torch
from tensor_debugger.store.database import create_db_engine
from tensor_debugger.store.identity import MARKER, hidden_password

from tests.support.cli_main import Finished, main_cli
from tests.support.migrations import migrate_to
from tests.support.postgres import PostgresCluster
from tests.support.s3 import SeaweedS3
from tests.support.servers import child_env, cli_command, free_port, run_cli


def dump(folder: Path, seed: int) -> Path:
    folder.mkdir(parents=True)
    generator = torch.Generator().manual_seed(seed)
    for name in ("0_embed", "1_attn", "2_mlp"):
        torch.save(torch.randn(16, 8, generator=generator), folder / f"{name}.pth")
    return folder


def objects(s3: SeaweedS3, url: str) -> list[str]:
    return sorted(item["path"] for batch in obstore.list(s3.bucket(url)) for item in batch)


def ingest(data: Path, env: dict[str, str], session: str, files: Path) -> Finished:
    """An ingest that is to succeed, through `main(argv)` here."""
    return main_cli(
        "--data-dir", str(data), "ingest", "--in-process", "--session", session, "--run", "ref", str(files), env=env
    )


def refused_ingest(data: Path, env: dict[str, str], session: str, files: Path) -> subprocess.CompletedProcess[str]:
    """An ingest that is to be refused at its start, in a child process."""
    return run_cli(
        "--data-dir", str(data), "ingest", "--in-process", "--session", session, "--run", "ref", str(files), env=env
    )


def served(data: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`serve` to its end: a start that is refused exits at once (a start that is not is killed after 60 s)."""
    args = [*cli_command(), "--data-dir", str(data), "serve", "--no-demo", "--port", str(free_port())]
    return subprocess.run(args, capture_output=True, text=True, env={**child_env(), **env}, timeout=60)


def assert_refused(result: Finished, *names: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensor-debugger: the database "), result.stderr
    assert "not one pair" in lines[0] and "a new, empty store" in lines[0]
    for name in names:
        assert name in lines[0]
    assert "Traceback" not in result.stderr


def marker(folder: Path) -> str:
    document = json.loads((folder / MARKER).read_text())
    assert set(document) == {"database_id", "created_at"}
    return str(document["database_id"])


def database_id(sqlite_file: Path) -> str:
    with sqlite3.connect(sqlite_file) as conn:
        rows = conn.execute("SELECT database_id FROM database_identity").fetchall()
    conn.close()
    assert len(rows) == 1
    return str(rows[0][0])


def test_a_new_sqlite_given_the_clusters_bucket_refuses_and_deletes_nothing(
    tmp_path: Path, s3: SeaweedS3, postgres: PostgresCluster
) -> None:
    cluster = {"TENSOR_DEBUGGER_DATABASE_URL": postgres.create_database(), "TENSOR_DEBUGGER_STORE_URL": s3.new_url()}
    cluster |= s3.environ
    store_url = cluster["TENSOR_DEBUGGER_STORE_URL"]
    for seed in range(2):
        done = ingest(tmp_path / "replica", cluster, f"session {seed}", dump(tmp_path / f"dump{seed}", seed))
        assert done.returncode == 0, done.stderr
    before = objects(s3, store_url)
    assert MARKER in before and len([k for k in before if k.startswith("runs/")]) > 6

    laptop = {k: v for k, v in cluster.items() if k != "TENSOR_DEBUGGER_DATABASE_URL"}  # a fresh SQLite of its own
    data = tmp_path / "laptop"
    sqlite_url = f"sqlite:///{data / 'metadata.sqlite3'}"
    assert_refused(run_cli("--data-dir", str(data), "sessions", env=laptop), sqlite_url, store_url, "no id")
    assert objects(s3, store_url) == before
    assert_refused(refused_ingest(data, laptop, "mine", tmp_path / "dump0"), sqlite_url, store_url)
    assert_refused(served(data, laptop), sqlite_url, store_url)
    assert objects(s3, store_url) == before
    with sqlite3.connect(data / "metadata.sqlite3") as conn:  # and the new database got no id from the store
        assert conn.execute("SELECT count(*) FROM database_identity").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)
    conn.close()
    listed = run_cli("--data-dir", str(tmp_path / "replica"), "sessions", "--json", env=cluster)
    assert listed.returncode == 0, listed.stderr
    assert sorted(s["name"] for s in json.loads(listed.stdout)) == ["session 0", "session 1"]


def test_the_clusters_database_with_a_local_store_refuses(
    tmp_path: Path, s3: SeaweedS3, postgres: PostgresCluster
) -> None:
    database_url = postgres.create_database()
    cluster = {"TENSOR_DEBUGGER_DATABASE_URL": database_url, "TENSOR_DEBUGGER_STORE_URL": s3.new_url()} | s3.environ
    done = ingest(tmp_path / "replica", cluster, "shared", dump(tmp_path / "dump", 0))
    assert done.returncode == 0, done.stderr
    before = objects(s3, cluster["TENSOR_DEBUGGER_STORE_URL"])

    laptop = {"TENSOR_DEBUGGER_DATABASE_URL": database_url}  # the store: a new folder in its data dir
    data = tmp_path / "laptop"
    store_url = (data / "arrays").as_uri()
    assert_refused(refused_ingest(data, laptop, "mine", tmp_path / "dump"), database_url, store_url, "lacks")
    assert_refused(served(data, laptop), database_url, store_url)
    assert_refused(run_cli("--data-dir", str(data), "sessions", env=laptop), database_url, store_url)
    assert not (data / "arrays").exists() or not any((data / "arrays").iterdir())  # no marker, no array
    assert objects(s3, cluster["TENSOR_DEBUGGER_STORE_URL"]) == before
    listed = run_cli("--data-dir", str(tmp_path / "replica"), "sessions", "--json", env=cluster)
    assert [s["name"] for s in json.loads(listed.stdout)] == ["shared"]  # no session "mine" half made


def test_two_pairs_mixed_name_both_ids(tmp_path: Path) -> None:
    ids = {}
    for name in ("a", "b"):
        done = ingest(tmp_path / name, {}, name, dump(tmp_path / f"dump-{name}", 0))
        assert done.returncode == 0, done.stderr
        ids[name] = database_id(tmp_path / name / "metadata.sqlite3")
        assert marker(tmp_path / name / "arrays") == ids[name]
    assert ids["a"] != ids["b"]
    store_b = (tmp_path / "b" / "arrays").as_uri()
    before = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b" / "arrays").rglob("*"))
    mixed = run_cli("--data-dir", str(tmp_path / "a"), "sessions", env={"TENSOR_DEBUGGER_STORE_URL": store_b})
    assert_refused(mixed, str(tmp_path / "a" / "metadata.sqlite3"), store_b, ids["a"], ids["b"])
    assert sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b" / "arrays").rglob("*")) == before


def test_a_first_start_marks_a_new_pair_and_a_read_marks_nothing(tmp_path: Path) -> None:
    listed = run_cli("--data-dir", str(tmp_path / "new"), "sessions")  # a read: nothing marked
    assert listed.returncode == 0, listed.stderr
    assert not (tmp_path / "new" / "arrays" / MARKER).exists()
    done = ingest(tmp_path / "new", {}, "first", dump(tmp_path / "dump", 0))
    assert done.returncode == 0, done.stderr
    assert marker(tmp_path / "new" / "arrays") == database_id(tmp_path / "new" / "metadata.sqlite3")
    again = ingest(tmp_path / "new", {}, "second", tmp_path / "dump")  # the pair checked, the marker kept
    assert again.returncode == 0, again.stderr
    assert marker(tmp_path / "new" / "arrays") == database_id(tmp_path / "new" / "metadata.sqlite3")


def test_a_data_dir_from_before_the_marker_adopts_it(tmp_path: Path) -> None:
    """A data dir made before the marker existed (a database at revision 0014, a store without a marker) is
    adopted at its next start: the database gets an id, the store the marker, and its runs' folders are recorded."""
    data = tmp_path / "old"
    done = ingest(data, {}, "old session", dump(tmp_path / "dump", 0))
    assert done.returncode == 0, done.stderr
    engine = create_db_engine(f"sqlite:///{data / 'metadata.sqlite3'}")
    migrate_to(engine, "0014", downgrade=True)  # the schema before the marker, as an older release left it
    engine.dispose()
    (data / "arrays" / MARKER).unlink()
    with sqlite3.connect(data / "metadata.sqlite3") as conn:
        run_ids = [row[0] for row in conn.execute("SELECT id FROM runs")]
    conn.close()
    assert run_ids

    listed = run_cli("--data-dir", str(data), "sessions", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [s["name"] for s in json.loads(listed.stdout)] == ["old session"]
    assert not (data / "arrays" / MARKER).exists()  # a read adopts nothing
    again = ingest(data, {}, "new session", tmp_path / "dump")
    assert again.returncode == 0, again.stderr
    assert marker(data / "arrays") == database_id(data / "metadata.sqlite3")
    with sqlite3.connect(data / "metadata.sqlite3") as conn:
        recorded = {row[0] for row in conn.execute("SELECT run_id FROM array_folders")}
    conn.close()
    assert set(run_ids) <= recorded


def test_a_new_database_against_an_unmarked_store_holding_arrays_refuses(tmp_path: Path) -> None:
    """A store from before the marker, holding arrays, given to a new database: not adopted, nothing deleted."""
    done = ingest(tmp_path / "old", {}, "old session", dump(tmp_path / "dump", 0))
    assert done.returncode == 0, done.stderr
    store = tmp_path / "old" / "arrays"
    (store / MARKER).unlink()
    before = sorted(store.rglob("*"))
    result = refused_ingest(tmp_path / "new", {"TENSOR_DEBUGGER_STORE_URL": store.as_uri()}, "mine", tmp_path / "dump")
    assert_refused(result, store.as_uri(), "another database's")
    assert sorted(store.rglob("*")) == before


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg://tensor:s3cret@db:5432/td", "postgresql+psycopg://tensor:***@db:5432/td"),
        ("sqlite:////data/metadata.sqlite3", "sqlite:////data/metadata.sqlite3"),
    ],
)
def test_a_database_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert hidden_password(url) == shown
