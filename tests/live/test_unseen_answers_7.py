"""`find_divergence`'s answers on models and planted bugs no earlier round built (bench/RESULTS.md, "answers on
unseen models, round 7"): hand-written blocks and their ports in one case table, transformers models (tiny random
configs, no download) against a copy of their own `modeling_*.py` with one line changed in another, and the two
answers round 6 left wrong. Each case checks the first diverging op or tensor and the line named on each side; the
tests named after a fix held an answer that was wrong or said too little before it."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the name models use)
from tensor_debugger import find_divergence
from tensor_debugger.settings import Settings
from torch import nn

from tests.support.model_ports import Port, jittered_pair, port_writer
from tests.support.sessions import compared_with_unmatched as compared
from tests.support.source_lines import line_holding, marked_line

HERE = Path(__file__)
D, H = 16, 4
HD = D // H

line_of = partial(marked_line, HERE)  # `path:line` of this file's line ending with the comment `marker`


def rope(positions: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim)
    angles = positions.float()[:, None] * inv[None]
    emb = torch.cat([angles, angles], -1)
    return emb.cos(), emb.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rot = torch.cat([-x[..., HD // 2 :], x[..., : HD // 2]], -1)  # rotate half
    return x * cos + rot * sin


class Window(nn.Module):
    """Sliding-window causal attention (each query sees its last `window` keys); the port's window is one wider."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k = nn.Linear(D, D), nn.Linear(D, D)
        self.window = 4 if port else 3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        i, j = torch.arange(t)[:, None], torch.arange(t)[None]
        keep = (j <= i) & (i - j < self.window)  # window
        s = self.q(x) @ self.k(x).transpose(-1, -2) * D**-0.5
        return cast(torch.Tensor, s.masked_fill(~keep, torch.finfo(s.dtype).min).softmax(-1))


class TinyVarNorm(nn.Module):
    """An RMSNorm on small activations (variance about 1e-6): the port's eps 1e-5 for 1e-6 changes its output."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ff = nn.Linear(D, D)
        self.eps = 1e-5 if port else 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 1e-3
        normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)  # eps
        return cast(torch.Tensor, self.ff(normed))


class Scale(nn.Module):
    """Attention scores scaled by 1/sqrt(d); the port divides by d."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, H, HD).transpose(1, 2) for p in (self.q, self.k, self.v))
        s = q @ k.transpose(-1, -2) / (HD if self.port else math.sqrt(HD))  # scale
        return cast(torch.Tensor, (s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, D))


class KOnly(nn.Module):
    """Rotary applied to queries and keys; the port turns the keys only."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k = nn.Linear(D, D), nn.Linear(D, D)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, H, HD).transpose(1, 2)
        k = self.k(x).view(b, t, H, HD).transpose(1, 2)
        cos, sin = rope(torch.arange(t), HD)
        if not self.port:
            q = rotate(q, cos, sin)
        k = rotate(k, cos, sin)
        return cast(torch.Tensor, (q @ k.transpose(-1, -2)).softmax(-1))  # scores


class SwiGlu(nn.Module):
    """A SwiGLU MLP; the port swaps the gate and the up projections (SiLU of up, times gate)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gate, self.up, self.down = nn.Linear(D, 2 * D), nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.port:
            return cast(torch.Tensor, self.down(F.silu(self.up(x)) * self.gate(x)))  # port swiglu
        return cast(torch.Tensor, self.down(F.silu(self.gate(x)) * self.up(x)))  # swiglu


class Biased(nn.Module):
    """An output projection without a bias; the port's has one (left at its initialisation: a load with
    strict=False)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(D, D)
        self.out = nn.Linear(D, D, bias=port)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.out(F.gelu(self.up(x))))  # projected


class WrongAxis(nn.Module):
    """Activations centred by their mean over features; the port takes it over the sequence (a square input: the
    subtraction broadcasts either way)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ff = nn.Linear(D, D)
        self.dim = 1 if port else -1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ff(x)
        return cast(torch.Tensor, h - h.mean(self.dim, keepdim=True))  # centred


def scaled_gelu(h: torch.Tensor, factor: float) -> torch.Tensor:
    return F.gelu(h) * factor  # helper


