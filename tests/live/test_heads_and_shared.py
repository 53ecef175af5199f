"""Attention by a Python loop over heads against one batched matmul and softmax (bench/RESULTS.md, "a loop over
heads against a batched op"): the sequence alignment pairs none of the per-head ops, so before, the answer named the
attention's output (or the next module's input) and listed the per-head ops as unpaired, the bug's slicing line
among "28 more tensors". Now the candidate's per-head ops are related by values to slices of the reference's
batched tensors (engine/head_slices.py), and the first that equals none, or equals a part out of turn, or a slice
of another layout, is named with its line."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from tensor_debugger import find_divergence
from tensor_debugger.engine.head_slices import relate, slices_between
from tensor_debugger.settings import Settings
from torch import nn

from tests.support.source_lines import marked_line

HERE = Path(__file__)
D, H = 16, 4
d = D // H

line_of = partial(marked_line, HERE)


class Batched(nn.Module):
    """The reference: every head at once."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, H, d).transpose(1, 2)
        k = self.k(x).view(b, t, H, d).transpose(1, 2)
        v = self.v(x).view(b, t, H, d).transpose(1, 2)
        w = torch.softmax(q @ k.transpose(-1, -2) / d**0.5, dim=-1)
        out: torch.Tensor = self.o((w @ v).transpose(1, 2).reshape(b, t, D))
        return out


class Looped(Batched):
    """The port: a loop over heads; `bug` plants one ("rolled": head 2's query rolled by one element; "strided":
    every head's values taken `h::H`; "turn": head 2 given head 1's keys; "after": the heads' concatenation scaled)."""

    def __init__(self, bug: str) -> None:
        super().__init__()
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        heads = []
        for h in range(H):
            qh = q[..., h * d : (h + 1) * d]
            if self.bug == "rolled" and h == 2:
                qh = torch.roll(qh, 1, -1)  # rolled
            kh = k[..., (h - 1) * d : h * d] if self.bug == "turn" and h == 2 else k[..., h * d : (h + 1) * d]  # keys
            vh = v[..., h::H] if self.bug == "strided" else v[..., h * d : (h + 1) * d]  # values
            w = torch.softmax(qh @ kh.transpose(-1, -2) / d**0.5, dim=-1)
            heads.append(w @ vh)
        joined = torch.cat(heads, -1)
        if self.bug == "after":
            joined = joined * 1.01  # scaled
        out: torch.Tensor = self.o(joined)
        return out


class Model(nn.Module):
    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.attn = attn
        self.head = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.attn(x))
        return out


@pytest.mark.parametrize(
    ("bug", "marker", "op", "words"),
    [
        ("rolled", "rolled", "roll#1", "The first that equals none of them is"),
        ("strided", "values", "getitem#3", "The first taken another way is"),
        ("turn", "keys", "getitem#8", "where part 2 was due"),
        ("after", "scaled", "mul#1", "The first that equals none of them is"),
    ],
)
def test_a_loop_over_heads_names_the_first_op_no_slice_of_the_batched_op_explains(
    settings: Settings, bug: str, marker: str, op: str, words: str
) -> None:
    """Before: the first divergence was the attention's output projection's input, every per-head op unpaired and
    the planted line unnamed. Now the first per-head op whose values equal no slice of the reference's batched
    tensors (or one out of turn, or of another layout) is named, with its line: the planted one."""
    reference, candidate = Model(Batched()).eval(), Model(Looped(bug)).eval()
    candidate.load_state_dict(reference.state_dict())
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(1))
    found = find_divergence(reference, candidate, (x,), session=bug, data_dir=settings.data_dir)
    first = found.first
    assert first is not None and first.inside is not None, repr(found)
    at = first.inside.first
    assert at is not None and at.candidate == f"Model.attn/{op}_outputs", repr(found)
    line = line_of(marker)
    assert f"Model.attn/{op}_outputs ({line})" in repr(found), repr(found)
    assert words in repr(found), repr(found)
    if bug == "after":  # every per-head op before it equals a slice of the reference's: none named wrongly
        assert len(first.inside.matched) == 4 * 8 + 1 and not first.inside.unrelated, repr(found)


def test_slices_between_relates_a_head_to_a_batched_shape() -> None:
    """One dimension more: each index; one dimension H times larger: blocks and strided parts; else none."""
    indexed = slices_between("r", (2, 4, 5, 5), (2, 5, 5))
    assert [(s.dim, s.part, s.indexed) for s in indexed] == [(1, h, True) for h in range(4)]
    parts = slices_between("r", (2, 5, 16), (2, 5, 4))
    assert [s.index() for s in parts] == [
        *(f"[..., {4 * h}:{4 * h + 4}]" for h in range(4)),
        *(f"[..., {h}::4]" for h in range(4)),
    ]
    assert slices_between("r", (2, 5, 16), (2, 5, 3)) == []
    assert [s.index() for s in slices_between("r", (2, 5), (2, 5))] == [""]


def test_relate_says_which_slice_by_values_and_stops_at_the_first_that_equals_none() -> None:
    """Two heads' blocks of a batched tensor match in turn; a third that equals no block is the first named."""
    batched = np.arange(24, dtype=np.float64).reshape(2, 12)
    heads = [("h0", batched[:, 0:4]), ("h1", batched[:, 4:8]), ("h2", batched[:, 8:12] + 1.0)]
    found = relate([("r", batched)], heads, lambda a, b: bool(np.allclose(b, a)))
    assert [(m.candidate, m.slice.index()) for m in found.matched] == [("h0", "[:, 0:4]"), ("h1", "[:, 4:8]")]
    assert found.first is not None and found.first.candidate == "h2"
    assert found.first.slice is not None and found.first.slice.index() == "[:, 8:12]"
    assert found.first.max_abs_diff == 1.0
