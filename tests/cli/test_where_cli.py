"""Where inside a failing pair its error is: `compare --json`'s `where`, the FIRST DIVERGENCE line, `--dims` naming
dimensions, from bugs planted in torch-saved `.pth` files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.cli_main import main_cli

HEAD_BUG = [
    {"dim": 1, "name": "heads", "size": 16, "ranges": [[5, 5]]},
    {"dim": 2, "name": "tokens", "size": 64, "ranges": [[10, 12]]},
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A reference and a candidate: layer 1's attention equal; layer 2's off in head 5 at tokens 10 to 12; layer
    3's MLP off everywhere; layer 4's output (1-D) off at 100-109 and 700."""
    root = tmp_path_factory.mktemp("where")
    ref, cand = root / "ref", root / "cand"
    ref.mkdir()
    cand.mkdir()
    values = torch.Generator().manual_seed(0)
    tensors = {
        "1_attn": torch.randn(1, 16, 64, 32, generator=values),
        "2_attn": torch.randn(1, 16, 64, 32, generator=values),
        "3_mlp": torch.randn(64, 128, generator=values),
        "4_out": torch.randn(1000, generator=values),
    }
    changed = {name: t.clone() for name, t in tensors.items()}
    changed["2_attn"][0, 5, 10:13, :] += 0.5
    changed["3_mlp"] += 0.01 * torch.randn(64, 128, generator=values)
    changed["4_out"][100:110] += 1.0
    changed["4_out"][700] -= 2.0
    for name in tensors:
        torch.save(tensors[name], ref / f"{name}.pth")
        torch.save(changed[name], cand / f"{name}.pth")
    return ref, cand


def test_where_in_json_and_the_first_divergence_line(runs: tuple[Path, Path], tmp_path: Path) -> None:
    ref, cand = runs
    data = str(tmp_path / "data")
    dims = ("--dims", "*attn*=batch,heads,tokens,head_dim", "--dims", "*mlp*=one,two,three")
    done = main_cli("--data-dir", data, "compare", str(ref), str(cand), *dims, "--json", "--in-process")
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    where = {p["name"]: p["where"] for p in out["pairs"]}
    assert where == {
        "1_attn": None,  # passes
        "2_attn": HEAD_BUG,
        "3_mlp": [],  # everywhere (its glob gives 3 names for 2 dimensions: none apply)
        "4_out": [{"dim": 0, "name": None, "size": 1000, "ranges": [[100, 109], [700, 700]]}],
    }
    assert out["first_divergence"] == {
        "name": "2_attn",
        "layer": 2,
        "stage": "attn",
        "where": HEAD_BUG,
        "unmatched_before": [],
        "basis": None,
        "summary_reason": None,
        "candidate_only_before": [],
        "first_changed": None,
        "in_execution_order": True,
        "first_changed_on_summaries": False,
        "source_note": None,
        "crossed_before": [],  # a dump's: no ops, no capture's order
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

    # the same session's table, from the cache, in this process
    table = main_cli("--data-dir", data, "compare", str(ref), str(cand), *dims, "--in-process")
    line = next(x for x in table.stdout.splitlines() if x.startswith("FIRST DIVERGENCE"))
    assert line.endswith("elements outside tolerance; in heads 5, tokens 10-12"), line


def test_unnamed_dimensions_and_a_bad_dims_option(runs: tuple[Path, Path], tmp_path: Path) -> None:
    ref, cand = runs
    data = str(tmp_path / "data")
    done = main_cli("--data-dir", data, "compare", str(ref), str(cand), "--in-process")
    line = next(x for x in done.stdout.splitlines() if x.startswith("FIRST DIVERGENCE"))
    assert line.endswith("; in dim 1 [5], dim 2 [10-12]"), line

    bad = main_cli("--data-dir", data, "compare", str(ref), str(cand), "--dims", "*attn*", "--in-process")
    assert bad.returncode == 2 and "--dims takes GLOB=NAMES" in bad.stderr, bad.stderr
    twice = main_cli("--data-dir", data, "compare", str(ref), str(cand), "--dims", "*=a,a", "--in-process")
    assert twice.returncode == 2 and "names a dimension twice" in twice.stderr, twice.stderr
