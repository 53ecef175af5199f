"""Several candidates in one session: `compare REF C1 C2 C3`, in this process and handed to a running server, the
API's and the session page's side-by-side view."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
import torch

from tests.support import loopback_http
from tests.support.backends import BACKEND_FIXTURES, BACKENDS
from tests.support.cli_main import main_cli
from tests.support.dumps import layered_dump
from tests.support.servers import LiveServer, upload, wait_done

ON_VALUES: dict[str, object] = {
    "basis": None,
    "summary_reason": None,
    "candidate_only_before": [],
    "first_changed": None,
    "in_execution_order": True,
    "first_changed_on_summaries": False,
    "source_note": None,
    "crossed_before": [],
    "lowered_first": None,
    "candidate_early_before": [],
    "candidate_holds": None,
    "find_divergence_checks": [],
    "outputs_agree": False,
    "order_note": None,
    "paired_by": None,
    "candidate_name": None,
    "not_compared_before": [],
    "statistics_before": 0,
}  # judged on element values, not on summaries


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A reference and three candidates: one diverging at layer 2, one at layer 1, one not at all."""
    root = tmp_path_factory.mktemp("candidates")
    return {name: layered_dump(root / name, bug) for name, bug in (("ref", None), ("c1", 2), ("c2", 1), ("c3", None))}


def check_payload(out: dict[str, object]) -> None:
    pairs = out["pairs"]
    assert isinstance(pairs, list)
    assert [p["candidate"] for p in pairs] == ["c1"] * 8 + ["c2"] * 8 + ["c3"] * 8
    failing = {(p["candidate"], p["name"]) for p in pairs if p["status"] == "fail"}
    assert failing == {("c1", f"{k}_{s}") for k in (2, 3) for s in ("attn", "mlp")} | {
        ("c2", f"{k}_{s}") for k in (1, 2, 3) for s in ("attn", "mlp")
    }
    # the first candidate's; each tensor is off everywhere: no dimension confines it
    assert out["first_divergence"] == {
        "name": "2_attn",
        "layer": 2,
        "stage": "attn",
        "where": [],
        "unmatched_before": [],
        "basis": None,
        "summary_reason": None,
        "candidate_only_before": [],
        "first_changed": None,
        "in_execution_order": True,
        "first_changed_on_summaries": False,
        "source_note": None,
        "crossed_before": [],
        "lowered_first": None,
        "candidate_early_before": [],
        "candidate_holds": None,
        "find_divergence_checks": [],
        "outputs_agree": False,
        "order_note": None,
        "paired_by": None,
        "candidate_name": None,
        "not_compared_before": [],
        "statistics_before": 0,
    }
    assert out["first_divergences"] == {
        "c1": {"name": "2_attn", "layer": 2, "stage": "attn", "where": [], "unmatched_before": [], **ON_VALUES},
        "c2": {"name": "1_attn", "layer": 1, "stage": "attn", "where": [], "unmatched_before": [], **ON_VALUES},
        "c3": None,
    }


@pytest.mark.parametrize(BACKEND_FIXTURES, BACKENDS, indirect=True)
def test_compare_three_candidates_in_this_process(
    runs: dict[str, Path], tmp_path: Path, backend_env: dict[str, str]
) -> None:
    data = str(tmp_path / "data")
    runs_given = (str(runs[k]) for k in ("ref", "c1", "c2", "c3"))
    done = main_cli("--data-dir", data, "compare", *runs_given, "--json", env=backend_env)
    assert done.returncode == 1, done.stderr
    check_payload(json.loads(done.stdout))


