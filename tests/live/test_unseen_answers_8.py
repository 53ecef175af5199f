"""`find_divergence`'s answers on models and planted bugs no earlier round built (bench/RESULTS.md, "answers on
unseen models, round 8"): the answers that were wrong and are now fixed, and three right ones no earlier round
guards. Fixed: a model whose first call computes a value later calls take from a cache (`functools.lru_cache`, as
BEiT's relative position index) was refused as "recorded different tensors"; a view of memory allocated unset
(`new_empty`) and filled after the view was taken (DeepSeek-V3's keys) was summarised as it was made, its garbage
named as the first divergence or the model refused as changing between calls; a model in training mode with
BatchNorm (its counter `add_`'ed on each call) was refused as changing between calls."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from tensor_debugger import find_divergence
from tensor_debugger.settings import Settings
from torch import nn

from tests.support.model_ports import Port, config_of, jittered_pair, port_writer
from tests.support.source_lines import line_holding, marked_line

HERE = Path(__file__)
D, E, K = 16, 4, 2

line_of = partial(marked_line, HERE)


@functools.lru_cache(maxsize=4)
def distances(t: int) -> torch.Tensor:
    """|i - j| for a length, built once per length and kept."""
    i = torch.arange(t)
    return (i[:, None] - i[None]).abs().float()


class Memo(nn.Module):
    """Attention with a distance penalty from a cached table; the port's slope is twice the reference's."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k = nn.Linear(D, D), nn.Linear(D, D)
        self.slope = 0.5 if port else 0.25

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.q(x) @ self.k(x).transpose(-1, -2) * D**-0.5
        return cast(torch.Tensor, (s - self.slope * distances(x.shape[1])).softmax(-1))  # penalty


class Latent(nn.Module):
    """Keys put together in memory allocated unset (`new_empty`), each half copied into a view of it; the port
    scales the second half by 1.5."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.out = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(2 * D, D)
        self.scale = 1.5 if port else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = x.new_empty(*x.shape[:-1], 2 * D)
        k[..., :D].copy_(self.a(x))
        k[..., D:].copy_(self.b(x) * self.scale)  # second half
        return cast(torch.Tensor, self.out(k))


class Router(nn.Module):
    """Top-2 of 4 experts, weighted by the softmax over all experts (not renormalised); the port takes the top-2
    logits first and softmaxes those (the weights then sum to one)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gate = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList(nn.Linear(D, D) for _ in range(E))
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(-1, D)
        logits = self.gate(h)
        if self.port:
            top, index = torch.topk(logits, K, dim=-1)  # port topk
            weights = top.softmax(-1)
        else:
            probs = logits.softmax(-1)  # softmax
            weights, index = torch.topk(probs, K, dim=-1)  # topk
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(index == e)
            out.index_add_(0, rows, expert(h[rows]) * weights[rows, slot, None])
        return out.view_as(x)


