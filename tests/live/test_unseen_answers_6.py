"""`find_divergence`'s answers on models and planted bugs no earlier round built (bench/RESULTS.md, "answers on
unseen models, round 6"): hand-written blocks and their ports, and transformers models (tiny random configs, no
download) against a copy of their own `modeling_*.py` with one line changed. Each case checks the first diverging
op or tensor and the line named on each side; the tests named after a fix held an answer that was wrong or said too
little before it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the name models use)
from tensor_debugger import find_divergence
from tensor_debugger.live.divergence import ChangingModelError
from tensor_debugger.settings import Settings
from torch import nn

from tests.support.model_ports import Port, port_writer
from tests.support.source_lines import line_holding, marked_line

HERE = Path(__file__)
D, H, KV = 16, 4, 2
HD = D // H

line_of = partial(marked_line, HERE)  # `path:line` of this file's line ending with the comment `marker`


def rope(t: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim)
    angles = torch.arange(t).float()[:, None] * inv[None]
    emb = torch.cat([angles, angles], -1)
    return emb.cos(), emb.sin()


class Rotary(nn.Module):
    """Queries and keys turned by rotary (rotate_half, NeoX's halves); the port turns adjacent pairs (GPT-J's) of
    the same weights."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k = nn.Linear(D, D), nn.Linear(D, D)
        self.port = port

    def turn(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.port:
            x1, x2 = x[..., ::2], x[..., 1::2]  # port pairs
            rot = torch.stack([-x2, x1], -1).flatten(-2)
        else:
            x1, x2 = x[..., : HD // 2], x[..., HD // 2 :]  # halves
            rot = torch.cat([-x2, x1], -1)
        return x * cos + rot * sin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, H, HD).transpose(1, 2)
        k = self.k(x).view(b, t, H, HD).transpose(1, 2)
        cos, sin = rope(t, HD)
        q, k = self.turn(q, cos, sin), self.turn(k, cos, sin)
        return cast(torch.Tensor, (q @ k.transpose(-1, -2) * HD**-0.5).softmax(-1))


class HeadSplit(nn.Module):
    """Attention whose port splits the projection into heads as (head_dim, heads): each head takes strided
    columns."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv, self.o = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.port = port

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        if self.port:
            return x.view(b, t, HD, H).permute(0, 3, 1, 2)  # port heads
        return x.view(b, t, H, HD).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        out = F.scaled_dot_product_attention(self.heads(q), self.heads(k), self.heads(v))  # heads attend
        return cast(torch.Tensor, self.o(out.transpose(1, 2).reshape(x.shape)))


class HalfNorm(nn.Module):
    """The RMSNorm of a float16 model: the reference squares in float32, the port in float16 (past 256: inf)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(D, D).half()
        self.weight = nn.Parameter(torch.ones(D, dtype=torch.float16))
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.port:
            var = h.pow(2).mean(-1, keepdim=True)  # squares in float16
            return cast(torch.Tensor, self.weight * (h * torch.rsqrt(var + 1e-6)))
        var32 = h.float().pow(2).mean(-1, keepdim=True)  # squares in float32
        return cast(torch.Tensor, self.weight * (h.float() * torch.rsqrt(var32 + 1e-6)).half())


class PreNorm(nn.Module):
    """A pre-norm block; the port adds the residual to the normalised input, not to the block's input."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm, self.ff = nn.LayerNorm(D), nn.Linear(D, D)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.port:
            x = self.norm(x)
            return cast(torch.Tensor, x + self.ff(x))  # port residual
        return cast(torch.Tensor, x + self.ff(self.norm(x)))  # residual


class Masked(nn.Module):
    """Scores under a key padding mask, filled with finfo.min; the port fills with -inf (a batch row with every
    key padded is then NaN)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k = nn.Linear(D, D), nn.Linear(D, D)
        self.fill = float("-inf") if port else torch.finfo(torch.float32).min

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        s = self.q(x) @ self.k(x).transpose(-1, -2) * D**-0.5
        return cast(torch.Tensor, s.masked_fill(~keep[:, None, :], self.fill).softmax(-1))  # padding filled


class CausalConv(nn.Module):
    """A causal depthwise conv (left padding k - 1, as Mamba's); the port pads both sides (a 'same' conv)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv1d(D, D, 3, groups=D)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x.transpose(1, 2), (1, 1) if self.port else (2, 0))  # conv padding
        return F.silu(self.conv(x)).transpose(1, 2)


class EinsumScores(nn.Module):
    """Scores by einsum; the port's subscripts take the keys for the queries (the scores transposed)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.spec = "bkhd,bqhd->bhqk" if port else "bqhd,bkhd->bhqk"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, H, HD) for p in (self.q, self.k, self.v))
        s = torch.einsum(self.spec, q, k) * HD**-0.5  # einsum scores
        return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v).reshape(b, t, D)


