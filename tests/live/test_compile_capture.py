"""`capture` of a model run through torch.compile (the aot_eager backend: no C++ compile): its modules' hooks still
record their values, and an op capture says on the run that the compiled model's ops were not seen, rather than
recording nothing (or the compiled graph's aten ops under the model's names) without a word."""

from __future__ import annotations

from typing import cast

import pytest
import torch
from litestar.testing import TestClient
from sqlalchemy import select
from tensor_debugger import capture
from tensor_debugger.cli.compare_output import print_problems
from tensor_debugger.live.capture_types import Level
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import ProblemRecord, TensorRecord
from tensor_debugger.store.problem_report import ProblemReport
from tensor_debugger.web.app import create_app
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = nn.Linear(4, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.softmax(self.down(torch.relu(self.up(x))), dim=-1)
        return out


def captured(settings: Settings, model: nn.Module, run: str, level: Level) -> tuple[dict[str, str], list[str]]:
    """The run's tensors (name -> digest) and its problems' reasons."""
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), capture(model, session="compiled", run=run, data_dir=settings.data_dir, level=level) as r:
        model(x)
    services = open_services(settings)
    try:
        with services.sessions() as db:
            query = select(TensorRecord).where(TensorRecord.run_id == r.run_id).order_by(TensorRecord.position)
            tensors = {t.name: t.digest for t in db.scalars(query)}
            problems = list(db.scalars(select(ProblemRecord).where(ProblemRecord.run_id == r.run_id)))
            # notes about the run: nothing is missing from its files, and no file held "no tensor"
            assert all(p.ignored and p.note for p in problems)
            return tensors, [p.reason for p in problems]
    finally:
        services.close()


def test_a_compiled_model_keeps_its_module_values_and_says_its_ops_were_not_seen(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    model = Net()
    plain_modules, plain_notes = captured(settings, model, "plain", "module")
    plain_ops, _ = captured(settings, model, "plain ops", "op")
    compiled = cast(nn.Module, torch.compile(model, backend="aot_eager"))

    modules, notes = captured(settings, compiled, "compiled", "module")
    assert modules == plain_modules and notes == plain_notes == []  # the same names, the same bytes, no note
    assert "Net.up_outputs" in modules  # named by the model, not by torch.compile's wrapper

    ops, notes = captured(settings, compiled, "compiled ops", "op")
    print_problems([ProblemReport("compiled ops/Net_debug_tree_FULL_TENSORS.json", notes[0], True, note=True)])
    assert capsys.readouterr().out.startswith("note: compiled ops/Net_debug_tree_FULL_TENSORS.json: Net ran compiled")
    assert notes == [
        "Net ran compiled (torch.compile): its ops are not visible to op capture (its modules' inputs and outputs"
        " are recorded; capture the model uncompiled to see its ops)"
    ]
    assert ops == plain_modules  # every module's values, and no op under a name it would not pair by
    assert {n for n in plain_ops if "/" in n} == {
        "Net.up/linear#1_outputs",
        "Net/relu#1_outputs",
        "Net.down/linear#1_outputs",
        "Net/softmax#1_outputs",
    }  # what the uncompiled model shows
    # the session page counts it as a note on the run, not as a file ignored for holding no tensor
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        session = client.get("/api/sessions").json()[0]["id"]
        page = client.get(f"/sessions/{session}").text
    runs = page[page.index("<h2>Runs</h2>") :]
    assert "1 note on the run" in runs and "ignored (no tensor" not in runs
    assert "Note on <strong>compiled ops/Net_debug_tree_FULL_TENSORS.json</strong>: Net ran compiled" in runs


def test_a_submodule_compiled_in_place_is_named_and_the_rest_keeps_its_ops(settings: Settings) -> None:
    model = Net()
    model.down.compile(backend="aot_eager")
    ops, notes = captured(settings, model, "part compiled", "op")
    assert notes == [
        "Net.down ran compiled (torch.compile): its ops are not visible to op capture (its modules' inputs and"
        " outputs are recorded; capture the model uncompiled to see its ops)"
    ]
    assert "Net.up/linear#1_outputs" in ops and "Net/relu#1_outputs" in ops  # outside the compiled module: seen
    assert "Net.down_outputs" in ops and not any(n.startswith("Net.down/") for n in ops)
