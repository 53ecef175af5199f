"""The HTTP API on a real server on loopback: uploads, listing, rename, delete, errors, restarts."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tensor_debugger.demo.synthetic import Plant, write_dump

from tests.support import loopback_http as http
from tests.support.dumps import make_tar, make_zip, seeded
from tests.support.polling import wait_until
from tests.support.postgres import DATABASES
from tests.support.servers import LiveServer, upload, wait_done, wait_staging_empty


def two_runs(tmp_path: Path) -> tuple[Path, Path]:
    write_dump(tmp_path / "ref", layers=2, seed=1)
    write_dump(tmp_path / "cand", layers=2, seed=1, plant=Plant(1, "post_attn", (3, 4), 0.5))
    return make_tar(tmp_path / "ref", tmp_path / "reference.tar.gz", "w:gz"), make_zip(
        tmp_path / "cand", tmp_path / "candidate.zip"
    )


def snapshot(server: LiveServer) -> dict[str, Any]:
    """Everything the API says about every session, run and tensor."""
    sessions = http.get(server.url + "/api/sessions").json()
    full: dict[str, Any] = {"sessions": sessions, "detail": {}, "tensors": {}}
    for s in sessions:
        full["detail"][s["id"]] = http.get(f"{server.url}/api/sessions/{s['id']}").json()
        for r in s["runs"]:
            full["tensors"][r["id"]] = http.get(f"{server.url}/api/runs/{r['id']}/tensors").json()
    return full


@pytest.mark.parametrize("database_url", DATABASES, indirect=True)
def test_create_session_with_two_uploaded_runs(shared_server: LiveServer, tmp_path: Path) -> None:
    reference, candidate = two_runs(tmp_path)
    junk = tmp_path / "notes.txt"
    junk.write_text("not a tensor")
    response = upload(
        shared_server, "port vs ref", [("reference", reference), ("candidate", candidate), ("candidate", junk)]
    )
    assert response.status_code == 201, response.text
    body = response.json()
    session = body["session"]
    assert session["name"] == "port vs ref"
    assert [(r["label"], r["role"], r["status"], r["tensors"]) for r in session["runs"]] == [
        ("reference", "reference", "ready", 26),
        ("candidate", "candidate", "ready", 26),
    ]
    assert session["runs"][1]["sources"] == ["candidate.zip", "notes.txt"]
    assert session["runs"][1]["problems"] == [
        {
            "file": "notes.txt",
            "reason": "not a tensor file or archive (unknown extension '.txt'); skipped",
            "ignored": True,
            "note": False,
        }
    ]
    tensors = http.get(f"{shared_server.url}/api/runs/{session['runs'][1]['id']}/tensors").json()
    planted = next(t for t in tensors if t["name"] == "1_post_attn")
    assert (planted["layer"], planted["stage"], planted["shape"], planted["dtype"]) == (
        1,
        "post_attn",
        [16, 32],
        "float32",
    )
    detail = http.get(f"{shared_server.url}/api/tensors/{planted['id']}").json()
    assert detail == planted
    reference_tensor = next(
        t
        for t in http.get(f"{shared_server.url}/api/runs/{session['runs'][0]['id']}/tensors").json()
        if t["name"] == "1_post_attn"
    )
    assert detail["digest"] != reference_tensor["digest"]
    assert (
        detail["stats"]["max"] > reference_tensor["stats"]["max"]
        or detail["stats"]["mean"] != reference_tensor["stats"]["mean"]
    )


def test_list_search_rename_delete(shared_server: LiveServer, tmp_path: Path) -> None:
    reference, candidate = two_runs(tmp_path)
    first = upload(shared_server, "api list: alpha run", [("reference", reference)]).json()["session"]
    second = upload(shared_server, "api list: Beta run", [("reference", candidate)]).json()["session"]

    def listed(q: str) -> list[str]:
        return [s["name"] for s in http.get(shared_server.url + "/api/sessions", params={"q": q}).json()]

    assert listed("API LIST:") == ["api list: Beta run", "api list: alpha run"]  # newest first
    assert listed("api list: BETA") == ["api list: Beta run"]
    renamed = http.patch(
        f"{shared_server.url}/api/sessions/{first['id']}", json={"name": "api list: gamma", "notes": "n"}
    )
    assert renamed.status_code == 200 and renamed.json()["name"] == "api list: gamma" and renamed.json()["notes"] == "n"
    clash = http.patch(f"{shared_server.url}/api/sessions/{first['id']}", json={"name": "api list: Beta run"})
    assert clash.status_code == 409 and "exists already" in clash.json()["detail"]
    arrays = shared_server.data_dir / "arrays" / "runs" / str(second["runs"][0]["id"])
    assert arrays.exists()
    assert http.delete(f"{shared_server.url}/api/sessions/{second['id']}").status_code == 204
    assert not arrays.exists()
    assert http.get(f"{shared_server.url}/api/sessions/{second['id']}").status_code == 404
    assert listed("api list:") == ["api list: gamma"]


def test_empty_session_then_add_runs(shared_server: LiveServer, tmp_path: Path) -> None:
    created = http.post(shared_server.url + "/api/sessions", json={"name": "later"})
    assert created.status_code == 201
    session_id = created.json()["id"]
    path = tmp_path / "0_query.npy"
    np.save(path, np.arange(6, dtype=np.float32))
    added = upload(shared_server, "", [("files", path)], url=f"/api/sessions/{session_id}/runs?label=reference")
    assert added.status_code == 201, added.text
    assert added.json()["runs"][0]["label"] == "reference" and added.json()["runs"][0]["tensors"] == 1
    again = upload(shared_server, "", [("files", path)], url=f"/api/sessions/{session_id}/runs?label=reference")
    assert again.status_code == 409


def test_bad_uploads_get_clear_errors_and_the_server_stays_up(shared_server: LiveServer, tmp_path: Path) -> None:
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as z:
        buffer = io.BytesIO()
        torch.save(seeded((2,), 0), buffer)
        z.writestr("../../escape.pth", buffer.getvalue())
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"\x00" * 100)
    response = upload(shared_server, "api: bad uploads", [("reference", evil), ("candidate", garbage)])
    assert response.status_code == 422
    body = response.json()
    problems = {p["file"]: p["reason"] for run in body["runs"] for p in run["problems"]}
    assert "escape the archive" in problems["evil.zip"]
    assert "not a readable PyTorch file" in problems["garbage.pth"]
    assert "api: bad uploads" not in {s["name"] for s in http.get(shared_server.url + "/api/sessions").json()}
    assert not (tmp_path.parent / "escape.pth").exists()
    malformed = http.post(
        shared_server.url + "/api/sessions",
        content=b"--x\r\nnonsense",
        headers={"content-type": "multipart/form-data; boundary=x"},
    )
    assert malformed.status_code == 400
    assert http.get(shared_server.url + "/api/sessions/12345").status_code == 404
    assert shared_server.alive()
    wait_staging_empty(shared_server)


def test_large_upload_streams_past_the_default_body_limit(shared_server: LiveServer, tmp_path: Path) -> None:
    path = tmp_path / "0_big.pth"
    torch.save(seeded((64, 1024 * 64), 3), path)  # 16 MiB: past Litestar's 10 MB default
    response = upload(shared_server, "big", [("reference", path)])
    assert response.status_code == 201, response.text
    assert response.json()["session"]["runs"][0]["total_bytes"] == 16 * 1024 * 1024


def test_uploads_stream_to_disk_not_memory(live_server: LiveServer, tmp_path: Path) -> None:
    """64 MiB through the upload path (refused afterwards, as not a tensor) must not reach the heap."""
    path = tmp_path / "blob.txt"
    with open(path, "wb") as out:
        out.writelines(bytes([i]) * (1024 * 1024) for i in range(64))
    assert live_server.process is not None
    before = _peak_rss_kib(live_server.process.pid)
    response = upload(live_server, "blob", [("reference", path)])
    assert response.status_code == 422
    grown_mib = (_peak_rss_kib(live_server.process.pid) - before) / 1024
    assert grown_mib < 16, f"server peak RSS grew {grown_mib:.0f} MiB while receiving a 64 MiB upload"


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_restart_finds_everything_unchanged(live_server: LiveServer, tmp_path: Path) -> None:
    reference, candidate = two_runs(tmp_path)
    assert upload(live_server, "persist", [("reference", reference), ("candidate", candidate)]).status_code == 201
    http.post(live_server.url + "/api/sessions", json={"name": "empty one", "notes": "kept too"})
    before = snapshot(live_server)
    live_server.stop()
    live_server.start()
    assert snapshot(live_server) == before
    assert len(before["tensors"]) == 2 and all(len(t) == 26 for t in before["tensors"].values())


def test_openapi_lists_the_api(shared_server: LiveServer) -> None:
    schema = http.get(shared_server.url + "/schema/openapi.json").json()
    assert {
        "/api/sessions",
        "/api/sessions/{session_id}",
        "/api/runs/{run_id}/tensors",
        "/api/tensors/{tensor_id}",
        "/api/sessions/{session_id}/runs",
    } <= set(schema["paths"])


def poll_progress(server: LiveServer, url: str, timeout: float = 120) -> dict[str, Any]:
    """GET the progress until everything is done (ingest, planning, comparisons); the last answer."""
    progress: dict[str, Any] = wait_until(
        lambda: http.get(server.url + url, timeout=30).json(),
        until=lambda p: p["stage"] == "done",
        what=f"{url} to say stage 'done'",
        timeout=timeout,
        interval=0.03,
    )
    return progress


def test_upload_without_waiting_answers_at_once_then_the_runs_become_ready(
    shared_server: LiveServer, tmp_path: Path
) -> None:
    reference, candidate = two_runs(tmp_path)
    response = upload(
        shared_server,
        "in the background",
        [("reference", reference), ("candidate", candidate)],
        url="/api/sessions?wait=false",
    )
    assert response.status_code == 202, response.text
    body = response.json()
    session_id = body["session"]["id"]
    assert response.headers["location"] == body["url"] == f"/sessions/{session_id}"
    assert body["progress"] == f"/api/sessions/{session_id}/progress"
    assert [(r["label"], r["status"]) for r in body["runs"]] == [("reference", "ingesting"), ("candidate", "ingesting")]
    assert [r["label"] for r in body["session"]["runs"]] == ["reference", "candidate"]

    progress = poll_progress(shared_server, body["progress"])
    assert [(r["label"], r["status"], r["words"]) for r in progress["runs"]] == [
        ("reference", "ready", "ready"),
        ("candidate", "ready", "ready"),
    ]
    assert progress["pairs"] == {
        "total": 26,
        "done": 26,
        "pending": 0,
        "failing": progress["pairs"]["failing"],
        "errors": 0,
        "not_compared": 0,
    }
    assert progress["pairs"]["failing"] > 0
    run = http.get(f"{shared_server.url}/api/runs/{body['runs'][1]['run_id']}").json()
    assert (run["status"], run["tensors"], run["ingest"]) == ("ready", 26, None)
    first = http.get(f"{shared_server.url}/api/sessions/{session_id}/first-divergence").json()["first_divergence"]
    assert (first["name"], first["argmax"]) == ("1_post_attn", [3, 4])
    wait_staging_empty(shared_server)  # the uploaded files are gone once ingested


def test_a_background_ingest_that_finds_nothing_says_why(shared_server: LiveServer, tmp_path: Path) -> None:
    """Corruption only the ingest can see: the request has answered 202 long before, so the run stays, "failed",
    with every file's reason, on the API and on the session page; uploading that run again replaces it."""
    _, candidate = two_runs(tmp_path)
    garbage = tmp_path / "weights.pth"
    garbage.write_bytes(b"\x00" * 100)
    notes = tmp_path / "notes.txt"
    notes.write_text("not a tensor")
    response = upload(
        shared_server,
        "half broken",
        [("reference", garbage), ("reference", notes), ("candidate", candidate)],
        url="/api/sessions?wait=false",
    )
    assert response.status_code == 202, response.text
    session_id = response.json()["session"]["id"]
    progress = poll_progress(shared_server, f"/api/sessions/{session_id}/progress")
    assert [(r["label"], r["status"], r["problems"]) for r in progress["runs"]] == [
        ("reference", "failed", 2),
        ("candidate", "ready", 0),
    ]
    assert progress["pairs"]["total"] == 0
    session = http.get(f"{shared_server.url}/api/sessions/{session_id}").json()
    reasons = {p["file"]: p["reason"] for p in session["runs"][0]["problems"]}
    assert set(reasons) == {"weights.pth", "notes.txt"}
    assert "not a readable PyTorch file" in reasons["weights.pth"]
    assert "unknown extension '.txt'" in reasons["notes.txt"]
    assert not (shared_server.data_dir / "arrays" / "runs" / str(session["runs"][0]["id"])).exists()

    page = http.get(f"{shared_server.url}/sessions/{session_id}").text
    assert "The reference run “reference” could not be ingested" in page
    assert "No tensors found in weights.pth, notes.txt" in page
    assert "<strong>weights.pth</strong>: not a readable PyTorch file" in page
    assert "<strong>notes.txt</strong>: not a tensor file or archive" in page

    reference, _ = two_runs(tmp_path / "again")
    again = upload(shared_server, "", [("reference", reference)], url=f"/api/sessions/{session_id}/runs")
    assert again.status_code == 201, again.text
    runs = http.get(f"{shared_server.url}/api/sessions/{session_id}").json()["runs"]
    assert [(r["label"], r["role"], r["status"], r["problems"]) for r in runs] == [
        ("reference", "reference", "ready", []),
        ("candidate", "candidate", "ready", []),
    ]
    assert poll_progress(shared_server, f"/api/sessions/{session_id}/progress")["pairs"]["total"] == 26


