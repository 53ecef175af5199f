"""Where no execution order is known (a safetensors state dict: its keys, not what ran first), the failing pair
found is not called the first divergence, in `compare`'s table and JSON and `compare-sessions`; nor are its keys
ranked as stages that add error."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.support import loopback_http
from tests.support.cli_main import main_cli
from tests.support.dumps import seeded
from tests.support.servers import LiveServer, upload, wait_done


def state_dicts(root: Path) -> tuple[Path, Path]:
    weights = {f"layers.{n}.proj": seeded((8, 8), n) for n in range(4)}
    changed = dict(weights)
    for n in (0, 2):  # keys sort before the others: which changed first in a run is not in a state dict
        changed[f"layers.{n}.proj"] = weights[f"layers.{n}.proj"] + 1
    for folder, tensors in (("a", weights), ("b", changed)):
        (root / folder).mkdir()
        save_file({k: v.contiguous() for k, v in tensors.items()}, root / folder / "model.safetensors")
    return root / "a", root / "b"


def test_a_state_dict_has_no_first_divergence(tmp_path: Path) -> None:
    a, b = state_dicts(tmp_path)
    data = str(tmp_path / "data")
    done = main_cli("--data-dir", data, "compare", str(a), str(b), "--json")
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    assert out["verdict"] == "diverged"
    first = out["first_divergence"]
    assert first["name"] == "layers.0.proj" and first["in_execution_order"] is False
    assert first["unmatched_before"] == [] and first["first_changed"] is None
    assert out["culprits"] == [] and out["error_growth"] is None and out["culprit_note"] is None
    table = main_cli("--data-dir", data, "compare", str(a), str(b)).stdout
    assert "FIRST DIVERGENCE" not in table and "grows evenly" not in table
    assert "DIVERGENCE (no execution order is known, as in a state dict: the first failing pair listed" in table
    sessions = main_cli("--data-dir", data, "compare-sessions", "1", "2").stdout
    assert "first divergence" not in sessions and "a divergence layers.0.proj (no execution order is known" in sessions


def test_dumps_with_stages_keep_their_first_divergence(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for n, name in enumerate(["0_query", "0_key", "1_query"]):
        torch.save(seeded((4, 4), n), tmp_path / "a" / f"{name}.pth")
        torch.save(seeded((4, 4), n) + (name != "0_query"), tmp_path / "b" / f"{name}.pth")
    done = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    first = json.loads(done.stdout)["first_divergence"]
    assert first["name"] == "0_key" and first["in_execution_order"] is True


def test_the_session_page_and_api_say_a_divergence_not_the_first(shared_server: LiveServer, tmp_path: Path) -> None:
    a, b = state_dicts(tmp_path)
    files = [("reference", a / "model.safetensors"), ("candidate", b / "model.safetensors")]
    response = upload(shared_server, "state dicts", files)
    assert response.status_code == 201, response.text
    session_id = int(response.json()["session"]["id"])
    wait_done(shared_server, session_id)
    page = loopback_http.get(f"{shared_server.url}/sessions/{session_id}").text
    banner = page[page.index('class="banner fail"') :]
    banner = banner[: banner.index("</p>")]
    assert "First divergence" not in banner and 'id="order-unknown"' in banner
    assert "the first failing pair listed, not the first to fail" in banner
    api = loopback_http.get(
        f"{shared_server.url}/api/sessions/{session_id}/first-divergence", headers=shared_server.auth
    )
    assert api.json()["first_divergence"]["in_execution_order"] is False


def test_the_candidates_list_says_a_divergence(shared_server: LiveServer, tmp_path: Path) -> None:
    a, b = state_dicts(tmp_path)
    data = str(shared_server.data_dir)
    done = main_cli("--data-dir", data, "compare", str(a), str(b), str(b), "--name", "two state dicts", "--json")
    assert done.returncode == 1, done.stderr
    session_id = json.loads(done.stdout)["session"]["id"]
    page = loopback_http.get(f"{shared_server.url}/sessions/{session_id}", headers=shared_server.auth, timeout=30)
    section = page.text.split('aria-label="Candidates"')[1].split("</section>")[0]
    assert "first divergence at" not in section
    assert (
        "a divergence (no execution order is known: the first failing pair listed) at <strong>layers.0.proj" in section
    )


def test_the_sessions_compare_page_says_no_order_is_known(shared_server: LiveServer, tmp_path: Path) -> None:
    a, b = state_dicts(tmp_path)
    data = str(shared_server.data_dir)
    ids = [
        json.loads(main_cli("--data-dir", data, "compare", str(a), str(b), "--name", name, "--json").stdout)["session"][
            "id"
        ]
        for name in ("dicts before", "dicts after")
    ]
    page = loopback_http.get(
        f"{shared_server.url}/sessions/compare?a={ids[0]}&b={ids[1]}", headers=shared_server.auth, timeout=30
    ).text
    line = page[page.index("<p>First divergence: A") :]
    line = line[: line.index("</p>")]
    assert line.count("(no execution order is known: the first failing pair listed, not the first to fail)") == 2


def test_two_failing_tensors_of_one_layer_and_stage_are_a_tie(tmp_path: Path) -> None:
    """`x/0_query` and `y/0_query` (two folders of each run: two ranks' or micro-batches' dumps) both fail: which ran
    first is not known, so neither is called first."""
    for side in ("a", "b"):
        for folder, scale in (("x", 1), ("y", 2)):
            (tmp_path / side / folder).mkdir(parents=True)
            torch.save(seeded((4, 4), scale) + (side == "b"), tmp_path / side / folder / "0_query.pth")
    done = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    first = json.loads(done.stdout)["first_divergence"]
    assert first["name"] == "x/0_query" and first["in_execution_order"] is False


def test_fail_fast_on_a_state_dict_does_not_say_it_stopped_at_the_first_divergence(tmp_path: Path) -> None:
    """`--fail-fast` stops at a failing key of a state dict: the keys left pending are not "after" it, and any of them
    may fail too."""
    weights = {f"layers.{n}.proj": seeded((64, 64), n) for n in range(30)}
    changed = {**weights, "layers.0.proj": weights["layers.0.proj"] + 1}
    for folder, tensors in (("a", weights), ("b", changed)):
        (tmp_path / folder).mkdir()
        save_file(tensors, tmp_path / folder / "model.safetensors")
    done = main_cli(
        "--data-dir", str(tmp_path / "data"), "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--fail-fast"
    )
    assert done.returncode == 1, done.stderr
    pending = done.stdout.count(" PENDING")
    assert pending > 0, done.stdout  # the early comparisons stopped at layers.0.proj: the rest left to compare
    assert "first divergence" not in done.stdout.lower()
    assert (
        f"stopped at a divergence (--fail-fast), not the first: no execution order is known; {pending} pairs not "
        f"compared, any of them may fail too" in done.stdout
    )
