"""`capture(backward=True)` of a model with activation checkpointing (`torch.utils.checkpoint`, use_reentrant True
and False): the backward pass runs the checkpointed modules' forward again to make the activations it did not keep.
Those calls are recomputation, not calls of the model: they are said in a note on the run, not recorded as
`{module}#2`, so a checkpointed reference pairs with a port that does not checkpoint call for call, op for op, and
their gradients still compare."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensor_debugger import capture
from tensor_debugger.settings import Settings
from torch import nn
from torch.utils.checkpoint import checkpoint

from tests.support.backward_models import Tiny
from tests.support.sessions import compared, names_and_notes
from tests.support.traces import tiny_llama


class Checkpointed(nn.Module):
    """`Tiny`'s modules, each of up and act run under `torch.utils.checkpoint` (as a block of a large model is)."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        tiny = Tiny()
        self.up, self.act, self.down = tiny.up, tiny.act, tiny.down
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = checkpoint(self.up, x, use_reentrant=self.reentrant)
        hidden = checkpoint(self.act, hidden, use_reentrant=self.reentrant)
        out: torch.Tensor = self.down(hidden)
        return out


def again(name: str) -> bool:
    """Whether a tensor is of a module's second (third...) call: `Net.up#2_outputs`, `Net.up#2/linear#1_outputs`
    (not the second call of an op inside one module call, `Net.up/getitem#2_outputs`)."""
    return "#" in name.partition("/")[0]


def train_step(model: nn.Module, session: str, run: str, settings: Settings, level: Any, x: Any) -> None:
    with capture(model, session, run, data_dir=settings.data_dir, backward=True, level=level, workers=1):
        out = model(**x) if isinstance(x, dict) else model(x)
        (out.logits if hasattr(out, "logits") else out).pow(2).mean().backward()


@pytest.mark.parametrize("reentrant", [True, False], ids=["use_reentrant=True", "use_reentrant=False"])
@pytest.mark.parametrize("level", ["module", "op"])
def test_a_checkpointed_reference_pairs_call_for_call_and_its_wrong_gradient_is_found(
    settings: Settings, reentrant: bool, level: str
) -> None:
    """The reference checkpoints up and act; the port does not, and its act's backward is 1% off. The forward
    pairs one to one (no `#2`, nothing unmatched) and passes; the first divergence is act's input gradient."""
    # needing grad: the reentrant checkpoint gives up's weight no gradient otherwise
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1)).requires_grad_()
    train_step(Checkpointed(reentrant), "ckpt", "reference", settings, level, x)
    train_step(Tiny(factor=1.01), "ckpt", "candidate", settings, level, x)
    names, notes = names_and_notes(settings, "ckpt", "reference")
    assert not any(again(n) for n in names), names
    recomputed = [n for n in notes if "activation checkpointing's recomputation" in n]
    ran_again = "2 calls of Checkpointed.act, Checkpointed.up (with the modules inside) ran again"  # backward order
    assert recomputed and recomputed[0].startswith(ran_again), notes
    candidate, candidate_notes = names_and_notes(settings, "ckpt", "candidate")
    ported = [n.replace("Tiny", "Checkpointed") for n in candidate]
    assert [n for n in ported if "/grad" not in n] == [n for n in names if "/grad" not in n]
    assert sorted(ported) == sorted(names)  # the gradients too (in the order each backward computed them)
    assert not any("recomputation" in n for n in candidate_notes)
    report = compared(settings, "ckpt")
    assert report.unmatched == [], [u.name for u in report.unmatched]
    forward = [p for p in report.pairs if "/grad" not in p.name]
    assert forward and all(p.status == "pass" for p in forward), [(p.name, p.status) for p in forward]
    grads = {p.module_path: p.status for p in report.pairs if "/grad" in p.name}
    assert grads["Checkpointed.act/grad_output"] == "pass" and grads["Checkpointed.up.weight/grad"] == "fail", grads
    first = report.first_divergence
    assert first is not None and first.module_path == "Checkpointed.act/grad_input", first