class Compiled(nn.Module):
    """An MLP whose activation is a helper function; the port compiles it (torch.compile, eager backend) and calls
    it with 1.1 for 1.0."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.port = port
        self.act = torch.compile(scaled_gelu, backend="eager") if port else scaled_gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.down(self.act(self.up(x), 1.1 if self.port else 1.0)))  # activation


class Conv(nn.Module):
    """Two convolutions; the port computes in channels_last (the same values in another memory layout)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 3, padding=1)
        if port:
            for conv in (self.a, self.b):
                conv.weight.data = conv.weight.data.contiguous(memory_format=torch.channels_last)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.port:
            x = x.contiguous(memory_format=torch.channels_last)
        return cast(torch.Tensor, self.b(F.relu(self.a(x))))


class Autocast(nn.Module):
    """An MLP; the port runs it under a bfloat16 autocast region, and with `bug`, scales its hidden layer by 1.5."""

    def __init__(self, port: bool, bug: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.port, self.bug = port, bug and port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        region = torch.autocast("cpu", dtype=torch.bfloat16) if self.port else contextlib.nullcontext()
        with region:
            h = F.gelu(self.up(x))
            if self.bug:
                h = h * 1.5  # scaled
            return cast(torch.Tensor, self.down(h)).float()  # down


class Attend(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        s = self.q(x) @ self.k(x).transpose(-1, -2) * D**-0.5
        return cast(torch.Tensor, s.masked_fill(~keep[:, None, :], torch.finfo(s.dtype).min).softmax(-1) @ x)


class Keywords(nn.Module):
    """A block calling its attention with positional arguments; the port with keywords (`x=`, `keep=`), and with
    `bug`, the mask of every row taken from row 0."""

    def __init__(self, port: bool, bug: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attn, self.out = Attend(), nn.Linear(D, D)
        self.port, self.bug = port, bug

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        if self.port:
            mask = keep[:1].expand_as(keep) if self.bug else keep  # port mask
            h = self.attn(x=x, keep=mask)  # keywords
        else:
            h = self.attn(x, keep)  # positional
        return cast(torch.Tensor, self.out(h))


class Cached(nn.Module):
    """Attention over a key cache, called twice (a prompt of 4 tokens, then one more): the keys turned by rotary at
    their positions; the port's second call takes its position from the cache's length minus one."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.step = Step(port)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = self.step(x[:, :4], None)
        second = self.step(x[:, 4:], self.step.cache)
        return torch.cat([first, second], 1)


class Step(nn.Module):
    def __init__(self, port: bool) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(D, D), nn.Linear(D, D)
        self.port = port
        self.cache: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, cache: torch.Tensor | None) -> torch.Tensor:
        start = 0 if cache is None else cache.shape[1] - (1 if self.port else 0)
        positions = torch.arange(start, start + x.shape[1])  # positions
        cos, sin = rope(positions, D)
        k = self.k(x)
        k = k * cos + torch.cat([-k[..., D // 2 :], k[..., : D // 2]], -1) * sin  # keys turned
        keys = k if cache is None else torch.cat([cache, k], 1)
        self.cache = keys
        return cast(torch.Tensor, (self.q(x) @ keys.transpose(-1, -2)).softmax(-1) @ keys)


class PostNorm(nn.Module):
    """A pre-norm block; the port normalises after the residual add (post-norm)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm, self.ff = nn.LayerNorm(D), nn.Linear(D, D)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.port:
            return cast(torch.Tensor, self.norm(x + self.ff(x)))  # post-norm
        return cast(torch.Tensor, x + self.ff(self.norm(x)))  # pre-norm


class MaskAfter(nn.Module):
    """Key padding masked before the softmax; the port multiplies the probabilities by the mask after it (rows no
    longer sum to one)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k = nn.Linear(D, D), nn.Linear(D, D)
        self.port = port

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        s = self.q(x) @ self.k(x).transpose(-1, -2) * D**-0.5
        if self.port:
            return cast(torch.Tensor, s.softmax(-1) * keep[:, None, :])  # masked after
        return cast(
            torch.Tensor, s.masked_fill(~keep[:, None, :], torch.finfo(s.dtype).min).softmax(-1)
        )  # masked before


class QueryMask(nn.Module):
    """Key padding mask broadcast over keys ([b, 1, t]); the port broadcasts it over queries ([b, t, 1])."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k = nn.Linear(D, D), nn.Linear(D, D)
        self.port = port

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        s = self.q(x) @ self.k(x).transpose(-1, -2) * D**-0.5
        mask = keep[:, :, None] if self.port else keep[:, None, :]  # mask broadcast
        return cast(torch.Tensor, s.masked_fill(~mask, -1e4).softmax(-1))  # masked


@dataclass(frozen=True)
class Case:
    model: Callable[[bool], nn.Module]
    inputs: Callable[[torch.Generator], Any]
    first: str | None  # the reference's first diverging tensor (None: no divergence)
    lines: tuple[str | None, str | None]  # the markers of the lines named on each side (None: no line)
    culprits: tuple[str, ...] = ()
    before: tuple[str, str] | None = None  # a tensor of the candidate's named before it, and its line's marker
    words: tuple[str, ...] = ()  # words the answer holds
    absent: tuple[str, ...] = field(default_factory=tuple)  # words it must not hold


def _x(g: torch.Generator) -> torch.Tensor:
    return torch.randn(2, 6, D, generator=g)


def _keep(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[0, 4:], keep[1, 3:] = False, False
    return _x(g), keep


CASES = {
    "sliding window one wider": Case(Window, _x, "Window/lt#1_outputs", ("window", "window")),
    "RMSNorm eps 1e-5 for 1e-6 on small activations": Case(
        TinyVarNorm,
        _x,
        "TinyVarNorm/rsqrt#1_outputs",
        ("eps", "eps"),
        words=("differ at all (content hashes) is TinyVarNorm/add#1",),
    ),
    "scores divided by d for sqrt(d)": Case(Scale, _x, "Scale/div#1_outputs", ("scale", "scale")),
    # the helper's first call turns the queries in the reference, the keys in the port: which faces which is not
    # known, and said so (no culprit)
    "rotary on the keys only": Case(
        KOnly, _x, "KOnly/getitem#3_outputs", ("rotate half", "rotate half"), words=("paired by position, ambiguous",)
    ),
    "swiglu gate and up swapped": Case(SwiGlu, _x, "SwiGlu/silu#1_outputs", ("swiglu", "port swiglu")),
    "a bias the reference has not": Case(
        Biased, _x, "Biased.out/linear#1_outputs", ("projected", "projected"), culprits=("Biased.out",)
    ),
    "mean over the sequence for the features": Case(WrongAxis, _x, "WrongAxis/sub#1_outputs", ("centred", "centred")),
    "a compiled helper scaling by 1.1": Case(
        Compiled,
        _x,
        "Compiled/mul#1_outputs",
        ("helper", "helper"),
    ),
    "channels_last (the same values)": Case(Conv, lambda g: torch.randn(2, 3, 6, 6, generator=g), None, (None, None)),
    "a bfloat16 autocast region (rounding only)": Case(
        Autocast, _x, None, (None, None), words=("no divergence beyond the precision floor of bfloat16",)
    ),
    "a bfloat16 autocast region scaling by 1.5": Case(
        partial(Autocast, bug=True),
        _x,
        "Autocast.down_inputs_args_0",
        ("down", "down"),
        before=("Autocast/mul#1_outputs", "scaled"),
        absent=("Culprit: Autocast.up",),
    ),
    "keywords for positional arguments (the same)": Case(
        Keywords, _keep, None, (None, None), absent=("paired with none",)
    ),
    "keywords, every row's mask from row 0": Case(
        partial(Keywords, bug=True),
        _keep,
        "Keywords.attn_inputs_args_1",
        ("positional", "keywords"),
        before=("Keywords/expand_as#1_outputs", "port mask"),
    ),
    "a cached step's position off by one": Case(
        Cached, _x, "Cached.step#2/arange#1_outputs", ("positions", "positions"), culprits=("Cached.step#2",)
    ),
    "post-norm for pre-norm": Case(PostNorm, _x, "PostNorm.norm_inputs_args_0", ("pre-norm", "post-norm")),
    "padding masked after the softmax": Case(
        MaskAfter, _keep, "MaskAfter_outputs", (None, None), before=("MaskAfter/mul#2_outputs", "masked after")
    ),
    "a key mask broadcast over queries": Case(
        QueryMask,
        _keep,
        "QueryMask/masked_fill#1_outputs",
        ("masked", "masked"),
        before=("QueryMask/getitem#1_outputs", "mask broadcast"),
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_a_planted_bug_is_named_at_its_op_and_line(settings: Settings, case: str) -> None:
    c = CASES[case]
    g = torch.Generator().manual_seed(5)
    found = find_divergence(
        c.model(False).eval(), c.model(True).eval(), c.inputs(g), session="case", data_dir=settings.data_dir
    )
    words = repr(found)
    first = found.first
    if c.first is None:
        assert first is None and found.culprits == [], words
        assert "no difference found" in words or "no divergence" in words, words
    else:
        assert first is not None and first.reference == c.first, words
        lines = tuple(line_of(m) if m is not None else None for m in c.lines)
        assert (first.reference_source, first.candidate_source) == lines, first
        assert found.culprits == list(c.culprits), words
        if c.before is not None:
            name, marker = c.before
            assert (name, line_of(marker)) in first.candidate_only_before + first.candidate_unmatched_before, first
    for said in c.words:
        assert said in words, words
    for unsaid in c.absent:
        assert unsaid not in words, words


# --- transformers models against a copy of their own modeling file with one line changed ----------------------------


@pytest.fixture(scope="module")
def ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str, str, str, str], Port]]:
    """Writes `modeling_<family>.py` with `old` replaced by `new` as a port of its own and imports it."""
    with port_writer(tmp_path_factory.mktemp("ports")) as write:
        yield lambda family, tag, old, new: write(family, f"port_{family}_{tag}", old, new)


SMALL: dict[str, Any] = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,  # every bug planted is in layer 0 (a second layer only costs CPU)
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)
IDS = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))


