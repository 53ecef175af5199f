"""`POST /api/sessions` with files and `?against=`: a JSON object from a run's label to the label of the upload's run
it is compared against. A query parameter, not a form field: a form field's name is a run's label, so any field
name could be a run's. A wrong label, a run compared against itself, the reference or a cycle is refused with 400
naming it, and nothing is stored."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest
from tensor_debugger.demo.synthetic import Plant, write_dump

from tests.support import loopback_http as http
from tests.support.dumps import make_zip
from tests.support.servers import LiveServer, upload, wait_done


def versions(tmp_path: Path) -> list[tuple[str, Path]]:
    """Three dumps of one model: the reference, an "early" port (the same values) and a "late" one with a planted
    error in layer 1's pre_mlp."""
    files = []
    for label, plant in (("reference", None), ("early", None), ("late", Plant(1, "pre_mlp", (3, 5), 0.5))):
        folder = tmp_path / label
        write_dump(folder, layers=2, seed=4, plant=plant)
        files.append((label, make_zip(folder, tmp_path / f"{label}.zip")))
    return files


def sessions_named(server: LiveServer, name: str) -> list[str]:
    listed = http.get(f"{server.url}/api/sessions", params={"q": name}, headers=server.auth).json()
    return [s["name"] for s in listed if s["name"].startswith(name)]


def test_a_new_sessions_runs_can_be_compared_against_another_of_its_runs(
    shared_server: LiveServer, tmp_path: Path
) -> None:
    """ "late" compared against "early": its pairs face early's tensors, and its divergence is its own against
    early; "early" is compared against the reference, and passes."""
    against = quote(json.dumps({"late": "early"}))
    response = upload(shared_server, "versions upload", versions(tmp_path), url=f"/api/sessions?against={against}")
    assert response.status_code == 201, response.text
    session_id = int(response.json()["session"]["id"])
    session = http.get(f"{shared_server.url}/api/sessions/{session_id}", headers=shared_server.auth).json()
    runs = {r["label"]: r for r in session["runs"]}
    assert runs["late"]["compared_against"] == runs["early"]["id"]
    assert runs["early"]["compared_against"] is None and runs["reference"]["compared_against"] is None
    report = wait_done(shared_server, session_id)
    candidates = {c["label"]: c for c in report["candidates"]}
    assert candidates["late"]["against"] == "early" and candidates["late"]["against_run_id"] == runs["early"]["id"]
    assert candidates["late"]["first_divergence"]["name"] == "1_pre_mlp"
    assert candidates["early"]["first_divergence"] is None
    late_pairs = [p for p in report["pairs"] if p["b"]["run_id"] == runs["late"]["id"]]
    assert late_pairs and {p["a"]["run_id"] for p in late_pairs} == {runs["early"]["id"]}


@pytest.mark.parametrize(
    ("links", "said"),
    [
        (
            {"late": "middle"},
            "against: the upload has no run labelled 'middle' (its runs: 'reference', 'early', 'late')",
        ),
        ({"lately": "early"}, "against: the upload has no run labelled 'lately'"),
        ({"late": "late"}, "run 'late' cannot be compared against itself"),
        ({"reference": "early"}, "run 'reference' is the session's reference"),
        ({"late": "early", "early": "late"}, "that makes a cycle"),
        (["late", "early"], "against: give a JSON object"),
    ],
)
def test_a_wrong_against_is_refused_naming_it_and_nothing_is_stored(
    shared_server: LiveServer, tmp_path: Path, links: object, said: str
) -> None:
    name = f"refused against {len(str(links))} {said[:12]}"
    against = quote(json.dumps(links))
    response = upload(shared_server, name, versions(tmp_path), url=f"/api/sessions?against={against}")
    assert response.status_code == 400, response.text
    assert said in response.json()["detail"], response.json()
    assert sessions_named(shared_server, name) == []
    bad_json = upload(shared_server, name, versions(tmp_path), url="/api/sessions?against=%7Blate")
    assert bad_json.status_code == 400 and "against: not JSON" in bad_json.json()["detail"], bad_json.text
    assert sessions_named(shared_server, name) == []


def test_against_is_only_for_an_upload_of_runs(shared_server: LiveServer) -> None:
    response = http.post(
        f"{shared_server.url}/api/sessions",
        params={"against": json.dumps({"late": "early"})},
        json={"name": "empty with against"},
        headers=shared_server.auth,
    )
    assert response.status_code == 400 and "against: only for an upload of runs" in response.json()["detail"]
    assert sessions_named(shared_server, "empty with against") == []
    document = http.get(f"{shared_server.url}/schema/openapi.json", headers=shared_server.auth).json()
    parameters = {p["name"]: p for p in document["paths"]["/api/sessions"]["post"]["parameters"]}
    assert "JSON object" in parameters["against"]["description"] and parameters["against"]["in"] == "query"
