"""Pairs through the HTTP API of a real server: progress, first divergence, slices, manual pairing, alignment
overrides, tolerances, and a computation killed with kill -9 that resumes on restart."""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch
from tensor_debugger.demo.synthetic import Plant, write_dump
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings

from tests.support import loopback_http as http
from tests.support.backends import BACKEND_FIXTURES, BACKENDS
from tests.support.dumps import make_zip, seeded
from tests.support.polling import wait_until
from tests.support.postgres import DATABASES
from tests.support.servers import LiveServer, free_port, upload, wait_done


def session_with_plant(
    server: LiveServer, tmp_path: Path, name: str, extra: dict[str, torch.Tensor] | None = None
) -> int:
    write_dump(tmp_path / "ref", layers=2, seed=9)
    write_dump(tmp_path / "cand", layers=2, seed=9, plant=Plant(0, "pre_mlp", (11, 30), -0.4))
    for name, tensor in (extra or {}).items():
        torch.save(tensor, tmp_path / ("ref" if name.startswith("a:") else "cand") / f"{name[2:]}.pth")
    reference = make_zip(tmp_path / "ref", tmp_path / "reference.zip")
    candidate = make_zip(tmp_path / "cand", tmp_path / "candidate.zip")
    response = upload(server, name, [("reference", reference), ("candidate", candidate)])
    assert response.status_code == 201, response.text
    return int(response.json()["session"]["id"])


@pytest.mark.parametrize(BACKEND_FIXTURES, BACKENDS, indirect=True)
def test_first_divergence_detail_and_slices(shared_server: LiveServer, tmp_path: Path, store_url: str) -> None:
    session_id = session_with_plant(shared_server, tmp_path, "api pairs: slices")
    report = wait_done(shared_server, session_id)
    first = report["first_divergence"]
    assert (first["name"], first["layer"], first["stage"], first["argmax"]) == ("0_pre_mlp", 0, "pre_mlp", [11, 30])
    assert report["progress"]["failing"] == sum(1 for p in report["pairs"] if p["status"] == "fail")
    again = http.get(f"{shared_server.url}/api/sessions/{session_id}/first-divergence").json()
    assert again["first_divergence"] == first
    detail = http.get(f"{shared_server.url}/api/pairs/{first['pair_id']}").json()
    assert detail["argmax"]["aligned"] == [11, 30] and detail["argmax"]["b"]["index"] == [11, 30]
    assert sum(detail["stats"]["histogram"]) == 16 * 32
    page = http.get(f"{shared_server.url}/pairs/{first['pair_id']}")
    assert page.status_code == 200 and "0_pre_mlp" in page.text
    window = http.get(
        f"{shared_server.url}/api/pairs/{first['pair_id']}/slice", params={"index": "11,:", "start": "28", "count": "4"}
    ).json()
    assert window["window"] == [{"dim": 1, "start": 28, "count": 4}]
    assert window["diff"][2] == pVal(-0.4)
    bad = http.get(f"{shared_server.url}/api/pairs/{first['pair_id']}/slice", params={"index": "99,:"})
    assert bad.status_code == 400 and "out of range" in bad.json()["detail"]
    assert (shared_server.data_dir / "arrays").exists() == (not store_url)  # on S3, no array on local disk


def pVal(value: float) -> Any:
    return pytest.approx(value, abs=1e-6)


@pytest.mark.parametrize("database_url", DATABASES, indirect=True)
def test_tolerances_manual_pairs_and_alignment_overrides(shared_server: LiveServer, tmp_path: Path) -> None:
    extra = {
        "a:orphan_reference": seeded((6, 4), 1),
        "b:renamed_candidate": seeded((6, 4), 1),
        "a:0_mystery": seeded((6, 6), 2),
        "b:0_mystery": seeded((6, 6), 2).t().contiguous(),  # square: no shape tells it is transposed
    }
    session_id = session_with_plant(shared_server, tmp_path, "api pairs: overrides", extra)
    report = wait_done(shared_server, session_id)
    pairs = {p["name"]: p for p in report["pairs"]}
    # a unique shape pairs these two automatically; unpair, then pair by hand
    shape_pair = next(p for p in report["pairs"] if p["a"]["name"] == "orphan_reference")
    assert shape_pair["strategy"] == "shape"
    assert http.delete(f"{shared_server.url}/api/pairs/{shape_pair['id']}").status_code == 204
    report = wait_done(shared_server, session_id)
    assert {u["name"] for u in report["unmatched"]} == {"orphan_reference", "renamed_candidate"}
    # an unpair by hand is "never these two", not "this tensor may go uncompared": the session lacks it now
    orphan = next(u for u in report["unmatched"] if u["name"] == "orphan_reference")
    assert orphan["allowed"] is False and "orphan_reference" in report["coverage"]["unmatched"]
    made = http.post(
        f"{shared_server.url}/api/sessions/{session_id}/pairs",
        json={"a_name": "orphan_reference", "b_name": "renamed_candidate"},
    )
    assert made.status_code == 201 and made.json()["strategy"] == "manual"
    report = wait_done(shared_server, session_id)
    assert report["unmatched"] == []
    manual = next(p for p in report["pairs"] if p["a"]["name"] == "orphan_reference")
    assert manual["status"] == "pass"
    # a square weight stored transposed: compared as it is, it fails; a user overrides its alignment (the pair as
    # the latest plan made it: planning again gives pairs new ids, which only SQLite may hand out again)
    assert pairs["0_mystery"]["status"] == "fail"
    mystery = next(p for p in report["pairs"] if p["name"] == "0_mystery")
    assert mystery["alignment"] == "same shape" and mystery["status"] == "fail"
    steps = [{"side": "b", "kind": "permute", "perm": [1, 0], "shape": [6, 6]}]
    overridden = http.put(f"{shared_server.url}/api/pairs/{mystery['id']}/alignment", json={"steps": steps})
    assert overridden.status_code == 200 and overridden.json()["alignment_overridden"]
    report = wait_done(shared_server, session_id)
    mystery = next(p for p in report["pairs"] if p["name"] == "0_mystery")
    assert mystery["status"] == "pass" and "permuted [1, 0]" in mystery["alignment"]
    wrong = http.put(
        f"{shared_server.url}/api/pairs/{mystery['id']}/alignment",
        json={"steps": [{"side": "b", "kind": "permute", "perm": [0, 0]}]},
    )
    assert wrong.status_code == 400
    # tolerances: loose enough and the planted difference passes; verdicts follow
    patched = http.patch(f"{shared_server.url}/api/sessions/{session_id}", json={"atol": 0.5})
    assert patched.status_code == 200 and patched.json()["tolerances"] == {"rtol": None, "atol": 0.5, "ulp": None}
    report = wait_done(shared_server, session_id)
    assert report["first_divergence"] is None and {p["status"] for p in report["pairs"]} == {"pass"}
    http.patch(f"{shared_server.url}/api/sessions/{session_id}", json={"default_tolerances": True})
    report = wait_done(shared_server, session_id)
    assert report["first_divergence"]["name"] == "0_pre_mlp"


