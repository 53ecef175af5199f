"""`find_divergence`'s answers, and the session's pages, on models of kinds its other tests do not build
(bench/RESULTS.md, "answers on unseen models, round 5"): each test holds one answer that was wrong or claimed too
much before its fix."""

from __future__ import annotations

from pathlib import Path

import torch
from tensor_debugger import find_divergence
from tensor_debugger.settings import Settings
from torch import nn

HERE = Path(__file__)
DIM, HEADS = 8, 2


def line_of(marker: str) -> str:
    """`path:line` of the line of this file that ends with the comment `marker`."""
    lines = HERE.read_text(encoding="utf-8").splitlines()
    found = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}")]
    assert len(found) == 1, marker
    return f"{HERE}:{found[0]}"


class Scores(nn.Module):
    """Attention scores, scaled, masked and normalised; the port scales them twice (as MPT's port did)."""

    def __init__(self, twice: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
        self.twice = twice

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        scale = DIM**-0.5
        s = self.q(x) @ self.k(x).transpose(-1, -2) * scale  # scores scaled
        if self.twice:
            s = s * scale  # scaled again
        p: torch.Tensor = s.masked_fill(~keep[:, None, :], float("-inf")).softmax(-1)
        return p


def test_an_op_run_once_more_beside_its_twin_is_named_with_its_line_on_both_sides(settings: Settings) -> None:
    """The scale applied twice: the reference's `mul` and the port's two face none of each other's (either of the
    port's could be the reference's), so the first op that differs is the mask's `masked_fill`, past a pair (the
    mask's `invert`). The answer named the reference's `mul` without its line and none of the port's: the line of
    the bug (the second scale) was nowhere in it."""
    g = torch.Generator().manual_seed(1)
    x, keep = torch.randn(2, 5, DIM, generator=g), torch.ones(2, 5, dtype=torch.bool)
    keep[1, 3:] = False
    found = find_divergence(
        Scores(False).eval(), Scores(True).eval(), (x, keep), session="twice", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None and first.reference == "Scores/masked_fill#1_outputs", repr(found)
    assert first.unmatched_before == ("Scores/mul#1_outputs",), first
    assert first.unmatched_before_sources == (line_of("scores scaled"),), first
    assert first.candidate_unmatched_before == (
        ("Scores/mul#1_outputs", line_of("scores scaled")),
        ("Scores/mul#2_outputs", line_of("scaled again")),
    ), first
    words = repr(found)
    assert f"(the first: Scores/mul#1_outputs ({line_of('scores scaled')}))" in words, words
    assert f"Scores/mul#2_outputs ({line_of('scaled again')})" in words, words
