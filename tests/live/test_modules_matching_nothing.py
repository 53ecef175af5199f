"""`capture(modules=...)` with a pattern that matches no module of the model warns, naming the pattern and some
of the model's module names: a typo would otherwise record only the model's own inputs and outputs, silently
(failed on the parent commit: no warning). A pattern that matches, by path or without the model's name, does not."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from tensor_debugger import capture
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_pattern_that_matches_no_module_warns(tmp_path: Path) -> None:
    model, x = Net(), torch.randn(2, 8)
    with (
        pytest.warns(UserWarning, match=r"'nothing\.\*' matches no module of Net \(its modules: layers, layers\.0"),
        torch.no_grad(),
        capture(model, session="typo", run="reference", modules=["layers.1", "nothing.*"], data_dir=tmp_path) as got,
    ):
        model(x)
    assert got.tensors > 0  # it still records what the other pattern selects


@pytest.mark.parametrize("pattern", ["layers.1", "Net.layers.*.lin", "layers.?"])
def test_a_pattern_that_matches_does_not_warn(tmp_path: Path, pattern: str) -> None:
    model, x = Net(), torch.randn(2, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad(), capture(model, session="ok", run="reference", modules=pattern, data_dir=tmp_path):
            model(x)
