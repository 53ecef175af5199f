"""`forward_parameters` is read once a process per forward function: what it gives must be each module's own forward's
parameters all the same, whichever module of which class asked first."""

from __future__ import annotations

import functools
from typing import Any

import torch
from tensor_debugger.live.parameters import forward_parameters
from torch import nn


class Two(nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return x


class Three(Two):
    def forward(self, x: torch.Tensor, *args: Any, scale: float = 1.0, **kwargs: Any) -> torch.Tensor:
        return x


def positional(module: nn.Module) -> tuple[str, ...] | None:
    found = forward_parameters(module)
    return None if found is None else found.positional


def test_modules_of_one_class_and_of_a_subclass_each_get_their_own_forwards_parameters() -> None:
    first, second, sub = Two(), Two(), Three()
    assert positional(first) == ("x", "mask")
    assert positional(sub) == ("x",)  # not the parent's, read first
    found = forward_parameters(sub)
    assert found is not None and found.var_positional and found.var_keyword and found.keywords == {"x", "scale"}
    assert positional(second) == ("x", "mask")


def test_a_forward_replaced_on_the_class_or_set_on_the_instance_is_read_again() -> None:
    class Patched(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    module = Patched()
    assert positional(module) == ("x",)

    def other(self: nn.Module, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a

    Patched.forward = other  # type: ignore[method-assign,assignment]
    assert positional(module) == ("a", "b")
    module.forward = functools.partial(other, module, b=torch.zeros(1))  # type: ignore[method-assign]
    found = forward_parameters(module)
    assert found is not None and found.positional == ("a",) and found.keywords == {"a", "b"}  # b keyword-only now
    module.forward = lambda q: q  # type: ignore[method-assign,assignment]
    assert positional(module) == ("q",)
    del module.forward
    assert positional(module) == ("a", "b")
