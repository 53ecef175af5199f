"""Answers on models and planted bugs no earlier round built (bench/RESULTS.md, "answers on unseen models, round
13"): the case that was wrong and is now fixed (MiniMax's, cut down to a hand model).

Fixed: a decay computed once per block of a linear attention (MiniMax's lightning attention), the port's block size
off by one, so that the port's first block's decay holds what the reference's second block's does. The alignment
took that one-way match for two ops computed in another order: it paired the reference's first `mul` with the
port's second, named that pair the first divergence, and said the port's ops of the second block ran "where the
reference does not". Now a pair left over by such a match, farther apart than position put its ops, proves no other
order: position stands (the pairs that differ marked ambiguous), and the first divergence is the first block's."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch
from tensor_debugger import find_divergence
from tensor_debugger.settings import Settings
from torch import nn

from tests.support.source_lines import marked_line

HERE = Path(__file__)
D = 8
BLOCK = 4

line_of = partial(marked_line, HERE)


class BlockDecay(nn.Module):
    """A linear attention over blocks of `BLOCK` tokens, the state carried from block to block and decayed by the
    block's length (MiniMax's lightning attention, cut down), from `start`; `shift`: the port's block length one
    less. Over two blocks, the reference's decays are of 4 and 3 tokens, the port's of 3 and 2."""

    def __init__(self, shift: int, start: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv = nn.Linear(D, 3 * D)
        self.slope = nn.Parameter(torch.rand(D, 1) * 0.5 + 0.1)
        self.state = nn.Parameter(torch.full((D, D), start))
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        state = self.state.expand(x.shape[0], D, D)
        out = []
        for start in range(0, x.shape[1], BLOCK):
            size = min(BLOCK, x.shape[1] - start)
            qb, kb, vb = q[:, start : start + size], k[:, start : start + size], v[:, start : start + size]
            decay = torch.exp(-self.slope * (size - self.shift))  # decay
            out.append(qb @ state + (qb @ kb.transpose(1, 2)).tril() @ vb)
            state = state * decay + kb.transpose(1, 2) @ vb
        return torch.cat(out, dim=1)


class Net(nn.Module):
    def __init__(self, shift: int, start: float) -> None:
        super().__init__()
        self.attn = BlockDecay(shift, start)
        self.out = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out(self.attn(x))
        return out


@pytest.mark.parametrize("start", [0.0, 0.1], ids=["no decay reaches the output", "the first block's does"])
def test_a_per_block_decay_off_by_one_is_named_at_the_first_block(settings: Settings, start: float) -> None:
    """Wrong before: the port's first block's `mul` (its length 3) holds what the reference's second block's does,
    so the reference's first `mul` was paired with the port's second and the port's ops between them were said to
    run "where the reference does not". Now the first block's `mul`s pair, at the decay's line on both sides."""
    reference, candidate = Net(0, start).eval(), Net(1, start).eval()
    x = torch.randn(2, BLOCK + 3, D, generator=torch.Generator().manual_seed(1))  # two blocks: 4 and 3 tokens
    found = find_divergence(reference, candidate, (x,), session="decay", data_dir=settings.data_dir)
    first = found.first
    assert first is not None and first.reference == first.candidate == "Net.attn/mul#1_outputs", repr(found)
    assert first.reference_source == first.candidate_source == line_of("decay"), repr(found)
    assert "where the reference does not" not in repr(found), repr(found)
    # with no state to decay in the first block, no decay reaches the output: no module's outputs differ
    assert found.culprits == (["Net.attn"] if start else []), repr(found)
