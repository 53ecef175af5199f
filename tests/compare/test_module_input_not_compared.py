"""A module one of whose inputs was not compared (another shape in the candidate: incomparable) is no culprit, however
much error its output carries beyond its compared inputs': what it was given is not known. Nor is the error said to
grow evenly (as a change of precision makes it). Captured with `capture` (the Python API) and compared as
`compare --json` reports it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tensor_debugger import capture
from tensor_debugger.compare.reports.compare_report import to_json
from tensor_debugger.compare.reports.contract import compare_report
from tensor_debugger.settings import Settings

from tests.support.sessions import compared as compared_session


class Mix(torch.nn.Module):
    def forward(self, hidden: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        return hidden + extra.mean()


class Net(torch.nn.Module):
    def __init__(self, projections: int) -> None:
        super().__init__()
        self.projections = torch.nn.Sequential(*(torch.nn.Linear(16, 16) for _ in range(projections)))
        self.mix = Mix()
        self.out = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        return self.out(self.mix(self.projections(x), extra))  # type: ignore[no-any-return]


def compared(data_dir: Path, projections: int) -> dict[str, Any]:
    """The reference given `extra` of shape [4, 8], all 0; the candidate one of [4, 9], all 3: `mix`'s second input
    is incomparable, and its output is 3 off."""
    torch.manual_seed(0)
    net = Net(projections).eval()
    x = torch.randn(4, 16)
    for run, extra in (("reference", torch.zeros(4, 8)), ("candidate", torch.full((4, 9), 3.0))):
        with torch.no_grad(), capture(net, session="s", run=run, data_dir=data_dir) as result:
            net(x, extra)
    assert result.session_id is not None
    report = compared_session(Settings(data_dir=data_dir), result.session_id, modules=True)
    return to_json(compare_report(result.session_id, "s", "", report, []))


@pytest.mark.parametrize("projections", [2, 4])
def test_a_module_whose_input_was_not_compared_is_no_culprit(tmp_path: Path, projections: int) -> None:
    out = compared(tmp_path / "data", projections)
    statuses = {p["name"]: p["status"] for p in out["pairs"]}
    assert statuses["Net.mix_inputs_args_0"] == "pass" and statuses["Net.mix_inputs_args_1"] == "incomparable"
    assert out["first_divergence"]["name"] == "Net.mix_outputs"
    assert out["culprits"] == []
    assert out["culprit_note"] == (
        "`Net.mix` carries more error out than its compared inputs bring, but its input inputs_args_1 (incomparable) "
        "was not compared: whether it introduced the error is not known"
    )
