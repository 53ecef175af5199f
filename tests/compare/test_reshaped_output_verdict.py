"""A module's output of another shape on each side, its inputs compared and passing, the module called as often on
each side (a convolution given another stride), is the session's first divergence (compare/reports/reshaped.py):
the session's verdict says the same, "diverged", in the API's report, `compare --json`, the CLI's lines and the
session page, where it read "incomplete" ("no pair is outside tolerance, but not everything was compared") beside
a named first divergence. And the check that one side calls the module more often (its calls then face none of
the other's: no divergence) reads each side's own module paths: a module whose name holds `_outputs_` was cut
short there, and a port whose paths differ from the reference's was never seen as split."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

import httpx
import torch
from sqlalchemy import select
from tensor_debugger import capture
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import SessionRecord
from torch import nn

from tests.support.cli_main import main_cli
from tests.support.servers import LiveServer, session_judged
from tests.support.sessions import compared

C, T = 4, 8


class Convs(nn.Module):
    """Two convolutions; the port's first given stride 2 (a shorter sequence)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv1d(C, C, 3, stride=2 if port else 1, padding=1)
        self.conv2 = nn.Conv1d(C, C, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.conv2(self.conv1(x)))


def _features() -> torch.Tensor:
    return torch.randn(2, C, T, generator=torch.Generator().manual_seed(1))


def _captured(settings: Settings, session: str) -> None:
    for run, port in (("reference", False), ("candidate", True)):
        model = Convs(port).eval()
        with torch.no_grad(), capture(model, session, run, data_dir=settings.data_dir):
            model(_features())


def test_the_session_of_a_reshaped_output_says_diverged(settings: Settings) -> None:
    _captured(settings, "strides")
    report = compared(settings, "strides")
    first = report.first_divergence
    assert first is not None and first.name == "Convs.conv1_outputs", first
    assert first.shapes == [[2, C, T], [2, C, T // 2]], first
    assert report.verdict == "diverged", report.verdict


def test_compare_json_and_lines_say_one_thing(tmp_path: Path) -> None:
    """`compare` of two Hugging Face module traces: the JSON's verdict is "diverged" beside its first divergence, and
    the lines name the divergence with its shapes once, not also as a pair that "could not be compared"."""
    from transformers.model_debugging_utils import model_addition_debugger_context

    runs = []
    for run, port in (("reference", False), ("candidate", True)):
        model = Convs(port).eval()
        folder = tmp_path / run
        with torch.no_grad(), model_addition_debugger_context(model, debug_path=str(folder), do_prune_layers=False):
            model(_features())
        runs.append(str(folder))
    data = str(tmp_path / "data")
    done = main_cli("--data-dir", data, "compare", *runs, "--json")
    answer = json.loads(done.stdout)
    assert answer["verdict"] == "diverged", answer["verdict"]
    assert answer["first_divergence"]["name"] == "Convs.conv1_outputs", answer["first_divergence"]
    lines = main_cli("--data-dir", data, "compare", *runs, "--name", "lines").stdout
    assert "FIRST DIVERGENCE: Convs.conv1_outputs" in lines and "shapes differ" in lines, lines
    assert "the session's verdict: diverged" in lines, lines
    assert not re.search(r"NOT COMPARED: .*Convs\.conv1_outputs", lines), lines
    assert "no divergence" not in lines, lines


def test_the_session_page_and_the_api_say_one_thing(shared_server: LiveServer) -> None:
    session = None
    for run, port in (("reference", False), ("candidate", True)):
        model = Convs(port).eval()
        with torch.no_grad(), capture(model, "strides page", run, server=shared_server.url) as result:
            model(_features())
        session = result.session_id
    assert session is not None
    with httpx.Client(base_url=shared_server.url, timeout=30) as client:
        report = session_judged(client, session)
        page = client.get(f"/sessions/{session}").text
    assert report["verdict"] == "diverged" and report["first_divergence"]["name"] == "Convs.conv1_outputs", report
    assert "Incomplete: no pair is outside tolerance" not in page, page
    assert 'data-verdict="diverged"' in page and "shapes differ" in page, page
    assert '<span class="reshaped-why" id="reshaped-why">its inputs were compared and agree' in page, page


class Rows(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Linear(C, C)

    def forward(self, x: torch.Tensor, row: int | None = None) -> torch.Tensor:
        return cast(torch.Tensor, self.w(x if row is None else x[row : row + 1]))


class RowByRow(nn.Module):
    """The port runs its module row by row (a call per row of the batch, each given the whole input), the reference
    once on the batch: the same maths, the port's calls facing none of the reference's."""

    def __init__(self, port: bool, name: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.add_module(name, Rows())
        self.name, self.port = name, port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = getattr(self, self.name)
        return torch.cat([f(x, i) for i in range(2)]) if self.port else cast(torch.Tensor, f(x))


def _rows(settings: Settings, session: str, names: tuple[str, str], pairs: list[dict[str, str]] | None = None) -> Any:
    for run, port, name in (("reference", False, names[0]), ("candidate", True, names[1])):
        model = RowByRow(port, name).eval()
        with torch.no_grad(), capture(model, session, run, data_dir=settings.data_dir):
            model(torch.randn(2, 3, C, generator=torch.Generator().manual_seed(1)))
    if pairs:
        services = open_services(settings)
        try:
            with services.sessions() as db:
                session_id = db.scalars(select(SessionRecord.id).where(SessionRecord.name == session)).one()
            services.actions.import_pairing(session_id, {"pairs": pairs})
        finally:
            services.close()
    return compared(settings, session)


def test_a_module_named_with_outputs_run_row_by_row_is_no_divergence(settings: Settings) -> None:
    report = _rows(settings, "outputs name", ("proj_outputs_head", "proj_outputs_head"))
    assert report.first_divergence is None and report.verdict == "incomplete", report.first_divergence


def test_a_port_of_other_module_paths_run_row_by_row_is_no_divergence(settings: Settings) -> None:
    """The port's module is `g` where the reference's is `f`, paired by hand: the port's second call of `g` is seen
    as the call the reference lacks."""
    pairs = [{"a": f"RowByRow.f_{p}", "b": f"RowByRow.g_{p}"} for p in ("inputs_args_0", "outputs")]
    report = _rows(settings, "other paths", ("f", "g"), pairs)
    by_hand = [(p.a.name, p.b.name) for p in report.pairs if p.strategy == "manual"]
    assert by_hand == [(x["a"], x["b"]) for x in pairs], report.pairs
    assert report.first_divergence is None and report.verdict == "incomplete", report.first_divergence