@dataclass(frozen=True)
class Family:
    family: str
    cls: str
    config: Callable[[], Any]  # the tiny config (untyped in transformers 4.53: built when the case runs)
    old: str
    new: str
    first: str  # the reference's first diverging tensor, after the model's class name
    lines: tuple[str, str]  # the text of the line named on each side (the original's, the port's)
    culprits: tuple[str, ...] = ()  # after the model's class name
    inputs: Callable[[], Any] = lambda: {"input_ids": IDS}
    early: str | None = None  # the text of the port's line named as run where the reference does not


def _config(name: str, **kwargs: Any) -> Callable[[], Any]:
    def build() -> Any:
        import transformers

        return getattr(transformers, name)(**kwargs)

    return build


FAMILIES = {
    "StableLM, rotary on the keys only": Family(
        "stablelm",
        "StableLmForCausalLM",
        _config("StableLmConfig", partial_rotary_factor=0.5, **SMALL),
        "query_rot, key_rot = apply_rotary_pos_emb(query_rot, key_rot, cos, sin)",
        "_, key_rot = apply_rotary_pos_emb(query_rot, key_rot, cos, sin)",
        ".model.layers.0.self_attn/cat#3_outputs",
        ("query_states = torch.cat((query_rot, query_pass), dim=-1)",) * 2,
        (".model.layers.0.self_attn",),
    ),
    "GPTBigCode, scores scaled by 1/d for 1/sqrt(d)": Family(
        "gpt_bigcode",
        "GPTBigCodeForCausalLM",
        _config("GPTBigCodeConfig", vocab_size=64, n_embd=16, n_layer=2, n_head=4, n_positions=32),
        "attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling",
        "attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling**2",
        ".transformer.h.0.attn/mul#1_outputs",
        ("key_states.transpose(2, 3)) * scaling",) * 2,
        (".transformer.h.0.attn",),
    ),
    "Gemma3, the logits' soft-cap without tanh": Family(
        "gemma3",
        "Gemma3ForCausalLM",
        _config("Gemma3TextConfig", head_dim=4, final_logit_softcapping=1.0, **SMALL),
        "            logits = torch.tanh(logits)\n",
        "",
        "/mul#1_outputs",
        ("logits = logits * self.config.final_logit_softcapping",) * 2,
    ),
    "Gemma3, sliding layers given the global rotary table": Family(
        "gemma3",
        "Gemma3ForCausalLM",
        _config(
            "Gemma3TextConfig",
            head_dim=4,
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=4,
            **{**SMALL, "num_hidden_layers": 2},
        ),
        "position_embeddings=position_embeddings[self.config.layer_types[i]],",
        'position_embeddings=position_embeddings["full_attention"],',
        ".model.layers.0_inputs_kwargs_position_embeddings_0",
        ("hidden_states = decoder_layer(",) * 2,  # the call's first line (its argument is on a line below)
        (".model",),
    ),
    "OLMo, SwiGLU's gate and up swapped": Family(
        "olmo",
        "OlmoForCausalLM",
        _config("OlmoConfig", **SMALL),
        "down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))",
        "down_proj = self.down_proj(self.act_fn(self.up_proj(x)) * self.gate_proj(x))",
        ".model.layers.0.mlp.act_fn_inputs_args_0",
        ("self.act_fn(self.gate_proj(x))", "self.act_fn(self.up_proj(x))"),
        (".model.layers.0.mlp",),
        early="self.act_fn(self.up_proj(x))",
    ),
    "Whisper, encoder queries without their scaling": Family(
        "whisper",
        "WhisperForConditionalGeneration",
        _config(
            "WhisperConfig",
            vocab_size=64,
            num_mel_bins=8,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            max_source_positions=8,
            max_target_positions=16,
            pad_token_id=1,
            bos_token_id=2,
            eos_token_id=3,
            decoder_start_token_id=2,
        ),
        "query_states = (self.q_proj(hidden_states) * self.scaling).view(hidden_shape).transpose(1, 2).contiguous()",
        "query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2).contiguous()",
        ".model.encoder.layers.0.self_attn/view#1_outputs",
        ("query_states = (self.q_proj(hidden_states) * self.scaling)", "query_states = self.q_proj(hidden_states)"),
        # its inputs agree and its output does not (some of its ops pair ambiguously by position: they count toward
        # no culprit, the module itself is judged on its inputs and outputs)
        culprits=(".model.encoder.layers.0.self_attn",),
        inputs=lambda: {
            "input_features": torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(2)),
            "decoder_input_ids": IDS[:1, :4],
        },
    ),
    "DistilBERT's MLM head, norm before activation": Family(
        "distilbert",
        "DistilBertForMaskedLM",
        _config("DistilBertConfig", vocab_size=64, dim=16, hidden_dim=32, n_layers=2, n_heads=4),
        "        prediction_logits = self.activation(prediction_logits)  # (bs, seq_length, dim)\n"
        "        prediction_logits = self.vocab_layer_norm(prediction_logits)  # (bs, seq_length, dim)\n",
        "        prediction_logits = self.vocab_layer_norm(prediction_logits)  # (bs, seq_length, dim)\n"
        "        prediction_logits = self.activation(prediction_logits)  # (bs, seq_length, dim)\n",
        ".activation_inputs_args_0",
        ("prediction_logits = self.activation(prediction_logits)",) * 2,
        early="prediction_logits = self.vocab_layer_norm(prediction_logits)",
    ),
    "CodeGen, the fused qkv split as query, key, value": Family(
        "codegen",
        "CodeGenForCausalLM",
        _config("CodeGenConfig", vocab_size=64, n_embd=16, n_layer=2, n_head=4, n_positions=32, n_ctx=32, rotary_dim=2),
        "query, value, key = qkv.split(local_dim, dim=-1)",
        "query, key, value = qkv.split(local_dim, dim=-1)",
        # the split's three parts hold the same values on both sides: the first op that differs is the one that
        # transposes the port's `value` (its key's part); which transpose faces which is ambiguous, and said so; the
        # attention, whose inputs agree and whose output does not, is the culprit all the same
        ".transformer.h.0.attn/transpose#1_outputs",
        ("value = value.reshape(hidden_shape).transpose(1, 2)",) * 2,
        culprits=(".transformer.h.0.attn",),
    ),
    "DeiT, the distillation token before the class token": Family(
        "deit",
        "DeiTModel",
        _config(
            "DeiTConfig",
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            image_size=16,
            patch_size=4,
        ),
        "embeddings = torch.cat((cls_tokens, distillation_tokens, embeddings), dim=1)",
        "embeddings = torch.cat((distillation_tokens, cls_tokens, embeddings), dim=1)",
        ".embeddings/cat#1_outputs",
        ("embeddings = torch.cat((cls_tokens, distillation_tokens", "embeddings = torch.cat((distillation_tokens"),
        (".embeddings",),
        inputs=lambda: torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(3)),
    ),
    "SegFormer, tokens reshaped to channels without the transpose": Family(
        "segformer",
        "SegformerModel",
        _config(
            "SegformerConfig",
            num_encoder_blocks=2,
            depths=[1, 1],
            sr_ratios=[2, 1],
            hidden_sizes=[8, 16],
            patch_sizes=[3, 3],
            strides=[2, 2],
            num_attention_heads=[1, 2],
            mlp_ratios=[2, 2],
            drop_path_rate=0.0,
        ),
        "hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, num_channels, height, width)",
        "hidden_states = hidden_states.reshape(batch_size, num_channels, height, width)",
        ".stages.0.blocks.0.attention.sequence_reduction/reshape#1_outputs",
        (
            "hidden_states = hidden_states.transpose(1, 2).reshape(",
            "hidden_states.reshape(batch_size, num_channels, height, width)",
        ),
        (".stages.0.blocks.0.attention.sequence_reduction",),
        inputs=lambda: torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(3)),
    ),
}


