"""Instant re-runs: `compare` on unchanged files reuses the runs ingested before (no file is read, no array
written); bit-identical tensors share one array, which lives until the last row naming it is deleted."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sqlalchemy import select
from tensor_debugger.cli.compare import run_compare
from tensor_debugger.cli.compare_output import compare_request
from tensor_debugger.compare.planning.sides import views
from tensor_debugger.compare.reports.slices import parse_slice_request, read_slice
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store import catalog
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.dtypes import parse_dtype
from tensor_debugger.store.models import PairRecord, RunRecord, TensorRecord

from tests.support.backends import BACKEND_FIXTURES, BACKENDS

STAGES = ("query", "post_attn", "post_mlp")


def write_dump(folder: Path, candidate: bool) -> None:
    """Three layers of `{layer}_{stage}.pth`; the candidate differs from layer 1 on (layer 0 is bit-identical)."""
    folder.mkdir(parents=True)
    generator = torch.Generator().manual_seed(3)
    for layer in range(3):
        for stage in STAGES:
            values = torch.randn(64, 48, generator=generator)
            if candidate and layer >= 1:
                values = values + 1e-2
            torch.save(values, folder / f"{layer}_{stage}.pth")


def zipped(folder: Path) -> Path:
    target = folder.with_suffix(".zip")
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as archive:
        for path in sorted(folder.iterdir()):
            archive.write(path, f"{folder.name}/{path.name}")
    return target


@pytest.fixture(params=["folders", "archives"])
def dumps(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "dumps" / "reference", tmp_path / "dumps" / "candidate"
    write_dump(a, candidate=False)
    write_dump(b, candidate=True)
    if request.param == "archives":
        return zipped(a), zipped(b)
    return a, b


def compare(services: Services, a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code = run_compare(services, compare_request(a, b, None, None, None), True)
    assert code == 1  # the candidate diverges
    payload: dict[str, Any] = json.loads(capsys.readouterr().out)
    return payload


def verdicts(payload: dict[str, Any]) -> list[tuple[str, str, Any]]:
    return [(p["name"], p["status"], p["stats"]) for p in payload["pairs"]]


def stored_arrays(data: Path | ArrayStore) -> dict[str, set[str]]:
    """Every array in the store (a data dir's folder, or any store listed through its interface) by run folder:
    {"1": {"0", "1", ...}}."""
    if isinstance(data, ArrayStore):  # an array is there while its zarr.json is: SeaweedFS lists emptied "folders"

        def array_names(run: str) -> set[str]:
            names = (a for a in data.children(f"runs/{run}") if a.isdigit())
            return {a for a in names if "zarr.json" in data.children(f"runs/{run}/{a}")}

        listed = {run: array_names(run) for run in data.children("runs") if run.isdigit()}
        return {run: arrays for run, arrays in listed.items() if arrays}
    runs = data / "arrays" / "runs"
    if not runs.exists():
        return {}
    return {
        run.name: {a.name for a in run.iterdir() if a.name.isdigit()} for run in runs.iterdir() if run.name.isdigit()
    }


def chunk_files(data: Path) -> int:
    return sum(1 for p in (data / "arrays").rglob("*") if p.is_file() and p.name != "zarr.json")


def session_runs(services: Services, session_id: int) -> list[RunRecord]:
    with services.sessions() as db:
        return list(catalog.get_session(db, session_id).runs)


def assert_slices_read(services: Services, session_id: int) -> None:
    """Every pair's first rows read back, through the views the slice API uses."""
    with services.sessions() as db:
        pairs = db.scalars(select(PairRecord).where(PairRecord.session_id == session_id)).all()
        assert pairs
        for pair in pairs:
            view_a, view_b, alignment = views(services.store, db, pair)
            report = read_slice(view_a, view_b, parse_slice_request(alignment.shape, "0,:", "0", "8"))
            assert report is not None


def assert_tensors_read(services: Services, session_id: int, folders: dict[str, Path]) -> None:
    """Every tensor of the session reads back bit-exact from the array its row names."""
    with services.sessions() as db:
        for run in catalog.get_session(db, session_id).runs:
            for tensor in catalog.list_tensors(db, run.id):
                stored = services.store.read_whole(tensor.store_key, parse_dtype(tensor.dtype))
                expected = torch.load(folders[run.label] / tensor.source_file.rsplit("/", 1)[-1], weights_only=True)
                assert torch.equal(stored, expected), tensor.name


def test_compare_again_ingests_nothing_and_gives_the_same_results(
    services: Services, dumps: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = dumps
    data = services.settings.data_dir
    first = compare(services, a, b, capsys)
    arrays, chunks = stored_arrays(data), chunk_files(data)
    assert len(arrays) == 2
    # layer 0 is bit-identical in both runs: whichever run is ready second (they ingest at once) names the other's
    # arrays and keeps no copy
    assert sum(len(kept) for kept in arrays.values()) == (3 + 2) * len(STAGES)

    second = compare(services, a, b, capsys)
    assert second["session"]["name"].endswith("(2)")
    assert verdicts(second) == verdicts(first)
    assert stored_arrays(data) == arrays  # no folder of the new runs, no array written
    assert chunk_files(data) == chunks
    with services.sessions() as db:
        old, new = (catalog.get_session(db, payload["session"]["id"]) for payload in (first, second))
        for old_run, new_run in zip(old.runs, new.runs, strict=True):
            assert new_run.input_key == old_run.input_key is not None
            assert new_run.tensor_count == old_run.tensor_count
            old_keys = [t.store_key for t in catalog.list_tensors(db, old_run.id)]
            assert [t.store_key for t in catalog.list_tensors(db, new_run.id)] == old_keys
    assert_slices_read(services, second["session"]["id"])


def test_a_touched_or_changed_file_is_ingested_again(
    services: Services, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "reference", tmp_path / "candidate"
    write_dump(a, candidate=False)
    write_dump(b, candidate=True)
    data = services.settings.data_dir
    first = compare(services, a, b, capsys)
    before = set(stored_arrays(data))

    touched = b / "2_post_mlp.pth"
    stat = touched.stat()
    os.utime(touched, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    second = compare(services, a, b, capsys)
    assert verdicts(second) == verdicts(first)
    reference, candidate = session_runs(services, second["session"]["id"])
    assert str(reference.id) not in stored_arrays(data)  # the reference's files are unchanged: reused
    assert str(candidate.id) in set(stored_arrays(data)) - before  # the candidate was read again
    # ... and its tensors are bit-identical to those stored before, so they share those arrays
    with services.sessions() as db:
        keys = {t.store_key for t in catalog.list_tensors(db, candidate.id)}
    assert all(not key.startswith(f"runs/{candidate.id}/") for key in keys)

    # new values, same size, and the modification time set back: the change time and the digest still differ
    stat = touched.stat()
    torch.save(torch.zeros(64, 48), touched)
    assert touched.stat().st_size == stat.st_size
    os.utime(touched, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    third = compare(services, a, b, capsys)
    changed = [
        name
        for (name, _, stats), (_, _, before) in zip(verdicts(third), verdicts(first), strict=True)
        if stats != before
    ]
    assert changed == ["2_post_mlp"]
    candidate = session_runs(services, third["session"]["id"])[1]
    assert str(candidate.id) in stored_arrays(data)


@pytest.mark.parametrize(BACKEND_FIXTURES, BACKENDS, indirect=True)
def test_deleting_one_session_keeps_the_arrays_another_shares(
    services: Services, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "reference", tmp_path / "candidate"
    write_dump(a, candidate=False)
    write_dump(b, candidate=True)
    first = compare(services, a, b, capsys)
    second = compare(services, a, b, capsys)
    arrays = stored_arrays(services.store)

    with services.sessions() as db:
        catalog.delete_session(db, services.store, first["session"]["id"])
    assert stored_arrays(services.store) == arrays  # every array is named by the second session's rows
    assert_slices_read(services, second["session"]["id"])
    assert_tensors_read(services, second["session"]["id"], {"reference": a, "candidate": b})
    third = compare(services, a, b, capsys)  # the second session's runs are reused in turn
    assert verdicts(third) == verdicts(first)
    assert stored_arrays(services.store) == arrays

    for payload in (second, third):
        with services.sessions() as db:
            catalog.delete_session(db, services.store, payload["session"]["id"])
    assert stored_arrays(services.store) == {}
    with services.sessions() as db:
        assert db.scalar(select(TensorRecord.id).limit(1)) is None


def test_an_array_is_deleted_with_the_last_row_naming_it(services: Services, tmp_path: Path) -> None:
    """Two sessions of different files sharing one bit-identical tensor: deleting the session that wrote it keeps
    that array only."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    shared = torch.arange(12.0).reshape(3, 4)
    torch.save(shared, one / "0_query.pth")
    torch.save(torch.ones(5), one / "0_key.pth")
    torch.save(shared.clone(), two / "0_query.pth")
    torch.save(torch.zeros(5), two / "0_key.pth")
    first = services.ingestor.ingest("one", "ref", [InputFile(one, "one")])
    second = services.ingestor.ingest("two", "ref", [InputFile(two, "two")])
    assert second.reused_run_id is None
    with services.sessions() as db:
        keys = {t.name: t.store_key for t in catalog.list_tensors(db, second.run_id)}
    assert keys["0_query"].startswith(f"runs/{first.run_id}/")
    assert keys["0_key"].startswith(f"runs/{second.run_id}/")
    assert stored_arrays(services.settings.data_dir)[str(second.run_id)] == {keys["0_key"].rsplit("/", 1)[1]}

    with services.sessions() as db:
        catalog.delete_session(db, services.store, first.session_id)
    assert stored_arrays(services.settings.data_dir) == {
        str(first.run_id): {keys["0_query"].rsplit("/", 1)[1]},
        str(second.run_id): {keys["0_key"].rsplit("/", 1)[1]},
    }
    assert torch.equal(services.store.read_whole(keys["0_query"], parse_dtype("float32")), shared)
    with services.sessions() as db:
        catalog.delete_session(db, services.store, second.session_id)
    assert stored_arrays(services.settings.data_dir) == {}


def test_recovery_leaves_shared_arrays_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """After a crash that left a half-deleted session (rows gone, arrays not) and a killed ingest, recovery removes
    what nothing names in their folders and keeps the arrays another session's rows share; an array in a folder this
    database never made is not recovery's to remove."""
    a, b = tmp_path / "reference", tmp_path / "candidate"
    write_dump(a, candidate=False)
    write_dump(b, candidate=True)
    settings = Settings(data_dir=tmp_path / "data", demo=False)
    data = settings.data_dir
    services = open_services(settings)
    try:
        first = compare(services, a, b, capsys)
        second = compare(services, a, b, capsys)
        arrays = stored_arrays(data)
        services.store.create("runs/999/0", (3,), parse_dtype("float32"), (3,))  # no run of this database's
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        with sqlite3.connect(data / "metadata.sqlite3") as conn:
            conn.execute("PRAGMA foreign_keys=ON")
            # the first session's deletion killed between its commit and its arrays' deletion
            conn.execute("DELETE FROM sessions WHERE id = ?", (first["session"]["id"],))
            conn.execute(
                "INSERT INTO runs (session_id, label, role, position, status, ingest_pid, ingest_host, "
                "created_session, sources, tensor_count, total_bytes, created_at) VALUES (?, 'killed', "
                "'candidate', 2, 'ingesting', ?, ?, 0, '[]', 0, 0, '2026-01-01 00:00:00')",
                (second["session"]["id"], dead.pid, socket.gethostname()),
            )
            killed = conn.execute("SELECT max(id) FROM runs").fetchone()[0]
        services.store.create(f"runs/{killed}/0", (3,), parse_dtype("float32"), (3,))  # an ingest killed midway
    finally:
        services.close()
    assert set(stored_arrays(data)) == set(arrays) | {"999", str(killed)}
    services = open_services(settings)
    try:
        assert services.recovery.runs_removed == 1
        # the killed run's folder is gone, shared ones kept; run 999's, never recorded by this database, stays
        assert stored_arrays(data) == arrays | {"999": {"0"}}
        assert_slices_read(services, second["session"]["id"])
        assert_tensors_read(services, second["session"]["id"], {"reference": a, "candidate": b})
        third = compare(services, a, b, capsys)
        assert verdicts(third) == verdicts(first)
    finally:
        services.close()


def test_an_ingest_without_reuse_reads_the_files(services: Services, tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    torch.save(torch.randn(4, 4), folder / "0_query.pth")
    first = services.ingestor.ingest("s", "a", [InputFile(folder, "run")])
    again = services.ingestor.ingest("s", "b", [InputFile(folder, "run")])
    assert again.reused_run_id == first.run_id
    fresh = services.ingestor.ingest("s", "c", [InputFile(folder, "run")], reuse=False)
    assert fresh.reused_run_id is None
    other_label = services.ingestor.ingest("s", "d", [InputFile(folder, "elsewhere/run")])
    assert other_label.reused_run_id is None  # the label names the tensors: another label, another fingerprint
    missing = services.ingestor.ingest("s", "e", [InputFile(folder, "run"), InputFile(tmp_path / "nope", "nope")])
    assert missing.reused_run_id is None and missing.problems
    with services.sessions() as db:
        assert db.get_one(RunRecord, missing.run_id).input_key is None
    assert np.array_equal(
        services.store.read_whole(f"runs/{first.run_id}/0", parse_dtype("float32")).numpy(),
        torch.load(folder / "0_query.pth", weights_only=True).numpy(),
    )
