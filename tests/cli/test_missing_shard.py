"""A tensor-parallel run that lacks one rank's shard of a tensor (the file never written) while it has that rank for
its other tensors: the pair is not compared (no alignment reads the lone shard as a replica), said why, and the
session is incomplete, not diverged on "rank 1's replica"."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.support.cli_main import main_cli
from tests.support.dumps import seeded


def test_a_missing_shard_is_not_read_as_a_replica(tmp_path: Path) -> None:
    ref, cand = tmp_path / "ref", tmp_path / "cand"
    ref.mkdir()
    cand.mkdir()
    for n, stage in enumerate(["query", "key"]):
        full = seeded((8, 4), n)
        for rank in range(2):
            torch.save(full.chunk(2)[rank].clone(), ref / f"0_{stage}_rank{rank}.pth")
            if (stage, rank) != ("query", 1):
                torch.save(full.chunk(2)[rank].clone(), cand / f"0_{stage}_rank{rank}.pth")
    done = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(ref), str(cand), "--json")
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    pairs = {p["name"]: p for p in out["pairs"]}
    assert pairs["0_key"]["status"] == "pass"
    query = pairs["0_query"]
    assert query["status"] == "incomparable" and query["replicas"] is None
    assert query["error"] == (
        "the candidate lacks the shard of rank 1 of 0_query (it holds rank 0 of the 2 the other run splits it "
        "across, and has rank 1 elsewhere)"
    )
    assert out["verdict"] == "incomplete" and out["first_divergence"] is None
    assert out["coverage"]["not_compared"] == ["0_query"]
    table = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(ref), str(cand)).stdout
    assert "FIRST DIVERGENCE" not in table and "replica" not in table
    assert "incomparable: the candidate lacks the shard of rank 1" in table
