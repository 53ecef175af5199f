"""`find_divergence` on ports in a lower precision (float16, bfloat16) of a float32 reference: the precision floor
(live/precision_floor.py) keeps rounding from being named a divergence or a culprit, and a bug planted in layer 2
is still named there (bench/RESULTS.md, "answers on unseen models, round 6": before the floor, a port with no bug
named layer 0 its culprit)."""

from __future__ import annotations

from typing import cast

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the name models use)
from tensor_debugger import find_divergence
from tensor_debugger.demo.models import LayerStack
from tensor_debugger.settings import Settings
from torch import nn

from tests.support.traces import MODEL_CLASS, SCALED, input_ids, tiny_llama

D, H = 16, 4


class Block(nn.Module):
    """A linear layer and its activation: GELU, or (the bug) SiLU."""

    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(D, D)
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        return F.silu(h) if self.bug else F.gelu(h)


class Stack(LayerStack):
    """Three blocks; the bug, where planted, in layer 2."""

    def __init__(self, bug: bool = False) -> None:
        torch.manual_seed(0)
        super().__init__(Block(bug and i == 2) for i in range(3))


class Attention(nn.Module):
    """Multi-head self-attention with a residual; the bug scales the scores by 1/d instead of 1/sqrt(d)."""

    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
        scale = (D // H) ** (-1.0 if self.bug else -0.5)
        weights = torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1)
        return cast(torch.Tensor, x + self.out((weights @ v).transpose(1, 2).reshape(b, t, D)))


class AttentionStack(LayerStack):
    def __init__(self, bug: bool = False) -> None:
        torch.manual_seed(0)
        super().__init__(Attention(bug and i == 2) for i in range(3))


MODELS = {"mlp": (Stack, (4, D)), "attention": (AttentionStack, (2, 6, D))}
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _inputs(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_a_port_in_lower_precision_with_no_bug_names_no_divergence_and_says_why(
    settings: Settings, model: str, dtype: str
) -> None:
    make, shape = MODELS[model]
    reference, candidate = make().eval(), make().to(DTYPES[dtype]).eval()
    found = find_divergence(reference, candidate, (_inputs(shape),), session="floor", data_dir=settings.data_dir)
    assert found.first is None
    assert found.culprits == []
    assert found.floor == dtype
    assert found.within_floor > 0  # tolerances alone would have failed these pairs
    words = found.words()
    assert f"no divergence beyond the precision floor of {dtype}" in words
    assert "within the precision floor: rounding to the lower precision" in words


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_a_bug_in_layer_2_of_a_port_in_lower_precision_is_named_there(
    settings: Settings, model: str, dtype: str
) -> None:
    make, shape = MODELS[model]
    reference, candidate = make().eval(), make(bug=True).to(DTYPES[dtype]).eval()
    found = find_divergence(reference, candidate, (_inputs(shape),), session="floor", data_dir=settings.data_dir)
    assert found.first is not None
    root = type(reference).__name__
    assert found.first.module.startswith(f"{root}.layers.2"), found.words()
    assert found.culprits and all(c.startswith(f"{root}.layers.2") for c in found.culprits), found.words()
    assert all(".layers.2" in s.reference for s in found.failing_full), found.words()
    assert found.floor == dtype


def test_without_the_floor_rounding_is_judged_by_tolerances_alone(settings: Settings) -> None:
    """`precision_floor=False`: the answer the floor corrects (float16 rounding of layer 0 named a divergence)."""
    reference, candidate = Stack().eval(), Stack().half().eval()
    found = find_divergence(
        reference, candidate, (_inputs((4, D)),), session="off", data_dir=settings.data_dir, precision_floor=False
    )
    assert found.first is not None
    assert found.first.module == "Stack.layers.0.linear"
    assert found.floor is None
    assert "precision floor" not in found.words()


def test_models_of_one_dtype_have_no_floor(settings: Settings) -> None:
    found = find_divergence(
        Stack().eval(), Stack(bug=True).eval(), (_inputs((4, D)),), session="same", data_dir=settings.data_dir
    )
    assert found.floor is None
    assert found.first is not None and found.first.module.startswith("Stack.layers.2")


class Inverse(nn.Module):
    """Multiplies by the inverse of a parameter; torch has no float16 inverse on the host, so the port inverts in
    float32."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.m = nn.Parameter(torch.eye(D) + 0.1 * torch.randn(D, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.m
        inverse = torch.linalg.inv(m.float()).to(m.dtype) if m.dtype != torch.float32 else torch.linalg.inv(m)
        out: torch.Tensor = x.to(m.dtype) @ inverse
        return out


class ReferenceInverse(Inverse):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x @ torch.linalg.inv(self.m)
        return out


def test_a_reference_that_cannot_run_in_the_lower_precision_is_said_and_tolerances_judge(settings: Settings) -> None:
    found = find_divergence(
        ReferenceInverse().eval(),
        Inverse().half().eval(),
        (_inputs((4, D)),),
        session="inv",
        data_dir=settings.data_dir,
    )
    assert found.floor is None
    assert found.floor_note is not None and "(the precision floor) raised" in found.floor_note
    assert "pairs were judged by tolerances alone" in found.words()


@pytest.mark.parametrize(("dtype", "scale"), [(torch.bfloat16, None), (torch.float16, SCALED)])
def test_a_tiny_transformers_llama_in_lower_precision(
    settings: Settings, dtype: torch.dtype, scale: str | None
) -> None:
    """A 2-layer Llama (transformers, random weights) in float32 against itself in a lower precision: with no bug,
    no culprit (tolerances alone named the model and layer 0's projections from float16, rotary's cast from
    bfloat16); with layer 1's o_proj scaled 5%, that projection."""
    found = find_divergence(
        tiny_llama().eval(),
        tiny_llama(dtype=dtype, scale=scale).eval(),
        (input_ids(),),
        session="llama",
        data_dir=settings.data_dir,
    )
    assert found.floor == str(dtype).removeprefix("torch.")
    if scale is None:
        assert found.first is None and found.culprits == [], found.words()
    else:
        assert found.first is not None, found.words()
        assert found.first.reference == f"{MODEL_CLASS}.model.layers.1.self_attn.o_proj/linear#1_outputs"
        assert found.culprits == [f"{MODEL_CLASS}.model.layers.1.self_attn.o_proj"]


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.proj(x)) * scale.to(x.dtype)


