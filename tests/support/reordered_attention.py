"""Hand-written multi-head attention that computes q, k and v in the order it is given (a port computing ops of one
name and shape in another order), with a planted bug in the projections it is told, inside a `Net` of three layers
that add nothing."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812 (the name models use)
from torch import nn

DIM, HEADS = 16, 4
ATTN = "Net.attn"


class Attention(nn.Module):
    """Hand-written multi-head attention whose projections are its own weights (`F.linear` in its own call, no
    `nn.Linear` modules): q, k and v computed in `order`; `bug`: the projections whose weight is scaled by 1.5."""

    def __init__(self, order: str = "qkv", bug: str = "") -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.w = nn.ParameterDict({n: nn.Parameter(torch.randn(DIM, DIM, generator=generator) / 4) for n in "qkvo"})
        self.order, self.bug = order, bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        made: dict[str, torch.Tensor] = {}
        for name in self.order:
            weight = self.w[name] * 1.5 if name in self.bug else self.w[name]
            made[name] = F.linear(x, weight).view(b, t, HEADS, -1).transpose(1, 2)
        q, k, v = made["q"], made["k"], made["v"]
        scores = (q @ k.transpose(-1, -2) / math.sqrt(DIM // HEADS)).softmax(-1)
        return F.linear((scores @ v).transpose(1, 2).reshape(b, t, DIM), self.w["o"])


class Net(nn.Module):
    """The attention, then three layers that add nothing (so that a module adding error stands out among the
    modules ranked)."""

    def __init__(self, order: str = "qkv", bug: str = "") -> None:
        super().__init__()
        self.attn = Attention(order, bug)
        self.layers = nn.ModuleList([nn.Identity() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn(x)
        for layer in self.layers:
            x = layer(x)
        return x


def x_input() -> torch.Tensor:
    """The input every test of these models gives them: [2, 5, DIM], seeded."""
    return torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
