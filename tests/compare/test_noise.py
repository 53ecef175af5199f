"""The noise floor: a rerun of the reference with 1e-4 noise, a candidate with the same noise and a real bug at
layer 2 only. By tolerance every pair fails; against the noise floor only the bug's pairs do. Through the CLI (in
this process and handed to a server), the API's upload with a `noise` field and the session page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services

from tests.support import loopback_http
from tests.support.cli_main import main_cli
from tests.support.dumps import layered_dump
from tests.support.servers import LiveServer, upload, wait_done
from tests.support.sessions import computed

BUG = {"2_attn", "2_mlp"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("noise")
    return {
        "ref": layered_dump(root / "ref", None, noise=1e-4, seed=1),
        "rerun": layered_dump(root / "rerun", None, noise=1e-4, seed=2),
        "cand": layered_dump(root / "cand", 2, noise=1e-4, seed=3, bug_to=3),
    }


def test_only_the_bug_diverges_against_the_noise_floor(runs: dict[str, Path], tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    done = main_cli(
        "--data-dir", data, "compare", str(runs["ref"]), str(runs["cand"]), "--noise", str(runs["rerun"]), "--json"
    )
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    assert {p["name"] for p in out["pairs"] if p["status"] == "fail"} == BUG
    assert out["first_divergence"]["name"] == "2_attn"
    assert {p["rule"] for p in out["pairs"]} == {"noise"}
    assert {p["candidate"] for p in out["pairs"]} == {"cand"}  # the rerun is no candidate
    floors = [p["noise_max_abs_diff"] for p in out["pairs"]]
    assert all(1e-4 < f < 2e-4 for f in floors), floors  # two draws of ±1e-4: at most 2e-4 apart


def test_noise_through_a_server_its_upload_and_page(shared_server: LiveServer, runs: dict[str, Path]) -> None:
    data = str(shared_server.data_dir)
    plain = main_cli("--data-dir", data, "compare", str(runs["ref"]), str(runs["cand"]), "--name", "no floor", "--json")
    assert plain.returncode == 1
    out = json.loads(plain.stdout)
    assert all(p["status"] == "fail" and p["rule"] == "tolerance" for p in out["pairs"])  # noise beats tolerances
    assert out["first_divergence"]["name"] == "0_attn"
    compare = ["--data-dir", data, "compare", str(runs["ref"]), str(runs["cand"]), "--noise", str(runs["rerun"])]
    tight = main_cli(*compare, "--noise-factor", "0.01", "--json")
    assert json.loads(tight.stdout)["first_divergence"]["name"] == "0_attn"  # within 1% of the floor: nothing is
    fast = main_cli(*compare, "--fail-fast", "--json")
    assert fast.returncode == 1 and json.loads(fast.stdout)["first_divergence"]["name"] == "2_attn"
    refused = main_cli(*compare, "--noise-factor", "-1", "--json")
    assert refused.returncode == 2 and "noise factor must be a positive" in json.loads(refused.stdout)["error"]

    files = [(field, path) for field, run in (("reference", "ref"), ("candidate", "cand"), ("noise", "rerun"))
             for path in sorted(runs[run].iterdir())]  # fmt: skip
    created = upload(shared_server, "noise floor upload", files)
    assert created.status_code in (201, 202), created.text
    session_id = created.json()["session"]["id"]
    report = wait_done(shared_server, session_id)
    assert {p["name"] for p in report["pairs"] if p["status"] == "fail"} == BUG
    assert [c["label"] for c in report["candidates"]] == ["candidate"]
    assert {p["rule"] for p in report["pairs"]} == {"noise"}
    # one group of every pair (the grouped view opens only the failing groups)
    page = loopback_http.get(f"{shared_server.url}/sessions/{session_id}?group=none", headers=shared_server.auth).text
    assert ">Noise floor</th>" in page and page.count('<small class="rule">by noise</small>') == 8
    assert "within 4× the rerun" in page
    form = loopback_http.get(f"{shared_server.url}/", headers=shared_server.auth).text
    assert '<input type="file" name="noise" multiple>' in form


def test_the_floor_judges_only_pairs_against_the_reference(services: Services, tmp_path: Path) -> None:
    """The rerun measures the reference's noise: a candidate compared against another candidate is judged by the
    tolerances, not by the reference's floor (3e-3 apart, within 4 times a 1e-3 floor, fails the tolerances)."""
    base = torch.linspace(1.0, 2.0, 16)
    values = {"ref": base, "rerun": base + 1e-3, "early": base + 1.0, "late": base + 1.0 + 3e-3}
    session_id = 0
    for label, x in values.items():
        (tmp_path / label).mkdir()
        torch.save({"x": x}, tmp_path / label / "acts.pt")
        files = [InputFile(tmp_path / label / "acts.pt", "acts.pt")]  # the same tensor names in every run
        role, against = ("noise", None) if label == "rerun" else (None, "early" if label == "late" else None)
        session_id = services.ingestor.ingest(
            "floors", label, files, reuse=False, role=role, against=against
        ).session_id
    report = computed(services, session_id)
    labels = {c.run_id: c.label for c in report.candidates} | {c.against_run_id: c.against for c in report.candidates}
    by_candidate = {(labels[p.b.run_id], labels[p.a.run_id]): p for p in report.pairs}
    assert set(by_candidate) == {("early", "ref"), ("late", "early")}
    early = by_candidate["early", "ref"]  # 1.0 off, far beyond 4 times the floor
    assert (str(early.status), early.rule, early.noise_max_abs_diff is not None) == ("fail", "noise", True)
    late = by_candidate["late", "early"]
    assert (str(late.status), late.rule, late.noise_max_abs_diff) == ("fail", "tolerance", None)


