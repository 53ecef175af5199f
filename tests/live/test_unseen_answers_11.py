"""Answers on models and planted bugs no earlier round built (bench/RESULTS.md, "answers on unseen models, round
11"): the four that were wrong or said too little and are now fixed, and two right ones no earlier round guards.
Fixed: a culprit named on a module whose inputs agreed only within tolerance, where its outputs differed because
they did (an RMSNorm computed in bfloat16, then a linear layer); a buffer of one name and another shape left unsaid
(GLM-4's `inv_freq` made for the whole head, its partial rotary factor ignored); the port's norms called before the
rotary, where the reference calls them after, unnamed because the rotary's cosines, paired and equal, lay between
(HunYuan's QK-norm); a key/value cache given the keys before their rotary, named as the decode step's input with no
word of what it held."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import torch
from tensor_debugger import capture, find_divergence
from tensor_debugger.settings import Settings
from torch import nn

from tests.support.model_ports import Port, config_of, jittered_pair, port_writer
from tests.support.sessions import compared as _session_report  # planned, computed, reported
from tests.support.source_lines import marked_line

HERE = Path(__file__)
D = 16
IDS = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))

line_of = partial(marked_line, HERE)


@pytest.fixture(scope="module")
def ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str, str, str, str], Port]]:
    with port_writer(tmp_path_factory.mktemp("ports")) as write:
        yield lambda family, tag, old, new: write(family, f"port11_{family}_{tag}", old, new)


SMALL = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 1,
}


class Norm(nn.Module):
    """RMSNorm; the port squares and averages in its input's dtype (bfloat16), not in float32."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D) + 0.1 * torch.randn(D))
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x if self.port else x.float()  # upcast
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)  # squares
        return self.weight * h.to(x.dtype)


class Normed(nn.Module):
    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(D, D)
        self.norm = Norm(port)
        self.b = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.b(self.norm(self.a(x)))
        return out


def test_a_norm_in_bfloat16_grown_past_tolerance_by_the_next_layer_names_no_culprit_there(settings: Settings) -> None:
    """Wrong before: both models bfloat16, the port's norm squaring in bfloat16 (within bfloat16's tolerance at the
    norm's output), the next linear layer's output outside it: "Culprit: Normed.b (its inputs agree, its outputs do
    not)", a module both sides hold alike. Now the candidate's `b`, called on the reference's inputs to it, gives
    the reference's outputs, so no culprit is named on it, and the answer says why and where values began to
    differ: the reference's upcast, which the port lacks, and the first tensor that differs at all."""
    reference, candidate = Normed(False).bfloat16().eval(), Normed(True).bfloat16().eval()
    x = torch.randn(4, 8, D, generator=torch.Generator().manual_seed(2)).bfloat16() * 3
    found = find_divergence(reference, candidate, (x,), session="rms", data_dir=settings.data_dir)
    first = found.first
    assert first is not None and first.reference == "Normed.b/linear#1_outputs", repr(found)
    assert found.culprits == [] and found.grown == ("Normed.b",), repr(found)
    words = repr(found)
    assert "No culprit is named on Normed.b: its inputs agree within tolerance but not bit for bit" in words
    assert first.unmatched_before == ("Normed.norm/float#1_outputs",), words
    assert first.unmatched_before_sources == (line_of("upcast"),), words
    assert first.first_changed == ("Normed.norm/pow#1_outputs", line_of("squares")), words


def test_glm4_partial_rotary_factor_ignored_names_the_buffer_of_another_shape(
    settings: Settings, ports: Callable[..., Port]
) -> None:
    """Said too little: the rotary's output of another shape was named, the rotary the culprit, but not why: the
    port's `inv_freq` (a buffer made in `__init__`, not in the state dict, so no load refused it) is made for the
    whole head. Buffers of one name and another shape were passed over; now they are said with both shapes."""
    port = ports("glm4", "prf", "        dim = int(head_dim * partial_rotary_factor)\n", "        dim = head_dim\n")
    reference, candidate = jittered_pair(port, "Glm4ForCausalLM", config_of("Glm4Config", **SMALL))
    found = find_divergence(reference, candidate, {"input_ids": IDS}, session="glm4", data_dir=settings.data_dir)
    first = found.first
    assert first is not None and first.reference == "Glm4ForCausalLM.model.rotary_emb_outputs_0", repr(found)
    assert found.culprits == ["Glm4ForCausalLM.model.rotary_emb"], repr(found)
    assert found.state is not None, repr(found)
    said = {d.name: (d.shape, d.other_shape) for d in found.state[2]}
    assert said["inv_freq"] == ((2,), (4,)), said
    assert "inv_freq (a buffer of shape [2], [4] in the candidate)" in repr(found)