def test_candidates_through_a_running_server_and_its_pages(shared_server: LiveServer, runs: dict[str, Path]) -> None:
    data = str(shared_server.data_dir)
    warm = main_cli(
        "--data-dir", data, "compare", *(str(runs[k]) for k in ("ref", "c1", "c2", "c3")), "--name", "3 cand", "--json"
    )
    assert warm.returncode == 1, warm.stderr
    out = json.loads(warm.stdout)
    check_payload(out)
    session_id = out["session"]["id"]
    page = loopback_http.get(f"{shared_server.url}/sessions/{session_id}", headers=shared_server.auth, timeout=30)
    assert page.status_code == 200
    section = page.text.split('aria-label="Candidates"')[1].split("</section>")[0]
    assert re.findall(r"<th>(c\d)</th>", section) == ["c1", "c2", "c3"]
    assert len(re.findall(r'<path class="line candidate series-\d"', section)) == 3  # a series per candidate
    row = re.search(r"<td>1_attn</td>(.*?)</tr>", section, re.S)
    assert row is not None
    assert re.findall(r'badge (\w+)">', row.group(1)) == ["pass", "fail", "pass"]
    assert "first divergence at <strong>1_attn</strong>" in section and "no divergence" in section
    exported = loopback_http.get(
        f"{shared_server.url}/sessions/{session_id}/pairs.csv", headers=shared_server.auth
    ).text
    rows = list(csv.DictReader(io.StringIO(exported)))
    assert [r["candidate_run"] for r in rows] == ["c1"] * 8 + ["c2"] * 8 + ["c3"] * 8
    assert {(r["candidate_run"], r["name"]) for r in rows if r["status"] == "fail"} == {
        (p["candidate"], p["name"]) for p in out["pairs"] if p["status"] == "fail"
    }

    # the table: a column per candidate; exit 1 when any candidate diverges, not only the first
    table = main_cli("--data-dir", data, "compare", str(runs["ref"]), str(runs["c3"]), str(runs["c2"]))
    assert table.returncode == 1, table.stderr
    lines = table.stdout.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == ["#", "layer", "tensor", "c3 (max |diff|)", "c2 (max |diff|)"]
    assert re.split(r"\s{2,}", lines[3]) == ["2", "1", "1_attn", "PASS 0", "FAIL 0.5"]
    assert (
        "c3: no divergence: 8 of 8 pairs pass" in lines
        and "c2: FIRST DIVERGENCE: 1_attn (layer 1); everywhere (no dimension confines it)" in lines
    )
    clean = main_cli("--data-dir", data, "compare", str(runs["ref"]), str(runs["c3"]), str(runs["ref"]), "--json")
    assert clean.returncode == 0, clean.stdout
    assert list(json.loads(clean.stdout)["first_divergences"]) == ["c3", "ref (candidate 2)"]


def test_upload_of_three_runs_pairs_each_candidate(shared_server: LiveServer, runs: dict[str, Path]) -> None:
    files = [(name, path) for name in ("ref", "c1", "c2") for path in sorted(runs[name].iterdir())]
    created = upload(shared_server, "three runs by upload", files)
    assert created.status_code in (201, 202), created.text
    session_id = created.json()["session"]["id"]
    report = wait_done(shared_server, session_id)
    assert [c["label"] for c in report["candidates"]] == ["c1", "c2"]
    assert [c["first_divergence"]["name"] for c in report["candidates"]] == ["2_attn", "1_attn"]
    assert report["first_divergence"]["name"] == "2_attn"


def test_a_candidate_that_compared_less_does_not_borrow_anothers_no_divergence(tmp_path: Path) -> None:
    """`compare ref c1 c2`: c1 compares all 8 tensors, c2 lacks one file and has another unreadable. c2's line
    says it passed among the pairs it compared, 6 of the reference's 8, as `compare ref c2` alone says."""
    ref = layered_dump(tmp_path / "ref", None)
    c1 = layered_dump(tmp_path / "c1", None)
    c2 = layered_dump(tmp_path / "c2", None)
    (c2 / "3_mlp.pth").unlink()
    (c2 / "2_mlp.pth").write_bytes(b"garbage")
    done = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(ref), str(c1), str(c2))
    assert done.returncode == 2, done.stderr
    lines = done.stdout.splitlines()
    assert "c1: no divergence: 8 of 8 pairs pass" in lines, done.stdout
    assert "c2: no divergence among the pairs compared: 6 of 6 pairs pass, 6 of 8 reference tensors compared" in lines


def test_a_candidate_that_compared_nothing_is_no_divergence_nowhere(
    shared_server: LiveServer, runs: dict[str, Path], tmp_path: Path
) -> None:
    """`compare ref c1 c9`, c9's tensors all of another shape (every pair incomparable): the CLI said "c9: nothing
    was compared: 0 of 8 pairs compared" and the page's side-by-side list "c9: no divergence". The page says what the
    CLI says."""
    other = tmp_path / "c9"
    other.mkdir()
    for layer in range(4):
        for stage in ("attn", "mlp"):
            torch.save(
                torch.randn(5, 3, generator=torch.Generator().manual_seed(layer)), other / f"{layer}_{stage}.pth"
            )
    data = str(shared_server.data_dir)
    given = (str(runs["ref"]), str(runs["c3"]), str(other))
    done = main_cli("--data-dir", data, "compare", *given, "--name", "nothing compared")
    assert "c9: nothing was compared: 0 of 8 pairs compared" in done.stdout.splitlines(), done.stdout
    found = re.search(r"/sessions/(\d+)", done.stdout)
    assert found is not None, done.stdout
    session_id = int(found.group(1))
    page = loopback_http.get(f"{shared_server.url}/sessions/{session_id}", headers=shared_server.auth, timeout=30)
    section = page.text.split('aria-label="Candidates"')[1].split("</section>")[0]
    item = re.search(r"c9</span>: (.*?)</li>", section, re.S)
    assert item is not None, section
    assert "nothing was compared: 0 of 8 pairs compared" in item.group(1), item.group(1)
    assert "no divergence" not in item.group(1)
    assert 'c3</span>: <span class="candidate-verdict">no divergence: 8 of 8 pairs pass</span>' in section, section
