"""ULP tolerances through the CLI, the API and the session page: bfloat16 tensors one ULP apart pass with one ULP
and fail with tight tolerances."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.support import loopback_http
from tests.support.cli_main import main_cli
from tests.support.dumps import make_zip, seeded
from tests.support.servers import LiveServer, upload, wait_done


def one_ulp_apart(root: Path) -> tuple[Path, Path]:
    """A reference of bfloat16 tensors and a candidate whose every value is the next bfloat16 away from zero."""
    ref, cand = root / "ref", root / "cand"
    ref.mkdir()
    cand.mkdir()
    for n, name in enumerate(("0_attn_out", "1_mlp_out")):
        a = seeded((16, 32), n).to(torch.bfloat16)
        b = (a.abs().view(torch.int16) + 1).view(torch.bfloat16) * torch.where(a.float() < 0, -1.0, 1.0)
        torch.save(a, ref / f"{name}.pth")
        torch.save(b.to(torch.bfloat16), cand / f"{name}.pth")
    return ref, cand


def test_cli_one_ulp_passes_and_tight_tolerances_fail(tmp_path: Path) -> None:
    ref, cand = one_ulp_apart(tmp_path)
    data = str(tmp_path / "data")
    passed = main_cli("--data-dir", data, "compare", str(ref), str(cand), "--ulp", "1", "--json")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert {p["status"] for p in json.loads(passed.stdout)["pairs"]} == {"pass"}
    tight = main_cli("--data-dir", data, "compare", str(ref), str(cand), "--rtol", "1e-6", "--atol", "0", "--json")
    assert tight.returncode == 1
    assert {p["stats"]["mismatched"] for p in json.loads(tight.stdout)["pairs"]} == {16 * 32}


def test_api_and_page_switch_a_session_to_ulps(shared_server: LiveServer, tmp_path: Path) -> None:
    ref, cand = one_ulp_apart(tmp_path)
    files = [("reference", make_zip(ref, tmp_path / "r.zip")), ("candidate", make_zip(cand, tmp_path / "c.zip"))]
    response = upload(shared_server, "ulp tolerances", files)
    assert response.status_code == 201, response.text
    session_id = int(response.json()["session"]["id"])
    wait_done(shared_server, session_id)
    url = f"{shared_server.url}/api/sessions/{session_id}"
    assert loopback_http.patch(url, json={"rtol": 1e-6, "atol": 0}).status_code == 200
    assert {p["status"] for p in wait_done(shared_server, session_id)["pairs"]} == {"fail"}
    switched = loopback_http.patch(url, json={"ulp": 1})
    assert switched.status_code == 200 and switched.json()["tolerances"]["ulp"] == 1
    report = wait_done(shared_server, session_id)
    assert {p["status"] for p in report["pairs"]} == {"pass"}
    pair = loopback_http.get(f"{shared_server.url}/api/pairs/{report['pairs'][0]['id']}").json()
    assert (pair["stats"]["ulp"], pair["stats"]["ulp_dtype"]) == (1, "bfloat16")
    assert "within 1 ULP of bfloat16" in loopback_http.get(f"{shared_server.url}/pairs/{report['pairs'][0]['id']}").text
    assert "Now: 1 ULP." in loopback_http.get(f"{shared_server.url}/sessions/{session_id}").text
    refused = loopback_http.patch(url, json={"ulp": 0})
    assert refused.status_code == 400 and "ulp" in refused.json()["detail"]
