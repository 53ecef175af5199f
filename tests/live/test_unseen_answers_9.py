"""`find_divergence`'s answers on models and planted bugs no earlier round built (bench/RESULTS.md, "answers on
unseen models, round 9"): the answers that said too little and are now fixed, and two right ones no earlier round
guards. Fixed: a port's extra ops just before a key/value cache's first `cat` (SmolLM3 turning a layer's keys it
should not) went unnamed, the cache's empty `torch.tensor([])`, paired and equal, standing between them and the
divergence; a complex tensor's `.real` or `.imag` (FNet's `fftn(x).real`) was not recorded, so a port taking the
other half was named at its module's output with the line that called the module, not the line of the bug; a port
computing parts of its forward in bfloat16 by casts of its own was told so, not where; two slices swapped in use
(Phi's rotated and passed halves), paired by content across call indices, were not named."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from sqlalchemy import select
from tensor_debugger import capture, find_divergence
from tensor_debugger.compare.reports.pair_reports import session_pairs
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import SessionRecord
from torch import nn

from tests.support.model_ports import Port, config_of, jittered_pair, port_writer
from tests.support.source_lines import marked_line

HERE = Path(__file__)
D = 16

line_of = partial(marked_line, HERE)


class CacheCat(nn.Module):
    """Keys appended to an empty cache (`torch.tensor([])` then `cat`, as transformers' DynamicLayer does); the port
    scales its keys first."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k = nn.Linear(D, D), nn.Linear(D, D)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.k(x)
        if self.port:
            k = k * 1.5  # port scale
        cached = torch.tensor([], dtype=k.dtype)
        keys = torch.cat([cached, k], dim=-2)  # cache
        return cast(torch.Tensor, (self.q(x) @ keys.transpose(-1, -2)).softmax(-1))


def test_a_ports_op_just_before_a_caches_empty_tensor_is_named(settings: Settings) -> None:
    """Said too little: the first divergence (the cache's `cat`) was right, the port's scale just before it not
    named: the empty `torch.tensor([])` between them pairs and agrees, and ended the search for one-sided ops."""
    x = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(5))
    found = find_divergence(
        CacheCat(False).eval(), CacheCat(True).eval(), x, session="cache", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None and first.reference == "CacheCat/cat#1_outputs", repr(found)
    assert (first.reference_source, first.candidate_source) == (line_of("cache"), line_of("cache")), repr(found)
    assert first.candidate_only_before == (("CacheCat/mul#1_outputs", line_of("port scale")),), first
    assert f"Just before it, the candidate recorded CacheCat/mul#1_outputs ({line_of('port scale')})" in repr(found)


def test_the_sessions_answer_names_it_too(settings: Settings) -> None:
    """The same in the session's report of two summary captures: its first divergence's `candidate_only_before`
    was empty, the empty tensor's pair taken as the last pair before it."""
    x = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(5))
    for run, port in (("reference", False), ("candidate", True)):
        model = CacheCat(port)
        with torch.no_grad(), capture(model, "cache", run, data_dir=settings.data_dir, level="op", values="summary"):
            model(x)
    services = open_services(settings)
    try:
        with services.sessions() as db:
            session_id = db.scalars(select(SessionRecord.id).where(SessionRecord.name == "cache")).one()
        services.plan(session_id)
        services.compute(session_id)
        with services.sessions() as db:
            report = session_pairs(db, session_id)
    finally:
        services.close()
    first = report.first_divergence
    assert first is not None and first.name == "CacheCat/cat#1_outputs", first
    assert first.candidate_only_before == [f"CacheCat/mul#1_outputs ({line_of('port scale')})"], first


class HalfScores(nn.Module):
    """Attention probabilities; the port computes its scores in bfloat16 (casts of its own, no autocast)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k = nn.Linear(D, D), nn.Linear(D, D)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.q(x), self.k(x).transpose(-1, -2)
        s = (q.bfloat16() @ k.bfloat16()).float() if self.port else q @ k  # half
        return cast(torch.Tensor, (s * D**-0.5).softmax(-1))


def test_a_port_computing_its_scores_in_bfloat16_is_told_where_that_begins(settings: Settings) -> None:
    """Said too little (Gemma2's scores cast to bfloat16 in a port): "no divergence beyond the precision floor of
    bfloat16", rightly (rounding only), and that the candidate computes parts of its forward in bfloat16, but not
    where. Now the first of its recorded tensors in bfloat16 where the reference's is not, with its line."""
    x = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(5))
    reference, candidate = HalfScores(False).eval(), HalfScores(True).eval()
    found = find_divergence(reference, candidate, x, session="half", data_dir=settings.data_dir)
    assert found.first is None and found.floor == "bfloat16", repr(found)
    assert found.lowered_first == ("HalfScores/bfloat16#1_outputs", line_of("half")), repr(found)
    assert (
        f"from HalfScores/bfloat16#1_outputs ({line_of('half')}) on, the first of its recorded tensors in bfloat16"
        in repr(found)
    )