@pytest.mark.parametrize("reentrant", [True, False], ids=["use_reentrant=True", "use_reentrant=False"])
def test_a_tiny_llama_with_gradient_checkpointing_pairs_with_itself_without(
    settings: Settings, reentrant: bool
) -> None:
    """transformers' own gradient checkpointing (each decoder layer under torch.utils.checkpoint, in training
    mode) against the same model without it: every op and gradient pairs, one to one, and passes."""
    # no cache: transformers turns it off where it checkpoints in training, so the plain model's ops would differ
    ids = {"input_ids": torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(2)), "use_cache": False}
    checkpointed = tiny_llama().train()
    kwargs = {"use_reentrant": reentrant}
    if hasattr(checkpointed, "activation_checkpointing_enable"):  # transformers 5.x's name; 4.x has only the old one
        checkpointed.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        checkpointed.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    # the embeddings' output needs grad (without it the reentrant checkpoint gives the layers' weights none): a hook
    # whose requires_grad_ is an op of each model; transformers 5 registers it as it enables checkpointing, 4.x not
    if not hasattr(checkpointed, "_require_grads_hook"):
        checkpointed.enable_input_require_grads()
    plain = tiny_llama().train()
    plain.enable_input_require_grads()
    train_step(checkpointed, "llama ckpt", "reference", settings, "op", ids)
    train_step(plain, "llama ckpt", "candidate", settings, "op", ids)
    names, notes = names_and_notes(settings, "llama ckpt", "reference")
    assert not any(again(n) for n in names), [n for n in names if again(n)]
    # the outermost modules recomputed: each decoder layer's own modules where transformers checkpoints a layer's
    # forward (5.x), the layers where it checkpoints their call; layer 1's first (the backward's order)
    said = [n for n in notes if "ran again during the backward pass (activation checkpointing's recomputation)" in n]
    assert len(said) == 1 and said[0].index("model.layers.1") < said[0].index("model.layers.0"), notes
    plain_names = names_and_notes(settings, "llama ckpt", "candidate")[0]
    assert [n for n in names if "/grad" not in n] == [n for n in plain_names if "/grad" not in n]
    assert sorted(names) == sorted(plain_names)  # the gradients too, each backward in its own order
    report = compared(settings, "llama ckpt")
    assert report.unmatched == [], [u.name for u in report.unmatched]
    grads = [p for p in report.pairs if "/grad" in p.name]
    assert len(grads) > 20 and "LlamaForCausalLM.model.layers.0.self_attn.q_proj.weight/grad" in {
        p.module_path for p in grads
    }
    failing = [(p.name, p.status) for p in report.pairs if p.status != "pass"]
    assert not failing and report.first_divergence is None, failing


class Head(nn.Module):
    """A body and a head; the user calls the head directly after the forward, as code that reuses a model's
    `lm_head` on hidden states of its own does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body, self.head = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.body(x))
        return out


@pytest.mark.parametrize("level", ["module", "op"])
def test_a_submodule_called_by_the_user_after_the_forward_is_recorded_as_its_own_call(
    settings: Settings, level: str
) -> None:
    """`model.head(h)` after `model(x)`, in the same capture block, with no backward pass running: a call of the
    user's, recorded as `Head.head#2` (its inputs, outputs and ops), not taken for a recomputation (it was, being a
    call inside the model while no call of the model is under way, after one was)."""
    model, x = Head().eval(), torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), capture(model, "direct", "reference", data_dir=settings.data_dir, level=level, workers=1):
        model(x)
        model.head(torch.ones(2, 6))
    names, notes = names_and_notes(settings, "direct", "reference")
    assert "Head.head#2_inputs_args_0" in names and "Head.head#2_outputs" in names, names
    if level == "op":
        assert "Head.head#2/linear#1_outputs" in names, names
    assert not any("recomputation" in n for n in notes), notes


@pytest.mark.parametrize("reentrant", [True, False], ids=["use_reentrant=True", "use_reentrant=False"])
def test_a_direct_call_and_a_recomputation_in_one_block_are_told_apart(settings: Settings, reentrant: bool) -> None:
    """A checkpointed model's forward, then the user's own call of its `down`, then the backward pass: `down`'s
    call is recorded (`Checkpointed.down#2`), up's and act's recomputation is not, and is said."""
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1)).requires_grad_()
    model = Checkpointed(reentrant)
    with capture(model, "both", "reference", data_dir=settings.data_dir, backward=True, level="op", workers=1):
        out = model(x)
        model.down(torch.ones(2, model.down.in_features))
        out.pow(2).mean().backward()
    names, notes = names_and_notes(settings, "both", "reference")
    assert "Checkpointed.down#2_outputs" in names and "Checkpointed.down#2/linear#1_outputs" in names, names
    assert [n for n in names if again(n) and not n.startswith("Checkpointed.down#2")] == [], names
    recomputed = [n for n in notes if "activation checkpointing's recomputation" in n]
    assert recomputed and recomputed[0].startswith("2 calls of Checkpointed.act, Checkpointed.up"), notes
