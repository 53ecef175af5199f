"""The model's own ops (those outside every module of it) when the model is called more than once in a capture:
the names say which call made each (`Scaled/mul#1_outputs` the first call's, `Scaled#2/mul#1_outputs` the
second's), and the alignment of ops (`engine/op_alignment.pair_ops`) pairs only ops of one call of the model with
those of the same call on the other side. It aligned every call's own ops as one list: an op the reference makes
in its first call faced one the candidate makes in its second, two different inputs, and was called the first
divergence."""

from __future__ import annotations

from pathlib import Path

import torch
from tensor_debugger import capture
from tensor_debugger.settings import Settings
from torch import nn

from tests.support.sessions import compared_with_unmatched as compared

DIM = 4


class Scaled(nn.Module):
    """Doubles its input in the call `doubling` only (the model's own `mul`), then a linear layer."""

    def __init__(self, doubling: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(DIM, DIM)
        self.doubling, self.calls = doubling, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.doubling:
            x = x * 2
        out: torch.Tensor = self.layer(x)
        return out


def test_the_models_own_ops_pair_only_within_one_call_of_the_model(tmp_path: Path) -> None:
    settings = Settings.from_environ(data_dir=tmp_path / "data")
    steps = torch.randn(2, 1, DIM, generator=torch.Generator().manual_seed(1))
    for doubling, run in ((1, "reference"), (2, "candidate")):
        model = Scaled(doubling).eval()
        with torch.no_grad(), capture(model, "calls", run, data_dir=settings.data_dir, level="op") as result:
            for x in steps:
                model(x)
        assert result.session_id is not None
    pairs, unmatched = compared(settings, result.session_id)
    names = {(p.a.name, p.b.name) for p in pairs.pairs}
    # the reference's first-call mul and the candidate's second-call mul are two calls' values, never a pair
    assert ("Scaled/mul#1_outputs", "Scaled#2/mul#1_outputs") not in names, names
    assert "Scaled/mul#1_outputs" in unmatched, unmatched
    # what truly differs first: the layer of the first call (its input doubled on the reference's side only)
    failing = [p.name for p in pairs.pairs if p.status == "fail"]
    assert failing and failing[0] == "Scaled.layer_inputs_args_0", failing
