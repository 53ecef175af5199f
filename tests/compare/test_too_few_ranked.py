"""With one or two stages or modules ranked, the median of their added errors is at least half the largest, so none
can stand out from it: the run is not said to grow evenly. One whose compared inputs are bit-identical and whose
output fails is named by its own doing; otherwise "too few ... to rank" is said. Before, a two-stage dump whose
first stage matched bit for bit and whose second failed printed "The error grows evenly through the run", and a
capture of one module (inputs identical, output wrong) named no culprit and said nothing (failed on the parent
commit)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from tensor_debugger import capture
from tensor_debugger.compare.reports.compare_report import to_json
from tensor_debugger.compare.reports.contract import compare_report
from tensor_debugger.engine.culprits import stands_out
from tensor_debugger.settings import Settings
from torch import nn

from tests.support.cli_main import main_cli
from tests.support.sessions import compared


def two_stages(root: Path, query_error: float) -> tuple[Path, Path]:
    """0_query then 0_key: the candidate's query off by `query_error` (relative), its key's row 2 scaled 1.5x."""
    torch.manual_seed(0)
    q, k = torch.randn(4, 8), torch.randn(4, 8)
    ref, cand = root / "ref", root / "cand"
    ref.mkdir()
    cand.mkdir()
    torch.save(q, ref / "0_query.pth")
    torch.save(k, ref / "0_key.pth")
    torch.save(q * (1 + query_error), cand / "0_query.pth")
    k2 = k.clone()
    k2[2] *= 1.5
    torch.save(k2, cand / "0_key.pth")
    return ref, cand


def test_the_rule_names_a_stage_given_identical_inputs_only_with_few_ranked() -> None:
    assert stands_out([0.0, 0.14], [0.0, 0.0]) == [False, False]  # the median is 0.07: nothing beyond 7 times it
    assert stands_out([0.0, 0.14], [0.0, 0.0], own=[False, True]) == [False, True]
    # with three or more, the median rule alone: a rounding stage given token ids is not named for it
    assert stands_out([0.004, 0.003, 0.005], [0.0, 0.004, 0.007], own=[True, False, False]) == [False] * 3
    # a known noise floor still rules
    assert stands_out([0.01], [0.0], [0.01], factor=4, own=[True]) == [False]


def test_a_stage_after_a_bit_identical_one_is_named_by_its_own_doing(tmp_path: Path) -> None:
    ref, cand = two_stages(tmp_path, 0.0)
    data = str(tmp_path / "data")
    done = main_cli("--data-dir", data, "compare", str(ref), str(cand), "--json")
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    assert [c["name"] for c in out["culprits"]] == ["0_key"] and out["culprits"][0]["input_error"] == 0
    assert out["error_growth"] == "stands out"
    assert "0_key is named by its own doing: the tensor before it, 0_query, was identical" in out["culprit_note"]
    table = main_cli("--data-dir", data, "compare", str(ref), str(cand)).stdout
    assert "CULPRIT: 0_key" in table and "grows evenly" not in table


def test_two_stages_that_both_add_error_are_too_few_to_rank(tmp_path: Path) -> None:
    ref, cand = two_stages(tmp_path, 0.3)  # the query already off: 0_key was not given identical values
    done = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(ref), str(cand), "--json")
    out = json.loads(done.stdout)
    assert out["culprits"] == [] and out["error_growth"] == "too few", out
    assert "grows evenly" not in done.stdout
    assert "too few stages to rank (fewer than 3)" in out["culprit_note"]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_captured_module_given_identical_inputs_is_named(settings: Settings) -> None:
    torch.manual_seed(0)
    ref, x = Net().eval(), torch.randn(2, 8)
    cand = copy.deepcopy(ref)
    block = cand.layers[1]
    assert isinstance(block, Block)
    block.lin.weight.data[3] *= 1.5
    for model, run in ((ref, "reference"), (cand, "candidate")):
        with (
            torch.no_grad(),
            capture(model, session="one", run=run, modules="layers.1", data_dir=settings.data_dir) as result,
        ):
            model(x)
    assert result.session_id is not None
    report = compared(settings, result.session_id, modules=True)
    out: dict[str, Any] = to_json(compare_report(result.session_id, "one", "", report, []))
    assert [c["module_path"] for c in out["culprits"]] == ["Net.layers.1"], out["culprits"]
    assert out["culprits"][0]["input_error"] == 0
    assert out["error_growth"] == "stands out"
    assert "`Net.layers.1` is named by its own doing: its inputs were identical" in (out["culprit_note"] or "")
