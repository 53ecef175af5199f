"""Real Hugging Face debugger traces of a tiny randomly initialised Llama, built from a config (no download).

Seeded, so two calls with the same arguments write the same tensors bit for bit; `perturb` adds a planted change to
one weight so its module is where the error starts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.built_once import built_once

LAYERS = 2
MODEL_CLASS = "LlamaForCausalLM"


def tiny_llama(
    attention: str = "eager",
    layers: int = LAYERS,
    perturb: str | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    scale: str | None = None,
    inner_bug: bool = False,
) -> Any:
    """A 2-layer Llama with hidden size 32; `perturb` names a parameter (`model.layers.1.mlp.down_proj.weight`)
    that gets 0.05 added to every element; `scale` one multiplied by 1.05 (a 5% bug in its module's output, the
    projections having no bias); `inner_bug`, layer 1's attention output multiplied by 1.05 before its o_proj (a
    bug in the attention block's own code, in no module of its own); `dtype`, the precision it runs in (cast after
    it is built)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    make_config: Callable[..., Any] = LlamaConfig  # typed in some transformers releases, not in others
    config = make_config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    config._attn_implementation = attention
    torch.manual_seed(seed)
    model: torch.nn.Module = LlamaForCausalLM(config).eval()  # type: ignore[no-untyped-call]  # transformers is untyped
    if perturb is not None:
        with torch.no_grad():
            model.get_parameter(perturb).add_(0.05)
    if scale is not None:
        with torch.no_grad():
            model.get_parameter(scale).mul_(1.05)
    if inner_bug:  # a pre-hook runs before the debugger's (or a capture's) record of o_proj's inputs
        model.get_submodule("model.layers.1.self_attn.o_proj").register_forward_pre_hook(
            lambda module, args: (args[0] * 1.05,)
        )
    return model.to(dtype)


def input_ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(seed))


def write_trace(
    folder: Path,
    attention: str = "eager",
    layers: int = LAYERS,
    perturb: str | None = None,
    use_repr: bool = False,
    prune_layers: bool = True,
    dtype: torch.dtype = torch.float32,
    scale: str | None = None,
    inner_bug: bool = False,
) -> Path:
    """Run the model once under transformers' model_addition_debugger_context into `folder`."""
    from transformers.model_debugging_utils import model_addition_debugger_context

    model = tiny_llama(attention, layers, perturb, dtype=dtype, scale=scale, inner_bug=inner_bug)
    with (
        torch.no_grad(),
        model_addition_debugger_context(model, debug_path=str(folder), use_repr=use_repr, do_prune_layers=prune_layers),
    ):
        model(input_ids())
    return folder


PERTURBED = "model.layers.1.mlp.down_proj.weight"
SCALED = "model.layers.1.self_attn.o_proj.weight"  # the 5% bug of the bf16 runs

# The traces the tests read, by name: write_trace's arguments for each.
TRACES: dict[str, dict[str, Any]] = {
    "eager": {},
    "sdpa": {"attention": "sdpa"},
    "perturbed": {"perturb": PERTURBED},
    "repr": {"use_repr": True},
    "repr_perturbed": {"use_repr": True, "perturb": PERTURBED},
    "four_layers": {"layers": 4},
    "bf16": {"dtype": torch.bfloat16},  # fp32 against it: every module adds a little rounding error
    "bf16_bug": {"dtype": torch.bfloat16, "scale": SCALED},
    "bf16_inner_bug": {"dtype": torch.bfloat16, "inner_bug": True},
}


class WrittenTraces:
    """The traces of TRACES, each written the first time a test of the run asks for it, once for the run
    (tests/support/built_once.py: not once per pytest worker, each importing transformers' debugger and running the
    model); tests only read them."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.factory = tmp_path_factory
        self.written: dict[str, Path] = {}

    def __getitem__(self, name: str) -> Path:
        if name not in self.written:

            def write(folder: Path) -> dict[str, Any]:
                write_trace(folder, **TRACES[name])
                return {}

            self.written[name] = built_once(self.factory, f"trace-{name}", write)[0]
        return self.written[name]
