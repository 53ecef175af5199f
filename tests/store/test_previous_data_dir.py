"""A data dir written before instant re-runs (schema 0005: no input fingerprints, every array named by the rows of
the run that wrote it) opens, upgrades and keeps working: its sessions read, compare the same files again reads
them once more and is reused from then on, deletion removes what no row names."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import inspect, select
from tensor_debugger.cli.compare import run_compare
from tensor_debugger.cli.compare_output import compare_request
from tensor_debugger.compare.planning.sides import views
from tensor_debugger.compare.reports.slices import parse_slice_request, read_slice
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store import catalog
from tensor_debugger.store.database import create_db_engine, schema_is_current
from tensor_debugger.store.identity import MARKER
from tensor_debugger.store.models import PairRecord, TensorRecord

from tests.support.migrations import migrate_to


def write_dump(folder: Path, seed: int) -> None:
    folder.mkdir(parents=True)
    generator = torch.Generator().manual_seed(seed)
    for layer in range(2):
        for stage in ("query", "post_mlp"):
            torch.save(torch.randn(32, 16, generator=generator), folder / f"{layer}_{stage}.pth")


def compare(services: Services, a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert run_compare(services, compare_request(a, b, None, None, None), True) == 1
    payload: dict[str, Any] = json.loads(capsys.readouterr().out)
    return payload


def run_folders(data: Path) -> set[str]:
    runs = data / "arrays" / "runs"
    return {p.name for p in runs.iterdir() if p.name.isdigit()} if runs.exists() else set()


def tensor_rows(data: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(data / "metadata.sqlite3") as conn:
        return conn.execute("SELECT id, run_id, name, store_key, digest FROM tensors ORDER BY id").fetchall()


def downgrade_to_previous_schema(data: Path) -> None:
    """The schema as the previous version left it: its migrations' head, 0005 (the new columns and indexes
    dropped). The rows are those the previous version wrote: no fingerprints, no shared arrays (the two runs'
    tensors all differ)."""
    engine = create_db_engine(f"sqlite:///{data / 'metadata.sqlite3'}")
    migrate_to(engine, "0005", downgrade=True)  # foreign keys off: dropping columns copies the tables
    assert not schema_is_current(engine)
    assert "input_key" not in {c["name"] for c in inspect(engine).get_columns("runs")}
    engine.dispose()
    (data / "arrays" / MARKER).unlink()  # the store's marker is newer still (store/identity.py)


def test_a_data_dir_of_the_previous_version_keeps_working(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "reference", tmp_path / "candidate"
    write_dump(a, seed=1)
    write_dump(b, seed=2)
    settings = Settings(data_dir=tmp_path / "data", demo=False)
    data = settings.data_dir
    services = open_services(settings)
    try:
        old = compare(services, a, b, capsys)
    finally:
        services.close()
    tensors = tensor_rows(data)
    downgrade_to_previous_schema(data)
    assert tensor_rows(data) == tensors
    old_folders = run_folders(data)
    assert len(old_folders) == 2

    services = open_services(settings)  # upgrades to 0006
    try:
        assert tensor_rows(data) == tensors
        with services.sessions() as db:
            session = catalog.get_session(db, old["session"]["id"])
            assert [run.input_key for run in session.runs] == [None, None]
            for pair in db.scalars(select(PairRecord).where(PairRecord.session_id == session.id)):
                view_a, view_b, alignment = views(services.store, db, pair)
                read_slice(view_a, view_b, parse_slice_request(alignment.shape, "0,:", "0", "4"))

        again = compare(services, a, b, capsys)  # the old runs have no fingerprint: read again
        assert [p["stats"] for p in again["pairs"]] == [p["stats"] for p in old["pairs"]]
        with services.sessions() as db:
            new_runs = catalog.get_session(db, again["session"]["id"]).runs
            # bit-identical to the old runs' tensors: the new rows name the old arrays
            assert all(
                t.store_key.split("/")[1] in old_folders for run in new_runs for t in catalog.list_tensors(db, run.id)
            )
        third = compare(services, a, b, capsys)
        assert [p["stats"] for p in third["pairs"]] == [p["stats"] for p in old["pairs"]]
        with services.sessions() as db:
            assert all(run.input_key is not None for run in catalog.get_session(db, third["session"]["id"]).runs)

        with services.sessions() as db:
            catalog.delete_session(db, services.store, old["session"]["id"])
        assert old_folders <= run_folders(data)  # still named by the newer sessions' rows
        for payload in (again, third):
            with services.sessions() as db:
                catalog.delete_session(db, services.store, payload["session"]["id"])
        assert run_folders(data) == set()
        with services.sessions() as db:
            assert db.scalar(select(TensorRecord.id).limit(1)) is None
    finally:
        services.close()
