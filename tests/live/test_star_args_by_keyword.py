"""A module input passed by keyword to a named positional parameter on one side (the reference's `forward(self,
x, mask)` called `m(h, mask=mask)`) and positionally into `*args` on the other (the port's `forward(self, *args)`
called `m(h, mask)`) is one argument: the capture records each positional parameter's position beside its name
(`mask@1`, `live/parameters.py`), and the session's planning and find_divergence pair the keyword bound to position
1 with the other side's second positional argument (strategy "parameter by position", said in the pair's note).
Before, the reference's `..._inputs_kwargs_mask` and the port's `*1` paired with nothing: the answer said the
module's input "was not compared" and named no culprit (bench/RESULTS.md, round 10's last row)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from sqlalchemy import select
from tensor_debugger import capture, find_divergence
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import RunRecord, TensorRecord
from torch import nn

from tests.support.sessions import compared
from tests.support.source_lines import marked_line

D, T = 16, 6
NOTE = "paired by parameter position: one side passes this input by keyword to its forward's positional parameter k"
line_of = partial(marked_line, Path(__file__))


class Named(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(D, D)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.f(x) * mask)  # named


class Starred(nn.Module):
    """The port's: its inputs through `*args`; with `bug`, the mask flipped along the sequence."""

    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.f = nn.Linear(D, D)
        self.bug = bug

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        x, mask = args
        return cast(torch.Tensor, self.f(x) * (mask.flip(1) if self.bug else mask))  # starred


class KeywordOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(D, D)

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.f(x) * mask)


class Outer(nn.Module):
    """The reference calls its inner module with the mask by keyword, the port positionally (`case` "keyword
    only": the reference's mask is a keyword-only parameter, which has no position; "positional": the reference
    passes it by position too)."""

    def __init__(self, port: bool, bug: bool = False, case: str = "named") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(D, D)
        self.m: nn.Module = Starred(bug) if port else KeywordOnly() if case == "keyword only" else Named()
        self.by_position = port or case == "positional"

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return cast(torch.Tensor, self.m(h, mask) if self.by_position else self.m(h, mask=mask))


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(2, T, D, generator=torch.Generator().manual_seed(5))
    mask = (torch.rand(2, T, 1, generator=torch.Generator().manual_seed(6)) > 0.3).float()
    return x, mask


def _captured(settings: Settings, session: str, bug: bool, case: str = "named", **options: Any) -> None:
    for label, model in (("reference", Outer(False, case=case)), ("candidate", Outer(True, bug))):
        with torch.no_grad(), capture(model.eval(), session, label, data_dir=settings.data_dir, **options):
            model(*_inputs())


def _parameters(settings: Settings) -> dict[tuple[str, str], str | None]:
    """The parameter each run's inputs of `Outer.m` bind to, by run label and tensor name."""
    services = open_services(settings)
    try:
        with services.sessions() as db:
            rows = db.execute(
                select(RunRecord.label, TensorRecord.name, TensorRecord.parameter)
                .join(RunRecord, RunRecord.id == TensorRecord.run_id)
                .where(TensorRecord.name.like("Outer.m_inputs%"))
            )
            return {(label, name): parameter for label, name, parameter in rows}
    finally:
        services.close()


def test_the_capture_records_a_positional_parameters_position_beside_its_name(settings: Settings) -> None:
    _captured(settings, "recorded", bug=False)
    assert _parameters(settings) == {
        ("reference", "Outer.m_inputs_args_0"): "x@0",
        ("reference", "Outer.m_inputs_kwargs_mask"): "mask@1",
        ("candidate", "Outer.m_inputs_args_0"): "*0",
        ("candidate", "Outer.m_inputs_args_1"): "*1",
    }


@pytest.mark.parametrize("case", ["named", "positional"])
def test_find_divergence_pairs_the_keyword_with_the_star_args_at_its_position(settings: Settings, case: str) -> None:
    """The port's mask flipped: the first divergence is the module's `mul` at each side's line, the module is the
    culprit, and its mask (passed by keyword, or by position, on one side, into `*args` on the other) was
    compared."""
    found = find_divergence(
        Outer(False, case=case).eval(),
        Outer(True, bug=True).eval(),
        _inputs(),
        session=f"kw {case}",
        data_dir=settings.data_dir,
    )
    first = found.first
    assert first is not None and first.reference == "Outer.m/mul#1_outputs", found.words()
    assert (first.reference_source, first.candidate_source) == (line_of("named"), line_of("starred")), found.words()
    assert found.culprits == ["Outer.m"], found.words()
    assert "was not compared" not in found.words(), found.words()
    assert found.unpaired == (0, 1), found.words()  # the port's `flip#1` alone


def test_without_the_bug_every_input_pairs_and_nothing_diverges(settings: Settings) -> None:
    found = find_divergence(
        Outer(False).eval(), Outer(True).eval(), _inputs(), session="kw", data_dir=settings.data_dir
    )
    assert found.first is None and found.unpaired == (0, 0), found.words()


@pytest.mark.parametrize("values", ["full", "summary"])
def test_a_session_of_two_captures_pairs_the_keyword_with_the_star_args(settings: Settings, values: str) -> None:
    """Two stored captures: the session pairs the reference's `mask=` with the port's `*1` (strategy "parameter by
    position", its note said), and names the module's `mul` first."""
    _captured(settings, "kw session", bug=True, level="op", values=values)
    report = compared(settings, "kw session")
    by_position = {(p.a.name, p.b.name): p for p in report.pairs if p.strategy == "parameter by position"}
    assert list(by_position) == [("Outer.m_inputs_kwargs_mask", "Outer.m_inputs_args_1")], [
        (p.a.name, p.b.name, p.strategy) for p in report.pairs
    ]
    mask = next(iter(by_position.values()))
    assert mask.status == "pass" and (mask.pairing_note or "").startswith(NOTE), mask
    assert report.first_divergence is not None and report.first_divergence.name == "Outer.m/mul#1_outputs"
    unmatched = [u.name for u in report.unmatched]
    assert "Outer.m_inputs_kwargs_mask" not in unmatched and "Outer.m_inputs_args_1" not in unmatched, unmatched


def test_a_keyword_only_parameter_has_no_position_and_stays_unpaired(settings: Settings) -> None:
    """The reference's `forward(self, x, *, mask)`: its mask binds to no position, so nothing pairs it with the
    port's `*1` (as before)."""
    _captured(settings, "kw only", bug=False, case="keyword only")
    report = compared(settings, "kw only")
    assert not [p for p in report.pairs if p.strategy.startswith("parameter")], report.pairs
    unmatched = {u.name for u in report.unmatched}
    assert {"Outer.m_inputs_kwargs_mask", "Outer.m_inputs_args_1"} <= unmatched, unmatched