class HalvesSwapped(nn.Module):
    """Queries whose first half is turned by position angles and second half passed (a partial rotary); the port
    turns the second half and passes the first."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k = nn.Linear(D, D), nn.Linear(D, D)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(x)
        if self.port:
            rot = q[..., D // 2 :]  # port rot
            kept = q[..., : D // 2]  # port kept
        else:
            rot = q[..., : D // 2]  # rot
            kept = q[..., D // 2 :]  # kept
        angles = torch.arange(x.shape[1], dtype=x.dtype)[:, None] * 0.3
        q = torch.cat([rot * angles.cos() + rot.flip(-1) * angles.sin(), kept], -1)
        return cast(torch.Tensor, (q @ self.k(x).transpose(-1, -2)).softmax(-1))


def test_slices_swapped_in_use_are_named_at_their_lines(settings: Settings) -> None:
    """Said too little (Phi's rotated and passed halves swapped): the rotary's multiply was named at its line, but
    the slices, holding the same values on both sides and paired by content across call indices, nowhere. Now each
    crossed pair, with both sides' lines."""
    x = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(5))
    reference, candidate = HalvesSwapped(False).eval(), HalvesSwapped(True).eval()
    found = find_divergence(reference, candidate, x, session="halves", data_dir=settings.data_dir)
    first = found.first
    assert first is not None and first.module == "HalvesSwapped", repr(found)
    crossed = {
        ("HalvesSwapped/getitem#1_outputs", line_of("rot"), "HalvesSwapped/getitem#2_outputs", line_of("port kept")),
        ("HalvesSwapped/getitem#2_outputs", line_of("kept"), "HalvesSwapped/getitem#1_outputs", line_of("port rot")),
    }
    assert set(first.crossed_before) == crossed, first
    assert "ops paired by content across call indices" in repr(found)


# --- transformers models against a copy of their own modeling file with one line changed ----------------------------


@pytest.fixture(scope="module")
def ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str, str, str, str], Port]]:
    with port_writer(tmp_path_factory.mktemp("ports")) as write:
        yield lambda family, tag, old, new: write(family, f"port9_{family}_{tag}", old, new)


SMALL: dict[str, Any] = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)
IDS = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))


