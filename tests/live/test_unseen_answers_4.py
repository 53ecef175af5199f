"""`find_divergence`'s answers on models of kinds its other tests do not build (bench/RESULTS.md, "answers on unseen
models, round 4"): each test holds one answer that was wrong or claimed too much before its fix."""

from __future__ import annotations

from pathlib import Path

import torch
from tensor_debugger import find_divergence
from tensor_debugger.settings import Settings
from torch import nn

HERE = Path(__file__)
DIM, EXPERTS = 8, 4


def line_of(marker: str) -> str:
    """`path:line` of the line of this file that ends with the comment `marker`."""
    lines = HERE.read_text(encoding="utf-8").splitlines()
    found = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}")]
    assert len(found) == 1, marker
    return f"{HERE}:{found[0]}"


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
