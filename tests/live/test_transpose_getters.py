"""The transposes read as properties (`x.T`, `x.mT`, `x.H`, `x.mH`) are recorded as ops, each with its line, as
`.real` and `.imag` are (live/ops.py's GETTERS): a port that transposes a square weight where the reference uses it
as it is is named at the line that transposes. Before, the getters were left out, so the answer named the port's
matmul and nothing at the transposing line."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
from tensor_debugger import capture, find_divergence
from tensor_debugger.ingest.sketches import fold64_sketch
from tensor_debugger.settings import Settings
from torch import nn

from tests.support.sessions import compared
from tests.support.source_lines import marked_line

D = 8
line_of = partial(marked_line, Path(__file__))


class Transposes(nn.Module):
    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        a = x[0].T  # T
        b = x.mT  # mT
        c = z[0].H  # H
        d = z.mH  # mH
        return a.sum() + b.sum() + (c.real.sum() + d.imag.sum())


def test_each_transpose_getter_is_an_op_at_its_line(settings: Settings) -> None:
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(1))
    z = torch.randn(2, 3, 4, dtype=torch.complex64, generator=torch.Generator().manual_seed(2))
    model = Transposes()
    with (
        torch.no_grad(),
        capture(model, "getters", "r", data_dir=settings.data_dir, level="op", values="summary") as result,
    ):
        model(x, z)
    for op in ("T", "mT", "H", "mH"):
        name = f"Transposes/{op}#1_outputs"
        assert result.sources.get(name) == line_of(op), (op, sorted(result.sources))


class Mixed(nn.Module):
    """`x @ W` with a square `W`; the port (`port`) transposes it first, on a line of its own."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Parameter(torch.randn(D, D))
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w: torch.Tensor = self.w
        if self.port:
            w = w.T  # port transposes
        return torch.relu(x @ w)  # mixed


def _x() -> torch.Tensor:
    return torch.randn(2, 5, D, generator=torch.Generator().manual_seed(3))


def test_a_port_transposing_its_weight_is_named_at_that_line(settings: Settings) -> None:
    found = find_divergence(Mixed(False).eval(), Mixed(True).eval(), (_x(),), session="T", data_dir=settings.data_dir)
    first = found.first
    assert first is not None and first.reference == "Mixed/matmul#1_outputs", found.words()
    assert ("Mixed/T#1_outputs", line_of("port transposes")) in first.candidate_only_before, found.words()
    assert f"Mixed/T#1_outputs ({line_of('port transposes')})" in found.words(), found.words()


def test_the_session_of_two_captures_names_the_transpose_before_the_divergence(settings: Settings) -> None:
    for run, port in (("reference", False), ("candidate", True)):
        model = Mixed(port).eval()
        with torch.no_grad(), capture(model, "T session", run, data_dir=settings.data_dir, level="op"):
            model(_x())
    first = compared(settings, "T session").first_divergence
    assert first is not None and first.name == "Mixed/matmul#1_outputs", first
    assert first.candidate_only_before == [f"Mixed/T#1_outputs ({line_of('port transposes')})"], first


class Conjugates(nn.Module):
    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z.conj().sum() + z[0].H.sum()


def test_a_conjugate_views_summary_is_of_its_values(settings: Settings) -> None:
    """`z.conj()` and `z.H` are views whose memory holds `z`'s values (torch conjugates as it reads): their
    summaries are of the conjugated values. Before, `z.conj()`'s was `z`'s own (the same bytes, so taken for the
    same tensor) and `.H`'s summary raised (a conjugate view cannot be read as integers)."""
    z = torch.randn(2, 3, 3, dtype=torch.complex64, generator=torch.Generator().manual_seed(2))
    model = Conjugates()
    with torch.no_grad(), capture(model, "conj", "r", data_dir=settings.data_dir, level="op", values="summary") as got:
        model(z)
    conj, given = got.summaries["Conjugates/conj#1_outputs"], got.summaries["Conjugates_inputs_args_0"]
    assert conj.hash != given.hash, (conj, given)
    assert conj.hash == fold64_sketch(z.conj().resolve_conj())[0].hash, conj
    transposed = got.summaries["Conjugates/H#1_outputs"]
    assert transposed.hash == fold64_sketch(z[0].H.resolve_conj())[0].hash, transposed