def test_hunyuan_qk_norm_before_the_rotary_names_the_ports_norm_calls(
    settings: Settings, ports: Callable[..., Port]
) -> None:
    """Said too little: the first divergence (the rotary's `q * cos`, at the same line on both sides) was right,
    but the port's norms, called before the rotary where HunYuan calls them after, went unnamed: the rotary's
    `unsqueeze` of its cosines, paired and equal, lay between them and it. Now paired tensors that agree inside the
    op's own module call are passed over, and the norms' calls are named as run where the reference does not."""
    rotary = "        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)\n"
    norms = (
        "        query_states = self.query_layernorm(query_states)\n"
        "        key_states = self.key_layernorm(key_states)\n"
    )
    port = ports("hunyuan_v1_dense", "qk", rotary + norms, norms + rotary)
    reference, candidate = jittered_pair(port, "HunYuanDenseV1ForCausalLM", config_of("HunYuanDenseV1Config", **SMALL))
    found = find_divergence(reference, candidate, {"input_ids": IDS}, session="hunyuan", data_dir=settings.data_dir)
    first = found.first
    attention = "HunYuanDenseV1ForCausalLM.model.layers.0.self_attn"
    assert first is not None and first.reference == f"{attention}/mul#1_outputs", repr(found)
    turned = port.lines("q_embed = (q * cos) + (rotate_half(q) * sin)")
    assert (first.reference_source, first.candidate_source) == turned, repr(found)
    early = {name: at for name, at, _ in first.candidate_early_before}
    for norm in ("query_layernorm", "key_layernorm"):
        assert early[f"{attention}.{norm}_outputs"] == port.lines(f"self.{norm}(")[1], early
    assert "which pair by name with tensors the reference records only after it" in repr(found)
    assert found.culprits == [attention], repr(found)


class Rotary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv", 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D)), persistent=False)
        self.inv: torch.Tensor

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = positions[:, None].float() * self.inv[None]
        angles = torch.cat([angles, angles], -1)
        x1, x2 = x.chunk(2, -1)
        return x * angles.cos() + torch.cat([-x2, x1], -1) * angles.sin()