@pytest.mark.parametrize("case", list(FAMILIES), ids=list(FAMILIES))
def test_a_transformers_port_with_one_line_changed_is_named_at_that_line(
    settings: Settings, ports: Callable[..., Port], case: str
) -> None:
    c = FAMILIES[case]
    tag = re.sub(r"\W+", "_", case.partition(",")[2].strip())[:24]
    port = ports(c.family, tag, c.old, c.new)
    cls = c.cls
    ref, cand = jittered_pair(port, cls, c.config())
    found = find_divergence(ref, cand, c.inputs(), session="family", data_dir=settings.data_dir)
    first = found.first
    assert first is not None and first.reference == cls + c.first, repr(found)
    lines = (line_holding(port.original, c.lines[0]), line_holding(port.path, c.lines[1]))
    assert (first.reference_source, first.candidate_source) == lines, repr(found)
    assert found.culprits == [cls + m for m in c.culprits], repr(found)
    if c.early is not None:
        assert line_holding(port.path, c.early) in {at for _, at, _ in first.candidate_early_before}, first


# --- the two answers round 6 left wrong ---------------------------------------------------------------------------


def test_olmo2_a_norm_called_in_anothers_place_names_the_ports_line(
    settings: Settings, ports: Callable[..., Port]
) -> None:
    """OLMo2's port calls `post_feedforward_layernorm` where the attention's norm belongs. Its call pairs by name
    with the reference's later call of that norm, so it was neither paired before the divergence nor one-sided: the
    port's line (the bug's) was nowhere in the answer. It is now named as run where the reference does not."""
    import transformers

    port = ports(
        "olmo2",
        "norm",
        "hidden_states = self.post_attention_layernorm(hidden_states)",
        "hidden_states = self.post_feedforward_layernorm(hidden_states)",
    )
    ref, cand = jittered_pair(port, "Olmo2ForCausalLM", transformers.Olmo2Config(**SMALL))  # type: ignore[no-untyped-call,unused-ignore]  # untyped in transformers 4.53
    found = find_divergence(ref, cand, {"input_ids": IDS}, session="olmo2", data_dir=settings.data_dir)
    first = found.first
    assert first is not None and first.reference == "Olmo2ForCausalLM.model.layers.0/add#1_outputs", repr(found)
    # the port calls it twice: in the attention's norm's place (the bug), and in its own
    bug = line_holding(port.path, "hidden_states = self.post_feedforward_layernorm(hidden_states)", first=True)
    reference_call = line_holding(port.original, "hidden_states = self.post_feedforward_layernorm(hidden_states)")
    assert (
        "Olmo2ForCausalLM.model.layers.0.post_feedforward_layernorm_outputs",
        bug,
        reference_call,
    ) in first.candidate_early_before, first.candidate_early_before
    words = repr(found)
    assert f"post_feedforward_layernorm_outputs ({bug}), which pair by name with tensors the reference" in words
    assert found.culprits == ["Olmo2ForCausalLM.model.layers.0"], words


