"""Plain stage dumps of a real model run: a tiny Llama's layers' stages saved by forward hooks as
`{layer}_{stage}.pth` (README's dump naming, engine/stages.py's STAGE_ORDER)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.support.traces import input_ids

BUG_STAGE = "1_post_attn_pre_resid"  # the output of layer 1's o_proj, which traces.SCALED scales by 1.05


def dump_stages(model: Any, folder: Path) -> Path:
    """Each layer's stages as `{layer}_{stage}.pth` (README's dump naming), recorded by forward hooks."""
    folder.mkdir()
    hooks = []

    def keep(name: str, take_input: bool = False) -> Any:
        def hook(module: Any, args: tuple[Any, ...], result: Any) -> None:
            value = args[0] if take_input else result
            value = value[0] if isinstance(value, tuple) else value
            torch.save(value.detach().clone(), folder / f"{name}.pth")

        return hook

    for n, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        for module, stage, take_input in (
            (layer.input_layernorm, "post_ln_pre_attn", False),
            (attn.q_proj, "query", False),
            (attn.k_proj, "key", False),
            (attn.v_proj, "value", False),
            (attn.o_proj, "post_attn", True),
            (attn.o_proj, "post_attn_pre_resid", False),
            (layer.post_attention_layernorm, "pre_mlp", False),
            (layer.mlp, "post_mlp", False),
        ):
            hooks.append(module.register_forward_hook(keep(f"{n}_{stage}", take_input)))
    with torch.no_grad():
        model(input_ids())
    for hook in hooks:
        hook.remove()
    return folder