class Mlp(nn.Module):
    """An MLP with GELU; the port uses its tanh approximation."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.approximate = "tanh" if port else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(F.gelu(self.up(x), approximate=self.approximate))  # gelu
        return out


class RotaryTable(nn.Module):
    """Rotary angles from `inv_freq`: the reference keeps it a plain float32 attribute, which `.to(bfloat16)`
    leaves alone; the port registers it as a buffer, which the cast rounds to bfloat16."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(D, D)
        inv = 1.0 / 10000 ** (torch.arange(0, D, 2).float() / D)
        if port:
            self.register_buffer("inv_freq", inv, persistent=False)
        else:
            self.inv_freq = inv

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = positions.float()[:, None] * self.inv_freq[None].float()  # angles
        emb = torch.cat([angles, angles], -1)
        return cast(torch.Tensor, self.proj(x) * emb.cos().to(x.dtype))


class Residual(nn.Module):
    """A block whose port halves a slice of its input in place, through a view: its residual, and whatever else is
    given that tensor, sees the change."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ff = nn.Linear(D, D)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x[..., : D // 2]
        h = h.mul_(0.5) if self.port else h * 0.5  # in place on a view
        return cast(torch.Tensor, x + self.ff(torch.cat([h, x[..., D // 2 :]], -1)))  # view's residual


class AlwaysDropout(nn.Module):
    """A residual dropout written `F.dropout(..., training=True)`: random in eval mode too."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ff = nn.Linear(D, D)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.dropout(self.ff(x), 0.1, training=self.port or self.training)  # residual dropout


class Sdpa(nn.Module):
    """Causal attention by SDPA; the port forgets `is_causal`."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv = nn.Linear(D, 3 * D)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, H, HD).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=not self.port)  # sdpa
        return out.transpose(1, 2).reshape(b, t, D)


class CausalMask(nn.Module):
    """A causal mask built with triu; the port's diagonal 0 masks each position from itself too."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k = nn.Linear(D, D), nn.Linear(D, D)
        self.diagonal = 0 if port else 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool).triu(self.diagonal)  # causal mask
        s = self.q(x) @ self.k(x).transpose(-1, -2)
        return cast(torch.Tensor, s.masked_fill(mask, torch.finfo(s.dtype).min).softmax(-1))


