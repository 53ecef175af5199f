"""`Tiny`: a linear, x² by a custom autograd function, a linear; its port's backward of x² (only) a little off
(`factor`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

DIM = 6


class Square(torch.autograd.Function):
    """x², whose backward is 2x·g, or (the planted bug) a little more."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.factor = factor
        return x * x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        return 2 * x * grad * ctx.factor, None


class Act(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        apply = cast("Callable[..., torch.Tensor]", Square.apply)  # typed from torch 2.15 on, untyped before
        return apply(x, self.factor)


class Tiny(nn.Module):
    def __init__(self, factor: float = 1.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(DIM, DIM)
        self.act = Act(factor)
        self.down = nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(self.act(self.up(x)))
        return out