def test_smollm3_turning_the_keys_of_a_layer_without_rotary(settings: Settings, ports: Callable[..., Port]) -> None:
    """SmolLM3's NoPE layer (no rotary) turned by the port: the first divergence, the cache's `cat` of the keys, was
    named with nothing before it; the port's rotary ops now, at their lines in the port."""
    port = ports("smollm3", "rope", "        if self.use_rope:\n", "        if True:  # rotary everywhere\n")
    config = config_of(
        "SmolLM3Config",
        **SMALL,
        num_hidden_layers=2,
        no_rope_layers=[1, 0],
        use_sliding_window=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    reference, candidate = jittered_pair(port, "SmolLM3ForCausalLM", config)
    found = find_divergence(reference, candidate, {"input_ids": IDS}, session="smollm3", data_dir=settings.data_dir)
    first = found.first
    attention = "SmolLM3ForCausalLM.model.layers.1.self_attn"
    assert first is not None and first.module == attention, repr(found)
    extra = dict(first.candidate_only_before)
    rotated = port.lines("q_embed = (q * cos) + (rotate_half(q) * sin)")[1]
    assert extra.get(f"{attention}/add#1_outputs") == rotated, first
    assert found.culprits == [attention], repr(found)


def test_fnet_taking_the_imaginary_part_of_its_fourier_transform(
    settings: Settings, ports: Callable[..., Port]
) -> None:
    """FNet's `.real` as `.imag`: the getter was not recorded, so its module's output was named at the line calling
    the module; now each side's getter, at the line of the bug."""
    port = ports(
        "fnet",
        "imag",
        "outputs = self.fourier_transform(hidden_states).real",
        "outputs = self.fourier_transform(hidden_states).imag",
    )
    config = config_of(
        "FNetConfig",
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        intermediate_size=32,
        max_position_embeddings=32,
        use_tpu_fourier_optimizations=False,
    )
    reference, candidate = jittered_pair(port, "FNetModel", config)
    found = find_divergence(reference, candidate, {"input_ids": IDS}, session="fnet", data_dir=settings.data_dir)
    first = found.first
    fourier = "FNetModel.encoder.layer.0.fourier.self"
    assert first is not None and first.module == fourier, repr(found)
    lines = port.lines("self.fourier_transform(hidden_states).real", "self.fourier_transform(hidden_states).imag")
    assert (f"{fourier}/real#1_outputs", lines[0]) in first.reference_only_before, first
    assert (f"{fourier}/imag#1_outputs", lines[1]) in first.candidate_only_before, first
    assert found.culprits == [fourier], repr(found)


def test_mamba2_gating_its_norm_by_sigmoid_for_silu(settings: Settings, ports: Callable[..., Port]) -> None:
    """Right, kept: Mamba2's gated RMSNorm (a state-space model's mixer, no attention), the port's gate a sigmoid:
    the norm's multiply at its line on both sides, both gates named, the norm as the culprit though its ops pair by
    position ambiguously."""
    port = ports(
        "mamba2",
        "gate",
        "hidden_states = hidden_states * nn.functional.silu(gate.to(torch.float32))",
        "hidden_states = hidden_states * torch.sigmoid(gate.to(torch.float32))",
    )
    config = config_of(
        "Mamba2Config",
        vocab_size=64,
        hidden_size=16,
        state_size=8,
        num_hidden_layers=1,
        num_heads=4,
        head_dim=8,
        expand=2,
        n_groups=1,
        conv_kernel=4,
        chunk_size=4,
    )
    reference, candidate = jittered_pair(port, "Mamba2ForCausalLM", config)
    found = find_divergence(reference, candidate, {"input_ids": IDS}, session="mamba2", data_dir=settings.data_dir)
    first = found.first
    norm = "Mamba2ForCausalLM.backbone.layers.0.mixer.norm"
    assert first is not None and first.reference == f"{norm}/mul#1_outputs", repr(found)
    lines = port.lines("nn.functional.silu(gate.to(torch.float32))", "torch.sigmoid(gate.to(torch.float32))")
    assert (first.reference_source, first.candidate_source) == lines, repr(found)
    assert (f"{norm}/silu#1_outputs", lines[0]) in first.reference_only_before, first
    assert (f"{norm}/sigmoid#1_outputs", lines[1]) in first.candidate_only_before, first
    assert found.culprits == [norm], repr(found)


def test_convnextv2_normalising_its_response_over_the_wrong_dims(
    settings: Settings, ports: Callable[..., Port]
) -> None:
    """Right, kept: ConvNeXt-V2's global response norm (channels last) over (H, C) for (H, W): its norm and mean of
    other shapes named as each side's own with their lines, the first pair that differs just after them, the GRN
    as the culprit."""
    port = ports(
        "convnextv2",
        "grn",
        "torch.linalg.vector_norm(hidden_states, ord=2, dim=(1, 2), keepdim=True)",
        "torch.linalg.vector_norm(hidden_states, ord=2, dim=(2, 3), keepdim=True)",
    )
    config = config_of("ConvNextV2Config", hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32)
    reference, candidate = jittered_pair(port, "ConvNextV2Model", config)
    image = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    found = find_divergence(reference, candidate, image, session="convnextv2", data_dir=settings.data_dir)
    first = found.first
    grn = "ConvNextV2Model.encoder.stages.0.layers.0.grn"
    assert first is not None and first.reference == f"{grn}/mul#1_outputs", repr(found)
    lines = port.lines("dim=(1, 2), keepdim=True)", "dim=(2, 3), keepdim=True)")
    assert (f"{grn}/linalg_vector_norm#1_outputs", lines[0]) in first.reference_only_before, first
    assert (f"{grn}/linalg_vector_norm#1_outputs", lines[1]) in first.candidate_only_before, first
    assert found.culprits == [grn], repr(found)