def test_a_reference_with_nothing_usable_is_kept_failed_beside_the_candidate(
    shared_server: LiveServer, tmp_path: Path
) -> None:
    """The session keeps the failed reference and why, so its page says what to fix; when no run is usable at all,
    nothing is kept (422)."""
    bad, good = tmp_path / "ref.pth", tmp_path / "cand.pth"
    bad.write_text("see the wiki for the weights")
    torch.save(seeded((4,), 1), good)
    response = upload(shared_server, "bad reference kept", [("reference", bad), ("candidate", good)])
    assert response.status_code == 201, response.text
    session = http.get(f"{shared_server.url}/api/sessions/{response.json()['session']['id']}").json()
    runs = {r["label"]: r for r in session["runs"]}
    assert (runs["reference"]["status"], runs["reference"]["role"]) == ("failed", "reference")
    assert runs["reference"]["problems"][0]["reason"].startswith("not a readable PyTorch file: neither a zip archive")
    assert runs["candidate"]["status"] == "ready"
    page = http.get(f"{shared_server.url}/sessions/{session['id']}").text
    assert "could not be ingested" in page and "Add a second run" not in page
    refused = upload(shared_server, "nothing usable", [("reference", bad), ("candidate", bad)])
    assert refused.status_code == 422
    assert "nothing usable" not in [s["name"] for s in http.get(f"{shared_server.url}/api/sessions").json()]


