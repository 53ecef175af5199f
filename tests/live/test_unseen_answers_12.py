"""Answers on models and planted bugs no earlier round built (bench/RESULTS.md, "answers on unseen models, round
12"): the cause that was wrong and is now fixed (three cases, and the replay's count that the fix needed), and two
right ones no earlier round guards.

Fixed: one module object placed in several slots (weights shared across layers, `nn.ModuleList([block, block])`;
an embedding both the encoder's and the decoder's) had every call named by its first name (`layers.0`,
`layers.0#2`), so against a port holding one copy per slot nothing after the first call paired: a bug in the
second copy was named at the next module's input, with no culprit. Each call is now named by its slot.

Fixed after review: the slot was chosen under the innermost recorded call, so with `modules=` (find_divergence's
second pass) T5's decoder's embedding was stored as the encoder's; and a loop calling each slot twice took the
slots in turn, so the same maths diverged. Now every module's calls are followed, and a list's turns are counted
apart for each place calling it."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tensor_debugger import find_divergence
from tensor_debugger.live.own_error import Arguments, kept_arguments
from tensor_debugger.live.recorder import record
from tensor_debugger.settings import Settings
from torch import nn

from tests.support.source_lines import marked_line

HERE = Path(__file__)
D = 16
K = 3

line_of = partial(marked_line, HERE)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.lin(x))  # block


class Stack(nn.Module):
    """Two layers and a head; `tied`: one block in both slots (weights shared across layers)."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        block = Block()
        self.layers = nn.ModuleList([block, block] if tied else [block, Block()])
        self.head = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        out: torch.Tensor = self.head(x)
        return out


