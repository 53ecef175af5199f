"""`tensor-debugger explore`: every tensor of one run against every other, in compare's JSON."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.support.cli_main import main_cli
from tests.support.dumps import seeded
from tests.support.servers import LiveServer


def test_explore_pairs_every_tensor_with_every_other(tmp_path: Path) -> None:
    same = seeded((4, 6), 1)
    torch.save(
        {"q": same, "k": same.clone(), "v": seeded((4, 6), 2), "o": seeded((6, 4), 3), "bias": seeded((5,), 4)},
        tmp_path / "acts.pth",
    )
    data = str(tmp_path / "data")
    done = main_cli("--data-dir", data, "explore", str(tmp_path / "acts.pth"), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert len(out["pairs"]) == 10 and out["unmatched"] == {"a": [], "b": []}
    assert set(out) >= {"session", "pairs", "unmatched", "first_divergence", "culprits", "problems"}
    verdicts = {(p["a"]["name"], p["b"]["name"]): p["status"] for p in out["pairs"]}
    assert verdicts[("acts.q", "acts.k")] == "pass"
    assert verdicts[("acts.q", "acts.v")] == "fail"
    assert verdicts[("acts.q", "acts.bias")] == "incomparable"
    assert all(p["strategy"] == "explore" for p in out["pairs"])
    matched = json.loads(
        main_cli("--data-dir", data, "explore", str(tmp_path / "acts.pth"), "--match", "*.[qk]", "--json").stdout
    )
    assert [(p["a"]["name"], p["b"]["name"]) for p in matched["pairs"]] == [("acts.q", "acts.k")]
    human = main_cli("--data-dir", data, "explore", str(tmp_path / "acts.pth"))
    assert human.returncode == 0 and "10 pairs: 1 equal within tolerance" in human.stdout


def test_explore_asks_for_a_filter_past_5000_pairs(tmp_path: Path) -> None:
    torch.save({f"t{i}": torch.full((2,), float(i)) for i in range(101)}, tmp_path / "many.pth")  # 5050 pairs
    data = str(tmp_path / "data")
    done = main_cli("--data-dir", data, "explore", str(tmp_path / "many.pth"), "--json")
    assert done.returncode == 2
    error = json.loads(done.stdout)["error"]
    assert "101 tensors make 5,050 pairs, over 5,000: choose fewer with --match GLOB" in error
    assert json.loads(main_cli("--data-dir", data, "sessions", "--json").stdout) == []
    done = main_cli("--data-dir", data, "explore", str(tmp_path / "many.pth"), "--match", "*t1?", "--json")
    assert done.returncode == 0 and len(json.loads(done.stdout)["pairs"]) == 45


def test_explore_of_a_run_with_a_file_that_cannot_be_read_is_incomplete(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"q": seeded((4, 6), 1), "k": seeded((4, 6), 1)}, run / "acts.pth")
    (run / "more.pth").write_bytes(b"PK\x03\x04 cut short")
    (run / "notes.txt").write_text("no tensor here")
    done = main_cli("--data-dir", str(tmp_path / "data"), "explore", str(run))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "INCOMPLETE: 1 input file could not be read" in done.stdout
    assert "ignored, no tensor in them (1):" in done.stdout and "problem:" in done.stdout


def test_explore_counts_the_tensors_compared_in_any_pair(tmp_path: Path) -> None:
    """Three tensors, of which two can be compared (one pass) and the third fits neither: the run's three tensors,
    two of them compared. `compared` counted a tensor only where every pair of it was compared, and only on the
    pairs' first side, so one incomparable pair left it 0: the page said "nothing was compared"."""
    same = seeded((4, 6), 1)
    torch.save({"q": same, "k": same.clone(), "bias": seeded((5,), 4)}, tmp_path / "acts.pth")
    done = main_cli("--data-dir", str(tmp_path / "data"), "explore", str(tmp_path / "acts.pth"), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    verdicts = sorted(p["status"] for p in out["pairs"])
    assert verdicts == ["incomparable", "incomparable", "pass"], verdicts
    coverage = out["coverage"]
    assert (coverage["reference_tensors"], coverage["compared"]) == (3, 2), coverage


def test_explore_beside_a_server_links_to_its_port(shared_server: LiveServer, tmp_path: Path) -> None:
    """`explore` runs in this process beside a server of the data dir on a port of its own: its link (the table's
    last line and the JSON's `url`) is to that server, not a hint to start one on 8000."""
    torch.save({"q": seeded((4, 6), 1), "k": seeded((4, 6), 2)}, tmp_path / "acts.pth")
    data = str(shared_server.data_dir)
    done = main_cli("--data-dir", data, "explore", str(tmp_path / "acts.pth"), "--name", f"explore {tmp_path.name}")
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith(f"open in the browser: {shared_server.url}/sessions/"), last
    assert ":8000" not in done.stdout and "serve" not in last
    # the shared server's sessions are every test's: each of this test's named its own (no "explore acts.pth")
    named = ("--name", f"explore json {tmp_path.name}")
    out = json.loads(main_cli("--data-dir", data, "explore", str(tmp_path / "acts.pth"), *named, "--json").stdout)
    assert out["session"]["url"] == f"{shared_server.url}/sessions/{out['session']['id']}"