def test_a_file_that_cannot_be_read_makes_the_session_page_say_incomplete(
    shared_server: LiveServer, tmp_path: Path
) -> None:
    for side in ("ref", "cand"):
        (tmp_path / side).mkdir()
        for layer in range(2):
            torch.save(seeded((4, 4), layer), tmp_path / side / f"{layer}_post_mlp.pth")
    cut = tmp_path / "cand" / "1_post_mlp.pth"
    cut.write_bytes(cut.read_bytes()[:200])
    files = [
        ("reference", make_zip(tmp_path / "ref", tmp_path / "ref.zip")),
        ("candidate", make_zip(tmp_path / "cand", tmp_path / "cand.zip")),
    ]
    response = upload(shared_server, "incomplete upload", files)
    assert response.status_code == 201, response.text
    session_id = response.json()["session"]["id"]
    wait_done(shared_server, session_id)  # said once the comparisons are done
    page = http.get(f"{shared_server.url}/sessions/{session_id}").text
    assert "Incomplete: 1 input file could not be read, so its tensors are missing" in page
    assert "1_post_mlp.pth" in page and "1 problem" in page


def test_a_session_of_one_run_has_the_verdict_no_candidate(shared_server: LiveServer, tmp_path: Path) -> None:
    """A run uploaded alone, labelled "candidate", becomes the session's reference: the 201 says its role, and once
    it is ready the verdict is `no_candidate`, not `comparing` (before, a script polling until the verdict changed
    never ended: failed on the parent commit), until a candidate is added."""
    alone = tmp_path / "c.npz"
    np.savez(alone, x=np.arange(6, dtype=np.float32))
    response = upload(shared_server, "only a candidate", [("candidate", alone)])
    assert response.status_code == 201, response.text
    assert [(r["label"], r["role"]) for r in response.json()["runs"]] == [("candidate", "reference")]
    session_id = response.json()["session"]["id"]
    for path in ("pairs", "first-divergence"):
        got = http.get(f"{shared_server.url}/api/sessions/{session_id}/{path}", headers=shared_server.auth).json()
        assert got["verdict"] == "no_candidate", (path, got)
    np.savez(second := tmp_path / "d.npz", x=np.arange(6, dtype=np.float32))
    added = upload(shared_server, "", [("fixed", second)], url=f"/api/sessions/{session_id}/runs")
    assert added.status_code == 201, added.text
    assert [(r["label"], r["role"]) for r in added.json()["runs"]] == [("fixed", "candidate")]
    assert wait_done(shared_server, session_id)["verdict"] == "no_divergence"