class SharedInPlace(nn.Module):
    """Queries and keys from one projection, the queries with a bias added; the port adds it in place, so that the
    keys, the same tensor, get it too."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(D, D)
        self.bias = nn.Parameter(torch.randn(D) * 0.5)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qk = self.proj(x)
        if self.port:
            q = qk
            q += self.bias  # in place
        else:
            q = qk + self.bias
        return cast(torch.Tensor, (q @ qk.transpose(-1, -2) * D**-0.5).softmax(-1))  # scores


class LazyTable(nn.Module):
    """Keys scaled by a cosine table kept as a buffer, built for 4 positions and rebuilt longer when an input is
    longer (as older rotary embeddings grew their cache); the port's base is 1e5 for 1e4."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.k = nn.Linear(D, D)
        self.base = 1e5 if port else 1e4
        self.build(4)

    def build(self, n: int) -> None:
        inv = 1.0 / self.base ** (torch.arange(0, D, 2).float() / D)  # frequencies
        angles = torch.arange(n).float()[:, None] * inv[None]
        self.register_buffer("cos_cached", torch.cat([angles, angles], -1).cos(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        table = cast(torch.Tensor, self.cos_cached)
        if t > table.shape[0]:
            self.build(t)
            table = cast(torch.Tensor, self.cos_cached)
        return cast(torch.Tensor, self.k(x) * table[:t])


@dataclass(frozen=True)
class Case:
    model: Callable[[bool], nn.Module]
    first: str  # the reference's first diverging tensor
    lines: tuple[str, str]  # the markers of the lines named on each side
    before: tuple[str, str] | None = None  # a tensor of one side named as its own before it, and its line's marker
    side: str = "candidate"  # whose that tensor is
    words: tuple[str, ...] = ()


CASES = {
    # fixed: refused, "the reference called twice on the same inputs recorded different tensors (first at
    # Memo/arange#1_outputs)": the table's ops run on the first call only
    "a table kept by lru_cache": Case(
        Memo,
        "Memo/mul#2_outputs",
        ("penalty", "penalty"),
        words=("the reference's first call recorded other tensors than its second, first at Memo/arange#1",),
    ),
    # fixed: refused, "the reference called twice ... gave different values, first at Latent/getitem#1_outputs": the
    # slice of the unset memory, summarised before its copy_ filled it (or its garbage named as the divergence)
    "views of new_empty memory filled after": Case(Latent, "Latent/mul#1_outputs", ("second half", "second half")),
    # fixed (said too little): the table, rebuilt on the first call only, was read from the buffer on the second and
    # later calls, which were compared: `getitem#1` (the table's slice) at the line using it, the base's line nowhere.
    # Each call now starts from the buffers as given, so each rebuilds it
    "a buffer table rebuilt longer on a call": Case(
        LazyTable, "LazyTable/rpow#1_outputs", ("frequencies", "frequencies")
    ),
    "experts' top-k before their softmax": Case(
        Router,
        "Router/topk#1_outputs_0",
        ("topk", "port topk"),
        before=("Router/softmax#1_outputs", "softmax"),
        side="reference",
    ),
    "an in-place add on a tensor the keys share": Case(
        SharedInPlace,
        "SharedInPlace/transpose#1_outputs",
        ("scores", "scores"),
        before=("SharedInPlace/add_#1_outputs", "in place"),
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_a_planted_bug_is_named_at_its_op_and_line(settings: Settings, case: str) -> None:
    c = CASES[case]
    distances.cache_clear()  # each case's models start with no table kept
    x = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(5))
    found = find_divergence(c.model(False).eval(), c.model(True).eval(), x, session="case", data_dir=settings.data_dir)
    words = repr(found)
    first = found.first
    assert first is not None and first.reference == c.first, words
    assert (first.reference_source, first.candidate_source) == tuple(line_of(m) for m in c.lines), words
    if c.before is not None:
        name, marker = c.before
        own = first.reference_only_before if c.side == "reference" else first.candidate_only_before
        assert (name, line_of(marker)) in own, first
    for said in c.words:
        assert said in words, words


class Normed(nn.Module):
    """A BatchNorm between two layers; the port scales the norm's output by 1.1."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.bn, self.b = nn.Linear(D, D), nn.BatchNorm1d(D), nn.Linear(D, D)
        with torch.no_grad():
            cast(torch.Tensor, self.bn.running_mean).normal_()
            cast(torch.Tensor, self.bn.running_var).uniform_(0.5, 2.0)
        self.scale = 1.1 if port else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bn(self.a(x).transpose(1, 2)).transpose(1, 2)
        return cast(torch.Tensor, self.b(h * self.scale))  # scaled


def test_batchnorm_models_in_training_mode_are_warned_of_and_answered_their_buffers_left_as_given(
    settings: Settings,
) -> None:
    """Both models in training mode, BatchNorm using each batch's statistics (the same outputs on every call): the
    second call's `num_batches_tracked.add_(1)` gave 2 where the first gave 1, and the reference was refused as
    "called twice ... gave different values" (each pass moving the running statistics the caller's models keep).
    Each call now starts from the buffers as given: the warning, then the port's scale at its line; and the
    models' buffers are as they were."""
    reference, candidate = Normed(False).train(), Normed(True).train()
    before = {k: v.clone() for k, v in reference.state_dict().items()}
    x = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(5))
    with pytest.warns(UserWarning) as warned:
        found = find_divergence(reference, candidate, x, session="bn", data_dir=settings.data_dir)
    said = {str(w.message).partition(":")[0] for w in warned}
    assert said == {f"the {what} model is in training mode" for what in ("reference", "candidate")}, said
    first = found.first
    assert first is not None and first.reference == "Normed/mul#1_outputs", repr(found)
    assert (first.reference_source, first.candidate_source) == (line_of("scaled"), line_of("scaled")), repr(found)
    after = reference.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items()), "the reference's buffers were changed"


# --- transformers models against a copy of their own modeling file with one line changed ----------------------------


@pytest.fixture(scope="module")
def ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str, str, str, str], Port]]:
    with port_writer(tmp_path_factory.mktemp("ports")) as write:
        yield lambda family, tag, old, new: write(family, f"port8_{family}_{tag}", old, new)


SMALL: dict[str, Any] = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)
IDS = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))