class EncoderDecoder(nn.Module):
    """An encoder and a decoder, each embedding its ids, the decoder called first; `tied`: one embedding, both's
    (listed by `named_modules` under the encoder's name)."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Sequential(nn.Embedding(32, D), nn.Linear(D, D))
        self.decoder = nn.Sequential(self.encoder[0] if tied else nn.Embedding(32, D), nn.Linear(D, D))

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        decoded = self.decoder(target)
        out: torch.Tensor = self.encoder(source).mean(1, keepdim=True) + decoded
        return out


def _stack() -> tuple[nn.Module, nn.Module, tuple[Any, ...], str]:
    x = torch.randn(3, D, generator=torch.Generator().manual_seed(2))
    return Stack(True).eval(), Stack(False).eval(), (x,), "layers.1.lin"


def _encoder_decoder() -> tuple[nn.Module, nn.Module, tuple[Any, ...], str]:
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 32, (2, 5), generator=g), torch.randint(0, 32, (2, 4), generator=g)
    return EncoderDecoder(True).eval(), EncoderDecoder(False).eval(), ids, "decoder.0"


@pytest.mark.parametrize("build", [_stack, _encoder_decoder], ids=["list slots", "encoder and decoder"])
def test_a_module_in_two_slots_against_one_copy_per_slot_pairs_each_call_with_its_slot(
    settings: Settings, build: Any
) -> None:
    """Wrong before: the reference's shared module's second call was named by its first name (`layers.0#2`,
    `encoder.0#2`), the port's copy by its slot (`layers.1`, `decoder.0`): nothing of that call paired, and the
    first divergence was a later module's input, with no culprit. Now each call is named by its slot: by the module
    being called around it (the decoder's, called first here) or, among the slots of one list, in turn."""
    reference, candidate, inputs, slot = build()
    candidate.load_state_dict(reference.state_dict())  # a shared module's tensors are listed under each name
    with torch.no_grad():  # the port's copy of the second slot is wrong
        candidate.get_submodule(slot).weight.add_(0.05)
    root = type(reference).__name__
    found = find_divergence(reference, candidate, inputs, session="slots", data_dir=settings.data_dir)
    first = found.first
    op = "linear" if slot.endswith("lin") else "embedding"
    assert first is not None and first.reference == first.candidate == f"{root}.{slot}/{op}#1_outputs", repr(found)
    assert found.culprits == [f"{root}.{slot}"], repr(found)
    assert found.unpaired == (0, 0), repr(found)


def test_the_same_maths_tied_and_untied_pairs_every_tensor(settings: Settings) -> None:
    """Said too little before: one block in both slots against two copies of it gave "no difference", with 7
    tensors of each side unpaired (the second layer's, never compared). Now every tensor pairs."""
    reference, candidate = Stack(True).eval(), Stack(False).eval()
    candidate.load_state_dict(reference.state_dict())
    found = find_divergence(reference, candidate, (torch.randn(3, D),), session="same", data_dir=settings.data_dir)
    assert found.first is None and found.unpaired == (0, 0), repr(found)
    assert found.compared == 19, repr(found)


class Swish(torch.autograd.Function):
    """x * sigmoid(beta * x); the port's forward forgets beta."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, beta: float, port: bool) -> torch.Tensor:
        ctx.save_for_backward(x)
        if port:
            return x * torch.sigmoid(x)  # ungated
        return x * torch.sigmoid(beta * x)  # gated by beta

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * (s + x * s * (1 - s)), None, None


class FunctionMLP(nn.Module):
    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(D, 2 * D)
        self.down = nn.Linear(2 * D, D)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = Swish.apply(self.up(x), 1.7, self.port)  # type: ignore[no-untyped-call]
        out: torch.Tensor = self.down(h)
        return out


def test_a_bug_inside_a_custom_autograd_functions_forward_is_named_at_its_line(settings: Settings) -> None:
    """Right (no earlier round put the bug in a `torch.autograd.Function`'s forward): the ops it calls are
    recorded, each at its own line, and the reference's `beta * x`, which the port lacks, is named."""
    x = torch.randn(3, D, generator=torch.Generator().manual_seed(2))
    found = find_divergence(
        FunctionMLP(False).eval(), FunctionMLP(True).eval(), (x,), session="fn", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None and first.reference == "FunctionMLP/sigmoid#1_outputs", repr(found)
    assert (first.reference_source, first.candidate_source) == (line_of("gated by beta"), line_of("ungated")), repr(
        found
    )
    assert first.reference_only_before == (("FunctionMLP/mul#1_outputs", line_of("gated by beta")),), repr(found)


class StreamConv(nn.Module):
    """A depthwise causal convolution over a stream: a prefill, then two steps over a rolling state of the last K
    inputs; the port writes each new input into the state without rolling it first."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Parameter(torch.randn(D, K))
        self.port = port

    def step(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.port:
            state = state.roll(-1, -1)  # roll
        state[..., -1] = x[:, 0]
        return (state * self.w).sum(-1)[:, None], state  # step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        padded = F.pad(x[:, :-2].transpose(1, 2), (K - 1, 0))
        y = F.conv1d(padded, self.w[:, None, :], groups=D).transpose(1, 2)
        state = padded[..., -K:].clone()
        y1, state = self.step(x[:, -2:-1], state)
        y2, state = self.step(x[:, -1:], state)
        return torch.cat([y, y1, y2], 1)


def test_a_conv_state_not_rolled_names_the_references_roll(settings: Settings) -> None:
    """Right (no earlier round had a rolling convolution state): the prefill agrees, the first step's product
    differs at the same line on both sides, and the reference's `roll`, which the port skips, is named with its
    line as where the divergence may have begun."""
    x = torch.randn(2, 7, D, generator=torch.Generator().manual_seed(2))
    found = find_divergence(
        StreamConv(False).eval(), StreamConv(True).eval(), (x,), session="conv", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None and first.reference == "StreamConv/mul#1_outputs", repr(found)
    assert first.reference_source == first.candidate_source == line_of("step"), repr(found)
    assert first.unmatched_before == ("StreamConv/roll#1_outputs",), repr(found)
    assert first.unmatched_before_sources == (line_of("roll"),), repr(found)


def test_a_replay_keeps_the_arguments_of_the_slot_named() -> None:
    """Wrong with the slots named alone: the replay of a module call (`own_error.kept_arguments`, which a culprit
    whose inputs agree only within tolerance is called again on) counted the calls of `layers.1`, the block's
    second slot, on the block object, so it kept the arguments of its first call (`layers.0`'s). Now it counts
    them by slot, as the capture names them."""
    model, x = Stack(True).eval(), torch.randn(3, D, generator=torch.Generator().manual_seed(2))
    with kept_arguments(model, ["Stack.layers.1", "Stack.layers.0"]) as kept:
        model(x)
    second, first = kept["Stack.layers.1"], kept["Stack.layers.0"]
    assert isinstance(second, Arguments) and isinstance(first, Arguments), kept
    torch.testing.assert_close(first.args[0], x, rtol=0, atol=0)
    torch.testing.assert_close(second.args[0], model.layers[0](x), rtol=0, atol=0)


class SharedEmbedding(nn.Module):
    """T5's layout: one embedding that is `shared`, the encoder's `embed_tokens` and the decoder's (listed by
    `named_modules` under `shared`), called inside the encoder and inside the decoder."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.shared = nn.Embedding(32, D)
        self.encoder = Embedder(self.shared)
        self.decoder = Embedder(self.shared)

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder(source), self.decoder(target)


class Embedder(nn.Module):
    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embedding

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.embed_tokens(ids) * 2
        return out


def test_a_shared_modules_slot_is_its_callers_where_modules_leave_the_caller_unrecorded() -> None:
    """Wrong before: with `modules=` (find_divergence's second pass records with it) the modules not asked for had no
    hooks, so the slot of a shared module's call was chosen under the innermost recorded call, the model's, in turn:
    the encoder's call was named `shared`, not recorded, and the decoder's stored as the encoder's `embed_tokens`.
    Now every module's calls are followed, and each call is named by the module calling it."""
    model = SharedEmbedding().eval()
    source, target = torch.tensor([[1, 2, 3]]), torch.tensor([[7, 8]])
    named = {}
    for modules in ([], ["*embed_tokens*"], ["decoder*"]):
        with torch.no_grad(), record(model, level="module", modules=modules) as held:
            model(source, target)
        named[tuple(modules)] = {k: v for k, v in held.tensors.items() if "embed_tokens" in k or "shared" in k}
    encoder, decoder = "SharedEmbedding.encoder.embed_tokens", "SharedEmbedding.decoder.embed_tokens"
    for modules in ([], ["*embed_tokens*"]):
        tensors = named[tuple(modules)]
        assert sorted(tensors) == sorted(f"{m}_{t}" for m in (encoder, decoder) for t in ("inputs_args_0", "outputs"))
        torch.testing.assert_close(tensors[f"{encoder}_inputs_args_0"], source, rtol=0, atol=0)
        torch.testing.assert_close(tensors[f"{decoder}_inputs_args_0"], target, rtol=0, atol=0)
        torch.testing.assert_close(tensors[f"{decoder}_outputs"], model.shared(target), rtol=0, atol=0)
    assert sorted(named[("decoder*",)]) == [f"{decoder}_inputs_args_0", f"{decoder}_outputs"]
    torch.testing.assert_close(named[("decoder*",)][f"{decoder}_inputs_args_0"], target, rtol=0, atol=0)


class Twice(nn.Module):
    """Two slots, each called twice in a row (`x = block(block(x))`); `tied`: one block in both slots."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        block = Block()
        self.blocks = nn.ModuleList([block, block] if tied else [block, Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(block(x))
        return x


def test_a_shared_module_called_twice_per_slot_names_each_call_by_its_slot(settings: Settings) -> None:
    """Wrong before: the calls of one block in both slots were given the slots in turn (`blocks.0`, `blocks.1`,
    `blocks.0#2`, `blocks.1#2`) while each slot is called twice in a row, as the port with a copy per slot names
    them (`blocks.0`, `blocks.0#2`, `blocks.1`, `blocks.1#2`): the same maths diverged at `blocks.1`. Now the turns
    are counted apart for each place calling the block (the inner call and the outer one), and every tensor pairs;
    the replay keeps the arguments of the call of that name."""
    reference, candidate = Twice(True).eval(), Twice(False).eval()
    candidate.load_state_dict(reference.state_dict())
    x = torch.randn(3, D, generator=torch.Generator().manual_seed(2))
    found = find_divergence(reference, candidate, (x,), session="twice", data_dir=settings.data_dir)
    assert found.first is None and found.unpaired == (0, 0), repr(found)
    block = reference.blocks[0]
    with torch.no_grad():
        inputs = {"Twice.blocks.0#2": block(x), "Twice.blocks.1": block(block(x))}
    with torch.no_grad(), kept_arguments(reference, list(inputs)) as kept:
        reference(x)
    for call, expected in inputs.items():
        arguments = kept[call]
        assert isinstance(arguments, Arguments), kept
        torch.testing.assert_close(arguments.args[0], expected, rtol=0, atol=0)


class Named(nn.Module):
    """One block under two attributes, each called by name; `tied`: the same block."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = Block()
        self.second = self.first if tied else Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.first(x)
        out: torch.Tensor = self.second(hidden)
        return out


def test_a_shared_module_under_two_attributes_takes_them_in_turn_from_two_places() -> None:
    """Guards the turns of slots that are attributes: called one by one from places of their own, they are not
    counted apart by place (a list's slots are), or the second call would be named `first#2`, unpaired against a
    port's `second`."""
    tied, untied = Named(True).eval(), Named(False).eval()
    untied.load_state_dict(tied.state_dict())
    x = torch.randn(3, D, generator=torch.Generator().manual_seed(2))
    runs = []
    for model in (tied, untied):
        with torch.no_grad(), record(model, level="module") as held:
            model(x)
        runs.append({k: v for k, v in held.tensors.items() if k.endswith("_outputs")})
    assert (
        list(runs[0])
        == list(runs[1])
        == [
            "Named.first.lin_outputs",
            "Named.first_outputs",
            "Named.second.lin_outputs",
            "Named.second_outputs",
            "Named_outputs",
        ]
    ), runs
    for name, value in runs[0].items():
        torch.testing.assert_close(value, runs[1][name], rtol=0, atol=0)