class Rows(nn.Module):
    """A block; the port runs it row by row and concatenates the rows (the same maths)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.f = nn.Sequential(nn.Linear(D, D), nn.GELU(), nn.Linear(D, D))
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.port:
            return torch.cat([self.f(x[i : i + 1]) for i in range(x.shape[0])], 0)
        return cast(torch.Tensor, self.f(x))


def test_a_block_run_row_by_row_is_no_divergence_for_find_divergence_as_for_the_session(settings: Settings) -> None:
    """find_divergence named `Rows.f_inputs_args_0`, "shapes differ ([2, 6, 16] vs [1, 6, 16])", as the first
    divergence (the reference's one call of `f` against the port's first of two), while the session, from the same
    runs, said no divergence, incomplete (those pairs incomparable). Both now say that no values differ among those
    compared and that `f`'s calls were not compared, find_divergence saying why."""
    x = _x(torch.Generator().manual_seed(5))
    found = find_divergence(Rows(False).eval(), Rows(True).eval(), x, session="rows", data_dir=settings.data_dir)
    words = repr(found)
    assert found.first is None and found.culprits == [], words
    assert "no difference found in 2 pairs" in words, words
    assert "f (1 call in the reference, 2 in the candidate)" in words, words
    assert found.split_calls == ((".f", 1, 2),), found.split_calls
    report, _ = compared(settings, 1)
    assert report.first_divergence is None and report.verdict == "incomplete", report.verdict
    assert "Rows.f_inputs_args_0" in {p.name for p in report.not_compared}


