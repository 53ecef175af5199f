"""`find_divergence`'s answers on models of kinds its other tests do not build (bench/RESULTS.md, "answers on unseen
models, round 4"): each test holds one answer that was wrong or claimed too much before its fix."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch
from tensor_debugger import capture, find_divergence
from tensor_debugger.settings import Settings
from torch import nn

from tests.support.sessions import compared_with_unmatched as compared
from tests.support.source_lines import marked_line

HERE = Path(__file__)
DIM, EXPERTS = 8, 4


line_of = partial(marked_line, HERE)  # `path:line` of this file's line ending with the comment `marker`


class Router(nn.Module):
    """A mixture of experts' router, as Mixtral's: the top-k experts' weights, renormalised, and their indices."""

    def __init__(self, top_k: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gate = nn.Linear(DIM, EXPERTS, bias=False)
        self.top_k = top_k

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top, index = self.gate(x).softmax(-1).topk(self.top_k, dim=-1)
        top = top / top.sum(-1, keepdim=True)  # router renormalises
        return top, index


class Moe(nn.Module):
    def __init__(self, top_k: int) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.inp = nn.Linear(DIM, DIM)
        self.router = Router(top_k)
        self.experts = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(EXPERTS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        top, index = self.router(h)
        every = torch.stack([expert(h) for expert in self.experts], dim=-2)  # [tokens, experts, dim]
        chosen = every.gather(-2, index[..., None].expand(*index.shape, DIM))
        out: torch.Tensor = (chosen * top[..., None]).sum(-2)
        return out


def test_a_module_whose_output_has_another_shape_is_the_culprit(settings: Settings) -> None:
    """A port routing each token to its top-1 expert where the reference takes the top 2 (Mixtral's top_k): the
    router's weights are [tokens, 1] against [tokens, 2]. The first divergence was right (the renormalising sum), but
    no culprit was named and none said why: the router's outputs, of other shapes, were left out of the full values'
    comparison, so no output of the router failed."""
    x = torch.randn(6, DIM, generator=torch.Generator().manual_seed(2))
    found = find_divergence(Moe(2).eval(), Moe(1).eval(), (x,), session="moe", data_dir=settings.data_dir)
    assert found.first is not None
    assert found.first.reference == "Moe.router/sum#1_outputs", found.first.reference
    assert found.first.reference_source == found.first.candidate_source == line_of("router renormalises")
    assert found.culprits == ["Moe.router"], found.culprits
    assert "Culprit: Moe.router (its inputs agree, its outputs do not)" in repr(found)


class Decoder(nn.Module):
    """One step of a decoder with a cache of keys: each call appends its token's key and attends over the cache. The
    port prepends it: the same values on the first call (the cache empty), other ones from the second on."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.k, self.q = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
        self.cache = torch.zeros(1, 0, DIM)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = self.k(x)
        if self.port:
            self.cache = torch.cat([key, self.cache], dim=1)  # port cache
        else:
            self.cache = torch.cat([self.cache, key], dim=1)  # reference cache
        weights = (self.q(x) @ self.cache.transpose(1, 2)).softmax(-1)
        out: torch.Tensor = weights @ self.cache
        return out


class PortDecoder(Decoder):
    pass


@pytest.mark.parametrize("values", ["summary", "full"])
def test_every_forward_of_a_capture_is_kept_and_a_bug_of_the_second_is_found_there(
    settings: Settings, values: str
) -> None:
    """A capture around three forwards (generate's steps, a loop): only the last forward's tensors were kept (each
    call of the model took the trace's root, leaving the calls before it out; with values="full" their files were
    ingested unnamed, `op000000`), so a bug showing from the second forward on was "no divergence" with a summary
    capture. Every call is kept, in order, and the first divergence is the second call's cache, at its line on each
    side. With the port's class renamed, the calls' own ops (`Decoder#2/cat#1`, `PortDecoder#2/cat#1`) paired by
    module path without the class name collided (`/cat#1` for every call) and were left unpaired."""
    steps = torch.randn(3, 1, 1, DIM, generator=torch.Generator().manual_seed(1))
    # the port's class renamed, as ports often are: the model's own ops pair by call, op and call index
    for model, run in ((Decoder(False).eval(), "reference"), (PortDecoder(True).eval(), "candidate")):
        with torch.no_grad(), capture(model, "steps", run, data_dir=settings.data_dir, level="op", values=values):
            for x in steps:
                model(x)
    report, unmatched = compared(settings, 1)
    names = [p.name for p in report.pairs]
    assert names[:2] == ["Decoder_inputs_args_0", "Decoder.k_inputs_args_0"], names
    for call in ("Decoder", "Decoder#2", "Decoder#3"):
        assert f"{call}/cat#1_outputs" in names and f"{call}_outputs" in names, names
    assert unmatched == []
    first = report.first_divergence
    assert first is not None and first.name == "Decoder#2/cat#1_outputs", first
    assert (first.reference_source, first.candidate_source) == (line_of("reference cache"), line_of("port cache"))


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x) * 2  # file scale
        out: torch.Tensor = self.b(h)
        return out


# the port's forward, compiled from a string (as `exec`, `python -c`, a script piped to python, an IPython prompt)
PORT = "def forward(self, x):\n    h = self.a(x)\n    h = h * 3\n    return self.b(h)\n"


def test_an_op_called_by_code_compiled_from_a_string_is_named_at_its_line_there(settings: Settings) -> None:
    """Frames of code compiled from a string ("<string>") were passed over, so the op's line was the one that called
    the model (here find_divergence's call, in this file): a line that does not hold the op, named as if it did."""
    namespace: dict[str, object] = {}
    exec(compile(PORT, "<string>", "exec"), namespace)  # noqa: S102 (the user's code, compiled from a string)
    port = type("Port", (Scaled,), {"forward": namespace["forward"]})()
    x = torch.randn(3, DIM, generator=torch.Generator().manual_seed(1))
    found = find_divergence(Scaled().eval(), port.eval(), (x,), session="exec", data_dir=settings.data_dir)
    assert found.first is not None and found.first.reference.endswith("/mul#1_outputs"), found.first
    assert (found.first.reference_source, found.first.candidate_source) == (line_of("file scale"), "<string>:3")


def test_an_ops_outputs_of_other_shapes_are_each_sides_own_and_not_compared(settings: Settings) -> None:
    """The routers captured by hand: the top-k's two outputs ([tokens, 2] against [tokens, 1]) do not face each
    other in the alignment of the router's ops (an op's tuple outputs, `topk#1_outputs_0`, are taken for an op's):
    they are the reference's alone, listed unmatched, not compared; the router's own outputs (of other shapes) are
    not compared either; the first divergence is the first op compared that differs."""
    x = torch.randn(6, DIM, generator=torch.Generator().manual_seed(2))
    for model, run in ((Moe(2).eval(), "reference"), (Moe(1).eval(), "candidate")):
        with torch.no_grad(), capture(model, "moe", run, data_dir=settings.data_dir, level="op", values="summary"):
            model(x)
    report, _ = compared(settings, 1)
    assert report.first_divergence is not None and report.first_divergence.name == "Moe.router/sum#1_outputs"
    coverage = report.coverage
    assert {"Moe.router/topk#1_outputs_0", "Moe.router/topk#1_outputs_1"} <= set(coverage.unmatched), coverage
    assert {"Moe.router_outputs_0", "Moe.router_outputs_1"} <= set(coverage.not_compared), coverage
    assert coverage.out_of_step == [], coverage