class Regional(nn.Module):
    """Two blocks; the port runs the second's MLP under a bfloat16 autocast region, and with `bug` scales the first
    block's projection by 1.004 (within 4 times bfloat16's rounding, far outside float32's tolerance)."""

    def __init__(self, port: bool, bug: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Linear(16, 16)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.gate = Gate()
        self.port, self.bug = port, bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.first(x)
        if self.bug:
            h = h * 1.004  # scaled
        if self.port:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return cast(torch.Tensor, self.gate(self.mlp(h), scale=h)).float() + h  # gate by keyword
        return cast(torch.Tensor, self.gate(self.mlp(h), scale=h)) + h


def test_an_autocast_floor_covers_only_the_modules_the_candidate_lowers(settings: Settings) -> None:
    """The reference runs under autocast only in the forward of the modules where the candidate computes in
    bfloat16 (the MLP's), so a small bug before the region is judged by float32's tolerance, not passed as rounding;
    the region's own rounding still names no divergence."""
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
    reference = Regional(False).eval()
    clean = find_divergence(reference, Regional(True).eval(), x, session="regional clean", data_dir=settings.data_dir)
    assert clean.first is None and clean.floor_autocast and not clean.culprits, repr(clean)
    assert clean.floor_region == ("gate", "gate.proj", "mlp.0", "mlp.1", "mlp.2"), clean.floor_region
    assert "with torch.autocast to bfloat16 in the forward of gate, gate.proj, mlp.0, mlp.1, mlp.2 only" in repr(clean)
    assert clean.within_floor, repr(clean)  # the region's rounding, judged against the floor's
    found = find_divergence(
        reference, Regional(True, bug=True).eval(), x, session="regional bug", data_dir=settings.data_dir
    )
    assert found.first is not None and found.first.reference == "Regional.mlp_inputs_args_0", repr(found)
    assert found.first.candidate_only_before[0][0] == "Regional/mul#1_outputs", repr(found)


class Lowered(nn.Module):
    """A block whose own matmul and child run under a bfloat16 autocast region in the port, its output cast back
    to float32 there (`.float()`), as a port ends its region before a float32 layer."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16) / 4)
        self.child = nn.Linear(16, 16)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.port:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return cast(torch.Tensor, self.child(torch.tanh(x @ self.w))).float()
        return cast(torch.Tensor, self.child(torch.tanh(x @ self.w)))


class Around(nn.Module):
    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.pre, self.block, self.post = nn.Linear(16, 16), Lowered(port), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.post(self.block(self.pre(x))))


@pytest.mark.parametrize("level", ["op", "module"])
def test_an_autocast_region_ending_in_a_cast_before_a_float32_layer_is_rounding_only(
    settings: Settings, level: str
) -> None:
    """The region's module's outputs go back to float32 in the floor as the candidate's do (the reference has no
    such cast: its float32 `post` would meet a bfloat16 input); a module capture, which cannot see the block's own
    code, runs the whole reference under autocast."""
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
    found = find_divergence(
        Around(False).eval(),
        Around(True).eval(),
        x,
        session=f"around {level}",
        data_dir=settings.data_dir,
        level=level,
    )
    assert found.first is None and found.floor_autocast and found.floor_note is None, repr(found)
    assert found.floor_region == (("block", "block.child") if level == "op" else ()), found.floor_region


class CastByCaller(nn.Module):
    """A child Linear under a bfloat16 autocast region in the port, its output cast back by the caller
    (`self.post(self.block(x).float())`); with `bug`, the port scales the region's input by 1.004 first."""

    def __init__(self, port: bool, bug: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.block, self.post = nn.Sequential(nn.Linear(16, 16)), nn.Linear(16, 16)
        self.port, self.bug = port, bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.port:
            return cast(torch.Tensor, self.post(self.block(x)))
        if self.bug:
            x = x * 1.004  # scaled
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h: torch.Tensor = self.block(x)
        return cast(torch.Tensor, self.post(h.float()))


def test_a_region_whose_caller_casts_its_output_back_keeps_the_floor_to_the_region(settings: Settings) -> None:
    """The floor casts the region's outermost module's outputs back (bfloat16 to float32 is exact), so the
    reference's float32 `post` runs as the candidate's does, and the floor stays the region's (widened to the whole
    forward, a bug before the region would pass as rounding)."""
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
    reference = CastByCaller(False).eval()
    clean = find_divergence(
        reference, CastByCaller(True).eval(), x, session="cast by caller", data_dir=settings.data_dir
    )
    assert clean.first is None and clean.floor_region == ("block.0",) and clean.floor_widened is None, repr(clean)
    found = find_divergence(
        reference, CastByCaller(True, bug=True).eval(), x, session="cast by caller bug", data_dir=settings.data_dir
    )
    assert found.first is not None and found.first.reference == "CastByCaller.block_inputs_args_0", repr(found)
    assert found.floor_widened is None, repr(found)