class SharedRegion(nn.Module):
    """An MLP whose first layer runs under a bfloat16 autocast region on both sides; with `bug`, the port scales its
    float32 output by 1.003 (a bug of about the size of bfloat16's rounding, where both sides compute in float32)."""

    def __init__(self, bug: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = F.gelu(self.up(x)).float()
        out = cast(torch.Tensor, self.down(h))
        return out * 1.003 if self.bug else out  # shared region scaled


def test_an_autocast_region_both_sides_share_is_no_precision_floor(settings: Settings) -> None:
    """Both sides compute `up` under the same bfloat16 autocast region: the candidate computes in no dtype the
    reference does not, so no precision floor is used (the autocast floor ran the whole reference under autocast, its
    float32 `down` in bfloat16 too, and a float32 bug of that size passed within it: no divergence)."""
    x = _x(torch.Generator().manual_seed(5))
    same = find_divergence(SharedRegion().eval(), SharedRegion().eval(), x, session="same", data_dir=settings.data_dir)
    assert same.floor is None and not same.floor_autocast and same.first is None, repr(same)
    found = find_divergence(
        SharedRegion().eval(), SharedRegion(bug=True).eval(), x, session="bug", data_dir=settings.data_dir
    )
    words = repr(found)
    assert found.floor is None and "parts of its forward" not in words, words
    assert found.first is not None and found.first.reference == "SharedRegion_outputs", words


class Float32Block(nn.Module):
    """A linear map in the block's own code and then an op with a float32 kernel only; the port runs the map under
    a bfloat16 autocast region and casts back before the op, in the same forward (so autocast around the block's
    forward, as the floor runs the reference, leaves it in bfloat16)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(D, D) / D**0.5), nn.Parameter(torch.zeros(D))
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        region = torch.autocast("cpu", dtype=torch.bfloat16) if self.port else contextlib.nullcontext()
        with region:
            h = F.linear(x, self.weight, self.bias)
        if self.port:
            h = h.float()
        if h.dtype != torch.float32:
            raise TypeError(f"a float32 kernel only, got {h.dtype}")
        return h.exp()


class Float32Only(nn.Module):
    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.block = Float32Block(port)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.block(x))


def test_an_autocast_floor_that_raised_is_said_as_what_ran(settings: Settings) -> None:
    """The reference raises under autocast (its own op has a float32 kernel only): the answer said "the reference
    converted to bfloat16 (the precision floor) raised", of a copy that was never made; it now says what ran."""
    x = _x(torch.Generator().manual_seed(5))
    found = find_divergence(
        Float32Only(False).eval(), Float32Only(True).eval(), x, session="f32", data_dir=settings.data_dir
    )
    words = found.words()
    assert found.floor is None and found.floor_note is not None, words
    assert "converted" not in found.floor_note, found.floor_note
    # autocast around the block's forward raised, and so did autocast around the whole forward
    assert "the reference run under torch.autocast to bfloat16 (the precision floor) raised TypeError" in words, words
    assert "computes parts of its forward in bfloat16" in words and "judged by tolerances alone" in words, words