def test_a_killed_computation_resumes_on_restart(tmp_path: Path) -> None:
    for side in ("ref", "cand"):
        folder = tmp_path / side
        folder.mkdir()
        for i in range(12):
            tensor = torch.full((1024, 1024), float(i))  # 4 MiB: with one thread each pair takes a while to compare
            if side == "cand" and i == 7:
                tensor[5, 5] = -1.0
            torch.save(tensor, folder / f"{i}_post_mlp.pth")
    # both runs ingested while no server runs, as `tensor-debugger ingest` does (here without two more interpreters)
    data = tmp_path / "data"
    services = open_services(Settings(data_dir=data, demo=False))
    try:
        for side in ("ref", "cand"):
            files = sorted((tmp_path / side).iterdir())
            assert services.ingestor.ingest("big", side, [InputFile(p, str(p)) for p in files]).tensors == 12
    finally:
        services.close()
    # short leases: the pairs the killed process had claimed are free again a second after it died, not 30 s
    env = {"TENSOR_DEBUGGER_CLAIM_SECONDS": "1", "TENSOR_DEBUGGER_WORKERS": "1"}
    server = LiveServer(data, free_port(), env=env)
    process = server.launch()
    # Watch the database itself, from the moment the process starts: the worker computes as soon as the server is
    # up, and the first verdict is written at once (later ones at most every 0.1 s). Each look holds the database's
    # write lock, and the look that sees a verdict keeps it until the process is killed: no later verdict can be
    # written in between, however long this test waits for the processor (the rest of the pairs take well under
    # 0.1 s to compare), so the process leaves what it had stored: some pairs done, most pending.
    watcher = sqlite3.connect(data / "metadata.sqlite3", timeout=30, isolation_level=None)

    def first_verdict_held() -> bool:
        if process.poll() is not None:
            return True
        watcher.execute("begin immediate")
        if watcher.execute("select count(*) from pairs where status != 'pending'").fetchone()[0] >= 1:
            return True
        watcher.execute("rollback")
        return False

    try:
        wait_until(first_verdict_held, what="the first verdict (or the server's exit)", timeout=120, interval=0.002)
        os.kill(process.pid, signal.SIGSTOP)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    finally:
        if watcher.in_transaction:
            watcher.execute("rollback")
        watcher.close()
    with sqlite3.connect(data / "metadata.sqlite3") as conn:
        pending = conn.execute("select count(*) from pairs where status = 'pending'").fetchone()[0]
        claimed = conn.execute("select count(*) from pairs where claimed_by is not null and status = 'pending'")
        held = claimed.fetchone()[0]
        finished = conn.execute(
            "select p.id, p.result_id, r.created_at from pairs p join comparison_results r on r.id = p.result_id"
        ).fetchall()
    assert pending > 0, "the computation finished before it could be killed"
    assert finished, "the computation was killed before it finished a pair"
    assert held > 0, "the killed process held no claim on the pairs it was computing"
    server.start()
    try:
        report = wait_done(server, 1)
        assert report["progress"]["total"] == 12
        assert report["first_divergence"]["name"] == "7_post_mlp"
        assert report["first_divergence"]["argmax"] == [5, 5]
    finally:
        server.stop()
    with sqlite3.connect(data / "metadata.sqlite3") as conn:
        # the pairs done before the kill kept their results, not computed again; the others were computed once each
        for pair_id, result_id, created_at in finished:
            row = conn.execute(
                "select p.result_id, r.created_at from pairs p join comparison_results r on r.id = p.result_id "
                "where p.id = ?",
                (pair_id,),
            ).fetchone()
            assert row == (result_id, created_at)
        assert conn.execute("select count(*) from comparison_results").fetchone()[0] == 12
