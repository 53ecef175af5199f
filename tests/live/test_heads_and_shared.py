"""Two limits rounds 11 and 12 left (bench/RESULTS.md, "a loop over heads against a batched op; a shared module
registered once against one copy per layer").

Attention by a Python loop over heads against one batched matmul and softmax (bench/RESULTS.md, "a loop over
heads against a batched op"): the sequence alignment pairs none of the per-head ops, so before, the answer named the
attention's output (or the next module's input) and listed the per-head ops as unpaired, the bug's slicing line
among "28 more tensors". Now the candidate's per-head ops are related by values to slices of the reference's
batched tensors (engine/head_slices.py), and the first that equals none, or equals a part out of turn, or a slice
of another layout, is named with its line.

One module called N times under one name (ALBERT's layer group) against a port with one copy per layer: no name
paired them, so the answer stopped at the encoder's output. Now the k-th call pairs with the k-th copy, by a rule
said in the answer, applied only where the copies are each called once, in order (engine/shared_calls.py)."""

from __future__ import annotations

import copy
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tensor_debugger import find_divergence
from tensor_debugger.engine.head_slices import relate, slices_between
from tensor_debugger.engine.shared_calls import SharedCalls, shared_calls
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
    ids=["rolled", "strided", "turn", "after"],
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


LAYERS = 3


def _albert(bug: bool) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    """A tiny ALBERT (one layer group called LAYERS times, random weights, built offline) and a port of it whose
    encoder holds one copy of the group per layer; `bug`: the port's third copy's FFN bias off by 0.05."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_outputs import BaseModelOutput

    if int(transformers.__version__.split(".")[0]) < 5:
        # the port's encoder calls each copy as release 5's AlbertLayerGroup takes its arguments
        pytest.skip(f"transformers {transformers.__version__}'s AlbertLayerGroup takes other arguments")

    config = transformers.AlbertConfig(
        vocab_size=64,
        embedding_size=8,
        hidden_size=16,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout_prob=0.0,
    )

    class PortEncoder(nn.Module):
        def __init__(self, shared: Any) -> None:
            super().__init__()
            self.embedding_hidden_mapping_in: nn.Module = copy.deepcopy(shared.embedding_hidden_mapping_in)
            self.layers = nn.ModuleList([copy.deepcopy(shared.albert_layer_groups[0]) for _ in range(LAYERS)])

        def forward(self, hidden_states: torch.Tensor, attention_mask: Any = None, **kwargs: Any) -> Any:
            hidden_states = self.embedding_hidden_mapping_in(hidden_states)
            for layer in self.layers:
                hidden_states = layer(hidden_states, attention_mask, **kwargs)
            return BaseModelOutput(last_hidden_state=hidden_states)  # type: ignore[arg-type,unused-ignore]

    torch.manual_seed(0)
    reference = transformers.AlbertModel(config).eval()
    candidate = copy.deepcopy(reference)
    candidate.encoder = PortEncoder(reference.encoder)
    if bug:
        with torch.no_grad():
            candidate.encoder.layers[2].albert_layers[0].ffn.bias.add_(0.05)
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    return reference, candidate, ids


def test_a_shared_layer_group_against_one_copy_per_layer_names_the_copy_that_differs(settings: Settings) -> None:
    """Before: the first divergence was the encoder's output, culprit the encoder, every layer's tensors unpaired
    (`albert_layer_groups.0#3...` against `layers.2...`). Now the group's third call pairs with the third copy, by a
    rule the answer says: the FFN of that call is the first divergence and the culprit, its bias named."""
    reference, candidate, ids = _albert(bug=True)
    found = find_divergence(reference, candidate, (ids,), session="albert", data_dir=settings.data_dir)
    ffn = "AlbertModel.encoder.albert_layer_groups.0.albert_layers.0.ffn#3"
    assert found.first is not None and found.first.reference == f"{ffn}/linear#1_outputs", repr(found)
    assert found.first.candidate == "AlbertModel.encoder.layers.2.albert_layers.0.ffn/linear#1_outputs", repr(found)
    assert found.culprits == [ffn], repr(found)
    assert found.unpaired == (0, 0), repr(found)
    assert "paired by a rule, not by name: the k-th call of the reference's encoder.albert_layer_groups.0" in repr(
        found
    )
    assert found.state is not None and [d.name for d in found.state[2]] == ["bias"], repr(found)


def test_a_shared_layer_group_against_copies_of_the_same_maths_pairs_every_tensor(settings: Settings) -> None:
    """Before: "no difference found" in 38 pairs, every layer's tensors of both sides unpaired. Now all pair."""
    reference, candidate, ids = _albert(bug=False)
    found = find_divergence(reference, candidate, (ids,), session="albert", data_dir=settings.data_dir)
    assert found.first is None and found.unpaired == (0, 0), repr(found)
    assert found.shared_calls, repr(found)


def _names(path: str, calls: int, copies: bool) -> list[str]:
    """A stack's tensors' names (without the model's class name): `calls` calls of one block at `path` (or, with
    `copies`, one call of each copy `path.k`), each a linear and a norm called twice."""
    names = []
    for k in range(calls):
        block = f"{path}.{k}" if copies else f"{path}{f'#{k + 1}' if k else ''}"
        lin = f"{path}.{k}.lin" if copies else f"{path}.lin{f'#{k + 1}' if k else ''}"
        norms = (
            [f"{path}.{k}.norm" + ("#2" if j else "") for j in range(2)]
            if copies
            else [f"{path}.norm" + (f"#{2 * k + j + 1}" if 2 * k + j else "") for j in range(2)]
        )
        names += [f"{block}_inputs_args_0", f"{lin}/linear#1_outputs", *(f"{n}_outputs" for n in norms)]
        names.append(f"{block}_outputs")
    return [".stack.embed_outputs", *names, "/mul#1_outputs"]


def test_shared_calls_reads_each_copy_as_its_call_of_the_shared_module() -> None:
    """The k-th copy's names as the k-th call's, a submodule called twice per copy counted across the copies."""
    reference = _names(".stack.group", 3, copies=False)
    candidate = _names(".stack.layers", 3, copies=True)
    renamed, rules = shared_calls(reference, candidate)
    assert rules == [SharedCalls("stack.group", "stack.layers", 3)]
    assert renamed[".stack.layers.2.norm#2_outputs"] == ".stack.group.norm#6_outputs"
    assert renamed[".stack.layers.1_outputs"] == ".stack.group#2_outputs"
    assert renamed[".stack.layers.0.lin/linear#1_outputs"] == ".stack.group.lin/linear#1_outputs"
    assert sorted(renamed.values()) == sorted(n for n in reference if n.startswith(".stack.group"))


def test_shared_calls_pairs_nothing_where_the_copies_are_not_called_in_order() -> None:
    """Copies called 0, 2, 1: the k-th call need not be the k-th copy's, so no rule applies and nothing pairs."""
    reference = _names(".stack.group", 3, copies=False)
    candidate = _names(".stack.layers", 3, copies=True)
    blocks = [candidate[1:6], candidate[6:11], candidate[11:16]]
    reordered = [candidate[0], *blocks[0], *blocks[2], *blocks[1], candidate[-1]]
    assert shared_calls(reference, reordered) == ({}, [])
    assert shared_calls(reference, candidate[:-6] + candidate[-1:]) == ({}, [])  # two copies for three calls