def test_beit_whose_position_index_is_cached_after_its_first_call(
    settings: Settings, ports: Callable[..., Port]
) -> None:
    """BEiT's relative position bias, transposed in the port (`permute(2, 1, 0)`): the reference was refused, its
    first call computing the position index that later calls take from an lru_cache. Its op and line now."""
    port = ports(
        "beit",
        "bias",
        "relative_position_bias = relative_position_bias.permute(2, 0, 1).contiguous()",
        "relative_position_bias = relative_position_bias.permute(2, 1, 0).contiguous()",
    )
    config = config_of(
        "BeitConfig",
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        image_size=16,
        patch_size=4,
        use_relative_position_bias=True,
    )
    reference, candidate = jittered_pair(port, "BeitModel", config)
    image = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    found = find_divergence(reference, candidate, image, session="beit", data_dir=settings.data_dir)
    first = found.first
    assert first is not None, repr(found)
    # where the bias module sits changes with the release (transformers 4.53: encoder.layer.0.attention.attention)
    bias = "BeitModel." + next(n for n, _ in reference.named_modules() if n.endswith(".relative_position_bias"))
    assert first.reference == f"{bias}/permute#3_outputs", repr(found)
    assert (first.reference_source, first.candidate_source) == port.lines("relative_position_bias.permute(2,")
    assert found.culprits == [bias], repr(found)


def test_deepseek_v3_whose_keys_are_copied_into_unset_memory(settings: Settings, ports: Callable[..., Port]) -> None:
    """DeepSeek-V3 without its `routed_scaling_factor`: the reference was refused ("gave different values, first at
    `self_attn/getitem#7`"), the view of its keys' `new_empty` memory summarised before anything was copied in. The
    router's multiply is named now, and the router as the culprit."""
    port = ports(
        "deepseek_v3",
        "scaling",
        "topk_weights = topk_weights * self.routed_scaling_factor",
        "topk_weights = topk_weights",
    )
    if "new_empty(" not in port.original.read_text(encoding="utf-8"):
        import transformers

        pytest.skip(f"transformers {transformers.__version__}'s DeepSeek-V3 puts its keys together without new_empty")
    config = config_of(
        "DeepseekV3Config",
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=0,
        moe_intermediate_size=16,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        q_lora_rank=None,
        kv_lora_rank=8,
        qk_rope_head_dim=4,
        qk_nope_head_dim=4,
        v_head_dim=4,
        head_dim=4,
        **{**SMALL, "num_key_value_heads": 4},
    )
    reference, candidate = jittered_pair(port, "DeepseekV3ForCausalLM", config)
    found = find_divergence(reference, candidate, {"input_ids": IDS}, session="ds3", data_dir=settings.data_dir)
    first = found.first
    gate = "DeepseekV3ForCausalLM.model.layers.0.mlp.gate"
    assert first is not None and first.reference == gate + "_outputs_1", repr(found)
    scaling = line_holding(port.original, "topk_weights = topk_weights * self.routed_scaling_factor")
    assert (gate + "/mul#1_outputs", scaling) in first.reference_only_before, first
    assert found.culprits == [gate], repr(found)


def test_mixtral_experts_weighted_by_the_other_slots_weight(settings: Settings, ports: Callable[..., Port]) -> None:
    """Mixtral's expert loop, each expert's output weighted by the other top-k slot's weight: the weights' index
    named at its line on both sides, the port's `1 - top_k_pos` with it, and the experts as the culprit."""
    port = ports(
        "mixtral",
        "slot",
        "current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]",
        "current_hidden_states = current_hidden_states * top_k_weights[token_idx, 1 - top_k_pos, None]",
    )
    config = config_of("MixtralConfig", num_local_experts=E, num_experts_per_tok=K, **SMALL)
    reference, candidate = jittered_pair(port, "MixtralForCausalLM", config)
    found = find_divergence(reference, candidate, {"input_ids": IDS}, session="mixtral", data_dir=settings.data_dir)
    first = found.first
    experts = "MixtralForCausalLM.model.layers.0.mlp.experts"
    assert first is not None and first.reference == experts + "/getitem#6_outputs", repr(found)
    lines = port.lines("top_k_weights[token_idx, top_k_pos, None]", "top_k_weights[token_idx, 1 - top_k_pos, None]")
    assert (first.reference_source, first.candidate_source) == lines, repr(found)
    assert (experts + "/rsub#1_outputs", lines[1]) in first.candidate_only_before, first
    assert found.culprits == [experts], repr(found)


def test_backward_capture_of_a_model_changing_a_modules_output_in_place_says_why_it_raised(settings: Settings) -> None:
    """`capture(backward=True)` of the in-place port above: torch's full backward hooks forbid changing a module's
    output in place, so the model, which runs without them, raised torch's "Output 0 of BackwardHookFunction is a
    view and is being modified inplace", naming neither the capture nor what to do. A note now says both."""
    from tensor_debugger import capture

    x = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(5), requires_grad=True)
    model = SharedInPlace(True)
    with (
        pytest.raises(RuntimeError, match="BackwardHookFunction") as raised,
        capture(model, "grads", "port", data_dir=settings.data_dir, level="op", backward=True),
    ):
        model(x).sum().backward()
    notes = " ".join(getattr(raised.value, "__notes__", []))
    assert "capture(backward=True)" in notes and "out of place" in notes, notes
