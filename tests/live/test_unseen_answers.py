"""`find_divergence`'s answers on models of kinds its other tests do not build (bench/RESULTS.md, "answers on unseen
models, round 3"): each test holds one answer that was wrong or claimed too much before its fix."""

from __future__ import annotations

from pathlib import Path

import torch
from tensor_debugger import find_divergence
from tensor_debugger.settings import Settings
from torch import nn

HERE = Path(__file__)
DIM, HEADS, KV_HEADS = 16, 4, 2


def line_of(marker: str) -> str:
    """`path:line` of the line of this file that ends with the comment `marker`."""
    lines = HERE.read_text(encoding="utf-8").splitlines()
    found = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}")]
    assert len(found) == 1, marker
    return f"{HERE}:{found[0]}"


def repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    """Each key/value head `n` times in a row, as transformers' `repeat_kv` does it."""
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n, t, d).reshape(b, h * n, t, d)


def port_repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    """The port's: the heads tiled (0 1 0 1), not repeated in place (0 0 1 1)."""
    return x.repeat(1, n, 1, 1)  # port repeat_kv


class GroupedAttention(nn.Module):
    """Attention with 4 query heads sharing 2 key/value heads."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q_proj = nn.Linear(DIM, DIM, bias=False)
        self.k_proj, self.v_proj = (nn.Linear(DIM, DIM // HEADS * KV_HEADS, bias=False) for _ in range(2))
        self.o_proj = nn.Linear(DIM, DIM, bias=False)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, HEADS, -1).transpose(1, 2)
        k = self.k_proj(x).view(b, t, KV_HEADS, -1).transpose(1, 2)
        v = self.v_proj(x).view(b, t, KV_HEADS, -1).transpose(1, 2)
        if self.port:
            k, v = port_repeat_kv(k, HEADS // KV_HEADS), port_repeat_kv(v, HEADS // KV_HEADS)
            scores = q @ k.transpose(-1, -2)  # port scores
        else:
            k, v = repeat_kv(k, HEADS // KV_HEADS), repeat_kv(v, HEADS // KV_HEADS)
            scores = q @ k.transpose(-1, -2)  # reference scores
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, DIM)
        result: torch.Tensor = self.o_proj(out)
        return result


def test_ops_whose_call_indices_fall_out_of_step_are_not_the_divergence_the_first_that_differs_is(
    settings: Settings,
) -> None:
    """The reference's repeat_kv reshapes (reshape#1, #2), the port's repeats: the port's first reshape is the
    output's, so reshape#1 names two different ops, of different shapes. That pair was the answer ("shapes
    differ"); the answer is the keys' transpose at the scores' line, the port's repeat named just before it."""
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    found = find_divergence(
        GroupedAttention(False).eval(), GroupedAttention(True).eval(), (x,), session="gqa", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None
    assert first.reference == "GroupedAttention/transpose#4_outputs", first.reference
    assert (first.reference_source, first.candidate_source) == (line_of("reference scores"), line_of("port scores"))
    assert first.summary.shapes_equal and "shapes differ" not in first.summary.reason
    assert first.full is not None and not first.full.passed
    assert ("GroupedAttention/repeat#1_outputs", line_of("port repeat_kv")) in first.candidate_only_before
    # the reference's reshapes, out of step with the port's, are its own ops there, not a pair
    assert "GroupedAttention/reshape#1_outputs" in dict(first.reference_only_before)
    assert f"GroupedAttention/repeat#1_outputs ({line_of('port repeat_kv')})" in repr(found)
