"""The models the op-capture tests capture: a three-layer attention net and its port with the softmax scale got
wrong in layer 1 (`models`), and `Drift`, a difference within tolerance that a later op magnifies. `line_of` finds
the lines of this file marked with a comment, which a captured op's `source` names."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 (the name models use)
from torch import nn

from tests.support.source_lines import marked_line

HERE = Path(__file__)
DIM = 16


line_of = partial(marked_line, HERE)  # `path:line` of this file's line ending with the comment `marker`


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.scaling = DIM**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scaling  # reference scores
        weights = F.softmax(scores, dim=-1)  # reference softmax
        out: torch.Tensor = self.o_proj(weights @ v)
        return out


class PortedAttention(Attention):
    """The attention's forward copied into a port, with the softmax scale got wrong."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (self.scaling * 1.25)  # ported scores
        weights = F.softmax(scores, dim=-1)  # ported softmax
        out: torch.Tensor = self.o_proj(weights @ v)
        return out


class Block(nn.Module):
    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.self_attn = attention
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.norm(x))
        out: torch.Tensor = x + self.mlp(x)
        return out


class Net(nn.Module):
    def __init__(self, ported_layer: int | None = None, layers: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            Block(PortedAttention() if i == ported_layer else Attention()) for i in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)  # net calls a layer
        return torch.tanh(x)


class PortedNet(Net):
    """The port: another class name (so its tensors' names differ from the reference's), layer 1 ported."""

    def __init__(self) -> None:
        super().__init__(ported_layer=1)


def models() -> tuple[Net, PortedNet]:
    torch.manual_seed(0)
    reference = Net()
    candidate = PortedNet()
    candidate.load_state_dict(reference.state_dict())
    return reference, candidate


class Drift(nn.Module):
    """A difference within tolerance (1e-6 added) that a later op magnifies past it (x1000 after a cancellation)."""

    def __init__(self, offset: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(DIM, DIM)
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x) + self.offset  # drift begins
        out: torch.Tensor = (h - self.proj(x)) * 1000
        return out