def drifting_runs(root: Path) -> None:
    """`root`/ref, rerun and cand: the rerun differs from the reference by 1e-3 at one element of each tensor; the
    candidate by 3e-3 at every element from layer 2 on, within 4x the floor's max |diff|."""
    tmp_path = root
    values = torch.Generator().manual_seed(0)
    for run in ("ref", "rerun", "cand"):
        (tmp_path / run).mkdir()
    for layer in range(4):
        for stage in ("attn", "mlp"):
            tensor = torch.randn(8, 16, generator=values)
            torch.save(tensor, tmp_path / "ref" / f"{layer}_{stage}.pth")
            rerun = tensor.clone()
            rerun[0, 0] += 1e-3
            torch.save(rerun, tmp_path / "rerun" / f"{layer}_{stage}.pth")
            drift = 3e-3 * torch.sign(torch.randn(8, 16, generator=values)) if layer >= 2 else 0.0
            torch.save(tensor + drift, tmp_path / "cand" / f"{layer}_{stage}.pth")


def test_drift_within_the_noise_floor_names_no_culprit(tmp_path: Path) -> None:
    """`drifting_runs`: every pair passes by noise. The candidate's relative RMSE stands out against the floor's
    (one element's), but the drift is within the floor: no culprit, said in words."""
    drifting_runs(tmp_path)
    data = str(tmp_path / "data")
    runs = [str(tmp_path / r) for r in ("ref", "cand")]
    done = main_cli("--data-dir", data, "compare", *runs, "--noise", str(tmp_path / "rerun"), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert {(p["status"], p["rule"]) for p in out["pairs"]} == {("pass", "noise")}
    assert out["culprits"] == [], out["culprits"]
    assert out["culprit_note"].startswith("2_attn adds 0.00277 relative RMSE, which would stand out, but its output is")
    assert "within the noise floor" in out["culprit_note"]
    table = main_cli("--data-dir", data, "compare", *runs, "--noise", str(tmp_path / "rerun"))
    assert "stands out" not in table.stdout and "CULPRIT" not in table.stdout, table.stdout


def test_a_tensor_the_rerun_lacks_has_no_floor_and_the_one_before_it_passed_by_noise_not_tolerance(
    tmp_path: Path,
) -> None:
    """`drifting_runs` with the rerun lacking 2_mlp: that pair has no floor and fails by tolerance; 2_attn before it
    differs (3e-3, outside tolerance) but passed by noise, which the line naming it says."""
    drifting_runs(tmp_path)
    (tmp_path / "rerun" / "2_mlp.pth").unlink()
    runs = [str(tmp_path / r) for r in ("ref", "cand")]
    done = main_cli("--data-dir", str(tmp_path / "data"), "compare", *runs, "--noise", str(tmp_path / "rerun"))
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[6].split()[3:5] == ["FAIL", "0.003"], lines[6]  # 2_mlp: no floor column, no "(noise)"
    assert "FIRST DIVERGENCE: 2_mlp" in done.stdout
    assert "the first tensor whose values differ at all is 2_attn, within the noise floor there" in lines, lines


def test_the_page_says_the_first_changed_pair_passed_by_the_noise_floor(
    shared_server: LiveServer, tmp_path: Path
) -> None:
    """The same runs compared on the app's data dir: the session page's line under the first divergence says
    2_attn is within the noise floor there, not within tolerance."""
    drifting_runs(tmp_path)
    (tmp_path / "rerun" / "2_mlp.pth").unlink()
    runs = [str(tmp_path / r) for r in ("ref", "cand")]
    data = str(shared_server.data_dir)
    done = main_cli(
        "--data-dir", data, "compare", *runs, "--noise", str(tmp_path / "rerun"), "--name", "floor line", "--json"
    )
    assert done.returncode == 1, done.stderr
    session_id = json.loads(done.stdout)["session"]["id"]
    page = loopback_http.get(f"{shared_server.url}/sessions/{session_id}", headers=shared_server.auth).text
    line = page.split('<span class="first-changed">')[1].split("</span>")[0]
    assert line == "The first tensor whose values differ at all is 2_attn, within the noise floor there.", line