class Cached(nn.Module):
    """Attention probabilities over a key cache; the port keeps its keys before their rotary and turns the whole
    cache at the new token's position: right at the prefill, wrong at the decode step."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        self.qk = nn.Linear(D, 2 * D)
        self.rot = Rotary()
        self.port = port

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor]) -> torch.Tensor:
        q, k = self.qk(x).chunk(2, -1)
        start = cache[0].shape[1] if cache else 0
        positions = torch.arange(start, start + x.shape[1])
        q = self.rot(q, positions)
        if self.port:
            k = torch.cat([cache[0], k], 1) if cache else k
            cache[:] = [k]
            k = self.rot(k, positions)
        else:
            k = self.rot(k, positions)  # keys turned
            k = torch.cat([cache[0], k], 1) if cache else k
            cache[:] = [k]
        t, n = x.shape[1], k.shape[1]
        scores: torch.Tensor = q @ k.transpose(-1, -2) / math.sqrt(D)
        future = torch.arange(n)[None] > torch.arange(t)[:, None] + n - t
        return scores.masked_fill(future, float("-inf")).softmax(-1)


class Decode(nn.Module):
    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(64, D)
        self.attn = Cached(port)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cache: list[torch.Tensor] = []
        prefill = self.attn(self.embed(ids[:, :-1]), cache)
        step = self.attn(self.embed(ids[:, -1:]), cache)  # decode step
        return prefill, step


def test_a_cache_given_keys_before_their_rotary_names_what_it_holds(settings: Settings) -> None:
    """Said too little: the first divergence, the cache passed to the decode step, was right (every op of the
    prefill agrees), but nothing said what the port's cache held. Now the answer names the reference's tensor
    recorded before it that holds the same bytes: the keys as the rotary was given them, at the line that turns
    them, the step the port's cache skipped."""
    found = find_divergence(
        Decode(False).eval(), Decode(True).eval(), (IDS,), session="cache", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None and first.reference == "Decode.attn#2_inputs_args_1_0", repr(found)
    assert first.reference_source == first.candidate_source == line_of("decode step"), repr(found)
    assert first.candidate_holds == ("Decode.attn.rot#2_inputs_args_0", line_of("keys turned")), repr(found)
    assert "holds, bit for bit, what the reference's Decode.attn.rot#2_inputs_args_0" in repr(found)


def test_gpt_oss_attention_sinks_dropped_names_the_sinks_concatenation(
    settings: Settings, ports: Callable[..., Port]
) -> None:
    """Right (no earlier round had attention sinks): the port softmaxes the scores without GPT-OSS's sink column;
    the first divergence is the logits' max at the same line on both sides, and the reference's `cat` of the sinks,
    paired with none of the port's, is named with its line, in find_divergence's answer and in the session's."""
    import transformers.models

    source = Path(transformers.models.__file__).parent / "gpt_oss" / "modeling_gpt_oss.py"
    if not source.exists():
        pytest.skip(f"transformers {transformers.__version__} has no GPT-OSS")
    text = source.read_text(encoding="utf-8")
    begin = text.find("    combined_logits = torch.cat([attn_weights, sinks], dim=-1)\n")
    end = text.find("    scores = probs[..., :-1]  # we drop the sink here\n")
    if begin < 0 or end < begin:
        pytest.skip(f"transformers {transformers.__version__}'s GPT-OSS attention is another")
    old = text[begin:end] + "    scores = probs[..., :-1]  # we drop the sink here\n"
    new = old.replace("torch.cat([attn_weights, sinks], dim=-1)", "attn_weights").replace("probs[..., :-1]", "probs")
    port = ports("gpt_oss", "sinks", old, new)
    config = config_of(
        "GptOssConfig",
        **{**SMALL, "hidden_size": 16, "intermediate_size": 16, "head_dim": 4},
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
    )
    reference, candidate = jittered_pair(port, "GptOssForCausalLM", config)
    found = find_divergence(reference, candidate, {"input_ids": IDS}, session="sinks", data_dir=settings.data_dir)
    first = found.first
    attention = "GptOssForCausalLM.model.layers.0.self_attn"
    assert first is not None and first.reference == f"{attention}/max#1_outputs_0", repr(found)
    assert (first.reference_source, first.candidate_source) == port.lines("combined_logits.max(dim=-1"), repr(found)
    sinks = port.lines("torch.cat([attn_weights, sinks], dim=-1)", "combined_logits = attn_weights")[0]
    assert first.reference_only_before == ((f"{attention}/cat#5_outputs", sinks),), repr(found)
    assert found.culprits == [attention], repr(found)
    in_session = _session_report(settings, "sinks").first_divergence
    assert in_session is not None and in_session.name == first.reference, in_session


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(D, D)
        self.b = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.b(torch.nn.functional.gelu(self.a(x)).softmax(-1))
        return out


def test_the_same_model_under_no_grad_and_inference_mode_is_no_divergence(settings: Settings) -> None:
    """Right (no earlier round ran one side under `torch.inference_mode`): two summary op captures of one model,
    the reference's under `torch.no_grad()`, the candidate's under `torch.inference_mode()`: the session names no
    first divergence (inference tensors are summarised and hashed as any other)."""
    model, x = Small().eval(), torch.randn(3, D, generator=torch.Generator().manual_seed(4))
    for run, mode in (("reference", torch.no_grad), ("candidate", torch.inference_mode)):
        with mode(), capture(model, "modes", run, data_dir=settings.data_dir, level="op", values="summary"):
            model(x)
    report = _session_report(settings, "modes")
    assert report.first_divergence is None, report.first_divergence
    assert len(report.pairs) > 5, report.pairs
