"""Seeded synthetic torch models with a bug that can be planted, shared by the tests and the benchmarks.

A model's weights come from `torch.manual_seed(0)`, so a model built with the bug and one built without hold the
same weights: they differ only where the bug is planted.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F  # noqa: N812 (the name models use)
from torch import nn


class LayerStack(nn.Module):
    """Layers called in turn on the input, first cast to the weights' dtype (so that one input serves a model
    converted to a lower precision)."""

    def __init__(self, layers: Iterable[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(next(self.parameters()).dtype)
        for layer in self.layers:
            x = layer(x)
        return x


class Residual(nn.Module):
    """x + down(act(up(x))), up to twice the width and back: GELU, or (the bug) SiLU."""

    def __init__(self, hidden: int, bug: bool) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(hidden, 2 * hidden), nn.Linear(2 * hidden, hidden)
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        out: torch.Tensor = x + self.down(F.silu(h) if self.bug else F.gelu(h))
        return out


class ResidualStack(LayerStack):
    """`layers` residual blocks of width `hidden`; the bug, where planted, in the last block's activation."""

    def __init__(self, layers: int = 12, hidden: int = 512, bug: bool = False) -> None:
        torch.manual_seed(0)
        super().__init__(Residual(hidden, bug and i == layers - 1) for i in range(layers))