class Positions(nn.Module):
    """Learned positions of a left-padded batch: from each row's first token (the mask's cumsum); the port counts
    from the row's start (arange)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tokens, self.positions = nn.Embedding(32, D), nn.Embedding(16, D)
        self.port = port

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        counted = (mask.cumsum(-1) - 1).clamp(min=0)
        pos = torch.arange(ids.shape[1]).expand_as(ids) if self.port else counted  # port positions
        out: torch.Tensor = self.tokens(ids) + self.positions(pos)  # embeddings
        return out


def repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n, t, d).reshape(b, h * n, t, d)


class Gqa(nn.Module):
    """Grouped-query attention; the port repeats the key/value heads by repeat_interleave: the same order."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.kv = nn.Linear(D, D), nn.Linear(D, 2 * KV * HD)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, H, HD).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, KV, HD).permute(2, 0, 3, 1, 4)
        if self.port:
            k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        else:
            k, v = repeat_kv(k, H // KV), repeat_kv(v, H // KV)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, D)


class BatchNorm(nn.Module):
    """A conv and a BatchNorm; the port's BatchNorm keeps no running statistics (batch statistics in eval too)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4, track_running_stats=not port)
        if not port:
            assert self.bn.running_mean is not None and self.bn.running_var is not None
            self.bn.running_mean.uniform_(-0.1, 0.1)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))  # conv and norm


class ComplexRope(nn.Module):
    """Rotary by rotate_half; the port by complex numbers over adjacent pairs (Meta's Llama code) on weights never
    permuted for it."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q = nn.Linear(D, D)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, H, HD)
        if self.port:
            inv = 1.0 / 10000 ** (torch.arange(0, HD, 2).float() / HD)
            turns = torch.polar(torch.ones(t, HD // 2), torch.arange(t).float()[:, None] * inv[None])
            pairs = torch.view_as_complex(q.reshape(b, t, H, HD // 2, 2))
            return torch.view_as_real(pairs * turns[None, :, None]).flatten(3)  # complex turn
        cos, sin = rope(t, HD)
        rot = torch.cat([-q[..., HD // 2 :], q[..., : HD // 2]], -1)
        return cast(torch.Tensor, q * cos[None, :, None] + rot * sin[None, :, None])


@dataclass(frozen=True)
class Case:
    model: Callable[[bool], nn.Module]
    inputs: Callable[[torch.Generator], Any]
    first: str | None  # the reference's first diverging tensor (None: no divergence)
    lines: tuple[str | None, str | None]  # the markers of the lines named on each side (None: no line)
    culprits: tuple[str, ...] = ()
    before: tuple[str, str] | None = None  # a tensor of the candidate's named before it, and its line's marker
    reason: str = ""  # words the summaries' reason holds


def _x(g: torch.Generator) -> torch.Tensor:
    return torch.randn(2, 6, D, generator=g)


def _keep(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[0, 4:], keep[1] = False, False  # row 1: every key padded
    return _x(g), keep


def _ids(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    return torch.randint(0, 32, (2, 6), generator=g), mask


CASES = {
    "rotary pairs for halves": Case(Rotary, _x, "Rotary/getitem#3_outputs", ("halves", "port pairs")),
    "heads split (head_dim, heads)": Case(
        HeadSplit,
        _x,
        "HeadSplit/scaled_dot_product_attention#1_outputs",
        ("heads attend", "heads attend"),
        before=("HeadSplit/permute#3_outputs", "port heads"),
    ),
    "float16 RMSNorm squares without upcast": Case(
        HalfNorm,
        lambda g: (_x(g) * 2000).half(),
        "HalfNorm/pow#1_outputs",
        ("squares in float32", "squares in float16"),
        reason="NaN/Inf counts differ",
    ),
    "residual from the normalised input": Case(PreNorm, _x, "PreNorm/add#1_outputs", ("residual", "port residual")),
    "mask filled with -inf, a row all padding": Case(
        Masked, _keep, "Masked/masked_fill#1_outputs", ("padding filled", "padding filled"), reason="NaN/Inf"
    ),
    "causal conv padded both sides": Case(CausalConv, _x, "CausalConv/pad#1_outputs", ("conv padding", "conv padding")),
    "einsum subscripts swapped": Case(
        EinsumScores, _x, "EinsumScores/einsum#1_outputs", ("einsum scores", "einsum scores")
    ),
    "gelu's tanh approximation": Case(Mlp, _x, "Mlp/gelu#1_outputs", ("gelu", "gelu")),
    "inv_freq a buffer, cast to bfloat16": Case(
        lambda port: RotaryTable(port).to(torch.bfloat16),
        lambda g: (_x(g).bfloat16(), torch.arange(6) * 40),
        "RotaryTable/float#2_outputs",
        ("angles", "angles"),
    ),
    "SDPA without is_causal": Case(Sdpa, _x, "Sdpa/scaled_dot_product_attention#1_outputs", ("sdpa", "sdpa")),
    "triu's diagonal 0": Case(CausalMask, _x, "CausalMask/triu#1_outputs", ("causal mask", "causal mask")),
    "repeat_interleave for repeat_kv (the same)": Case(Gqa, _x, None, (None, None)),
    "BatchNorm without running statistics": Case(
        BatchNorm,
        lambda g: torch.randn(2, 3, 5, 5, generator=g),
        "BatchNorm.bn/batch_norm#1_outputs",
        ("conv and norm", "conv and norm"),
        culprits=("BatchNorm.bn",),
    ),
    # the model's own outputs: no line (it is called by find_divergence, not by the user's code there)
    "complex rotary on unpermuted weights": Case(
        ComplexRope, _x, "ComplexRope_outputs", (None, None), before=("ComplexRope/flatten#1_outputs", "complex turn")
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_a_planted_bug_is_named_at_its_op_and_line(settings: Settings, case: str) -> None:
    c = CASES[case]
    g = torch.Generator().manual_seed(5)
    found = find_divergence(
        c.model(False).eval(), c.model(True).eval(), c.inputs(g), session="case", data_dir=settings.data_dir
    )
    first = found.first
    if c.first is None:
        assert first is None and found.culprits == [], repr(found)
        assert "no difference found" in repr(found), repr(found)
        return
    assert first is not None and first.reference == c.first, repr(found)
    lines = tuple(line_of(m) if m is not None else None for m in c.lines)
    assert (first.reference_source, first.candidate_source) == lines, first
    assert found.culprits == list(c.culprits), repr(found)
    if c.before is not None:
        name, marker = c.before
        assert (name, line_of(marker)) in first.candidate_only_before + first.candidate_unmatched_before, first
    assert c.reason in (first.summary.reason or ""), first.summary


def test_a_modules_input_that_diverges_is_named_with_the_line_that_called_the_module(settings: Settings) -> None:
    """Positions counted from the row's start in a left-padded batch: the first divergence is the input of the
    positions' embedding, which came with no line on either side ("in module Positions": a module's input carried
    none), so the line that passed it was nowhere in the answer."""
    ids, mask = _ids(torch.Generator().manual_seed(5))
    found = find_divergence(
        Positions(False).eval(), Positions(True).eval(), (ids, mask), session="pos", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None and first.reference == "Positions.positions_inputs_args_0", repr(found)
    assert first.reference_source == first.candidate_source == line_of("embeddings"), first
    assert f"(passed at {line_of('embeddings')} in the reference" in repr(found)
    assert ("Positions/arange#1_outputs", line_of("port positions")) in first.candidate_unmatched_before, first


def test_a_port_that_changes_its_input_in_place_is_not_taken_for_a_changing_reference(settings: Settings) -> None:
    """The port halves a slice of its input through a view, in place. Both models were given the one input
    tensor: the port's call changed it, and find_divergence refused, blaming the reference ("the reference called
    twice on the same inputs gave different values, first at Residual_inputs_args_0"). Each call now gets its own
    copy: the answer is the residual's add, with the port's `mul_` named at its line."""
    x = _x(torch.Generator().manual_seed(5))
    before = x.clone()
    found = find_divergence(
        Residual(False).eval(), Residual(True).eval(), x, session="view", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None and first.reference == "Residual/add#1_outputs", repr(found)
    assert first.reference_source == first.candidate_source == line_of("view's residual"), first
    assert ("Residual/mul_#1_outputs", line_of("in place on a view")) in first.candidate_unmatched_before, first
    assert torch.equal(x, before)  # the caller's tensor is left as it was


def test_dropout_in_eval_mode_is_refused_naming_its_line_without_telling_to_call_eval(settings: Settings) -> None:
    """`F.dropout(..., training=True)` in a model in eval mode: refused, as before, but the error named no line and
    said "put the model in eval mode", which it is."""
    x = _x(torch.Generator().manual_seed(5))
    with pytest.raises(ChangingModelError) as raised:
        find_divergence(
            AlwaysDropout(False).eval(), AlwaysDropout(True).eval(), x, session="d", data_dir=settings.data_dir
        )
    words = str(raised.value)
    assert f"first at AlwaysDropout/dropout#1_outputs ({line_of('residual dropout')})" in words, words
    assert "put the model in eval mode" not in words and "the model is in eval mode" in words, words


class SamePad(nn.Module):
    """A 'same' conv and a residual; the port pads by 2 for 1 (Wav2Vec2's same-pad left unremoved, in short): its
    output is two steps longer, and the residual add raises."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv1d(D, D, 3, padding=2 if port else 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x.transpose(1, 2)).transpose(1, 2)  # same conv
        return cast(torch.Tensor, x + h)


def test_a_port_that_raises_is_told_the_first_divergence_recorded_before_it(settings: Settings) -> None:
    """The port's shapes go wrong at its conv and torch raises at the residual add: find_divergence passed the
    error on with a note naming the model, and nothing of what the two captures had recorded up to there."""
    x = _x(torch.Generator().manual_seed(5))
    with pytest.raises(RuntimeError, match="must match the size") as raised:
        find_divergence(SamePad(False).eval(), SamePad(True).eval(), x, session="raises", data_dir=settings.data_dir)
    notes = getattr(raised.value, "__notes__", [])
    assert "find_divergence: raised by the candidate model, called as model(inputs)" in notes, notes
    at = line_of("same conv")
    assert (
        "find_divergence: before the candidate raised, the first divergence among the 4 pairs of summaries compared "
        f"was SamePad.conv_outputs (called at {at} in the reference, {at} in the candidate): from summaries: shapes "
        "differ ([2, 16, 6] vs [2, 16, 8])"
    ) in notes, notes


# --- transformers models against a copy of their own modeling file with one line changed ----------------------------


@pytest.fixture(scope="module")
def ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str, str, str], Port]]:
    """Writes `modeling_<family>.py` with `old` replaced by `new` as a port of its own and imports it."""
    with port_writer(tmp_path_factory.mktemp("ports")) as write:
        yield lambda family, old, new: write(family, f"port_{family}", old, new)


def _pair(ports: Callable[[str, str, str], Port], ported: Ported) -> tuple[Port, nn.Module, nn.Module]:
    """The case's port; the reference built from its config (its weights jittered: norms' ones and zeros would hide
    a swapped norm), and the port's class with the same weights; both eager attention, eval mode."""
    import transformers

    port = ports(ported.family, ported.old, ported.new)
    config = getattr(transformers, ported.config)(**ported.options)  # Any: configs are untyped in transformers 4.53
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    reference: nn.Module = getattr(transformers, ported.model)(config).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    candidate: nn.Module = getattr(port.module, ported.model)(config).eval()
    candidate.load_state_dict(reference.state_dict())
    return port, reference, candidate


@dataclass(frozen=True)
class Ported:
    """A transformers model against its port: `old` replaced by `new` in `modeling_<family>.py`; `model` and its
    `config` built with `options` (transformers' class names), called on `inputs`."""

    family: str
    old: str
    new: str
    model: str
    config: str
    options: dict[str, Any]
    inputs: Any


@dataclass(frozen=True)
class PortAnswer:
    """The answer expected of a port: the first divergence's reference tensor, the line named on each side (the
    one holding `line` in the original, and `port_line` or `line` in the port), the culprits, and where given the
    first divergence's module and a tensor the candidate recorded alone before it, with its line in the port."""

    first: str
    line: str
    port_line: str | None = None
    culprits: tuple[str, ...] | None = None
    module: str | None = None
    candidate_only: tuple[str, str] | None = None


SMALL: dict[str, Any] = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)
IDS = {"input_ids": torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))}

PORT_CASES = {
    "cohere rotary by halves for interleaved pairs": (
        Ported(
            "cohere",
            "    x1 = x[..., ::2]\n    x2 = x[..., 1::2]\n    rot_x = torch.stack([-x2, x1], dim=-1).flatten(-2)",
            "    x1 = x[..., : x.shape[-1] // 2]\n    x2 = x[..., x.shape[-1] // 2 :]\n"
            "    rot_x = torch.cat((-x2, x1), dim=-1)",
            "CohereForCausalLM",
            "CohereConfig",
            SMALL,
            IDS,
        ),
        PortAnswer(
            "CohereForCausalLM.model.layers.0.self_attn/getitem#1_outputs",
            "x1 = x[..., ::2]",
            "x1 = x[..., : x.shape",
            culprits=("CohereForCausalLM.model.layers.0.self_attn",),
        ),
    ),
    # the port's second call of q_norm, named with the line that called it
    "qwen3 keys normed by the query norm": (
        Ported(
            "qwen3",
            "key_states = self.k_norm(",
            "key_states = self.q_norm(",
            "Qwen3ForCausalLM",
            "Qwen3Config",
            {"head_dim": 4, **SMALL},
            IDS,
        ),
        PortAnswer(
            "Qwen3ForCausalLM.model.layers.0.self_attn/transpose#2_outputs",
            "key_states = self.k_norm(",
            "key_states = self.q_norm(",
            culprits=("Qwen3ForCausalLM.model.layers.0.self_attn",),
            candidate_only=("Qwen3ForCausalLM.model.layers.0.self_attn.q_norm#2_outputs", "key_states = self.q_norm("),
        ),
    ),
    # the first divergence is the activation module's output (its ops differ: NewGELU's five against one `gelu`),
    # which came with no line on either side: now the line calling the activation
    "gpt2 exact gelu for gelu_new is named at the line calling the activation": (
        Ported(
            "gpt2",
            "self.act = ACT2FN[config.activation_function]",
            "self.act = nn.GELU()",
            "GPT2LMHeadModel",
            "GPT2Config",
            dict(vocab_size=64, n_embd=16, n_layer=2, n_head=4, n_positions=32),
            IDS,
        ),
        PortAnswer(
            "GPT2LMHeadModel.transformer.h.0.mlp.act_outputs",
            "hidden_states = self.act(hidden_states)",
            culprits=("GPT2LMHeadModel.transformer.h.0.mlp.act",),
        ),
    ),
    # ALBERT's two layer groups, each called twice: the port calls them 0 1 0 1 for 0 0 1 1. The first divergence
    # is the input of group 0's second call, in module encoder, with no line before; now the loop's line that
    # called it
    "albert shared groups called out of order name the line that called them": (
        Ported(
            "albert",
            "group_idx = int(i / (self.config.num_hidden_layers / self.config.num_hidden_groups))",
            "group_idx = i % self.config.num_hidden_groups",
            "AlbertModel",
            "AlbertConfig",
            dict(
                vocab_size=64,
                embedding_size=8,
                hidden_size=16,
                num_hidden_layers=4,
                num_hidden_groups=2,
                num_attention_heads=2,
                intermediate_size=32,
                max_position_embeddings=32,
            ),
            IDS,
        ),
        PortAnswer(
            "AlbertModel.encoder.albert_layer_groups.0#2_inputs_args_0",
            "hidden_states = self.albert_layer_groups[",
            module="AlbertModel.encoder",
        ),
    ),
    # the port applies the MLP's layer scale after adding the residual: the layer scale's input differs, at the
    # line that called it on each side (one line apart)
    "dinov2 layer scale on the residual sum names each side's line": (
        Ported(
            "dinov2",
            "        hidden_states = self.layer_scale2(hidden_states)\n"
            "        hidden_states = self.drop_path(hidden_states) + residual\n",
            "        hidden_states = self.drop_path(hidden_states) + residual\n"
            "        hidden_states = self.layer_scale2(hidden_states)\n",
            "Dinov2Model",
            "Dinov2Config",
            dict(
                hidden_size=16,
                num_hidden_layers=2,
                num_attention_heads=2,
                mlp_ratio=2,
                image_size=16,
                patch_size=4,
                layerscale_value=0.5,
            ),
            torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(3)),
        ),
        PortAnswer(
            "Dinov2Model.encoder.layer.0.layer_scale2_inputs_args_0",
            "= self.layer_scale2(hidden_states)",
            culprits=("Dinov2Model.encoder.layer.0",),
        ),
    ),
    "wav2vec2 same pad removed at the front": (
        Ported(
            "wav2vec2",
            "hidden_states = hidden_states[:, :, : -self.num_pad_remove]",
            "hidden_states = hidden_states[:, :, self.num_pad_remove :]",
            "Wav2Vec2Model",
            "Wav2Vec2Config",
            dict(
                vocab_size=16,
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
                conv_dim=(8, 8),
                conv_stride=(5, 2),
                conv_kernel=(10, 3),
                num_conv_pos_embeddings=4,
                num_conv_pos_embedding_groups=2,
            ),
            torch.randn(2, 400, generator=torch.Generator().manual_seed(3)),
        ),
        PortAnswer(
            "Wav2Vec2Model.encoder.pos_conv_embed.padding/getitem#1_outputs",
            "hidden_states[:, :, : -self.num_pad_remove]",
            "hidden_states[:, :, self.num_pad_remove :]",
            culprits=("Wav2Vec2Model.encoder.pos_conv_embed.padding",),
        ),
    ),
}


@pytest.mark.parametrize("case", list(PORT_CASES), ids=list(PORT_CASES))
def test_a_transformers_port_with_one_line_changed_is_named_at_that_line(
    settings: Settings, ports: Callable[[str, str, str], Port], case: str
) -> None:
    ported, answer = PORT_CASES[case]
    port, ref, cand = _pair(ports, ported)
    found = find_divergence(ref, cand, ported.inputs, session=ported.family, data_dir=settings.data_dir)
    first = found.first
    assert first is not None and first.reference == answer.first, repr(found)
    assert (first.reference_source, first.candidate_source) == port.lines(answer.line, answer.port_line)
    assert first.reference_source != first.candidate_source
    if answer.module is not None:
        assert first.module == answer.module, first
    if answer.candidate_only is not None:
        name, port_line = answer.candidate_only
        assert (name, line_holding(port.path, port_line)) in first.candidate_only_before, first.candidate_only_before
    if answer.culprits is not None:
        assert found.culprits == list(answer.culprits), repr(found)


def test_starcoder2_dropout_forced_on_is_refused_at_its_line(
    settings: Settings, ports: Callable[[str, str, str], Port]
) -> None:
    old = "hidden_states = nn.functional.dropout(hidden_states, p=self.residual_dropout, training=self.training)"
    ported = Ported(
        "starcoder2",
        old,
        old.replace("training=self.training", "training=True"),
        "Starcoder2ForCausalLM",
        "Starcoder2Config",
        {"residual_dropout": 0.1, **SMALL},
        IDS,
    )
    port, ref, cand = _pair(ports, ported)
    with pytest.raises(ChangingModelError) as raised:
        find_divergence(ref, cand, ported.inputs, session=ported.family, data_dir=settings.data_dir)
    at = line_holding(port.path, "training=True)")
    assert "the candidate called twice on the same inputs gave different values, first at " in str(raised.value)
    assert f"Starcoder2ForCausalLM.model.layers.0.mlp/dropout#1_outputs ({at})" in str(raised.value), raised.value
