"""Tensor names, and the layer and stage parsed from them.

A dump file named `{layer}_{stage}.pth` (e.g. `3_post_attn_pre_resid.pth`, anywhere in an archive) gives layer 3
and stage "post_attn_pre_resid"; a tensor-parallel shard suffix (`_rank2`, `_tp2`) is not part of the stage.
Module paths such as `model.layers.7.mlp` give the layer alone.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import PurePosixPath

_LAYER_STAGE = re.compile(r"^(\d+)_([A-Za-z][\w.\-]*)$")
_SHARD_SUFFIX = re.compile(r"_(?:rank|tp)\d+$", re.IGNORECASE)
_PREFIXES = ("orig.mod.", "module.", "model.", "transformer.", "base.model.")  # after normalising separators
# a leading model class name: LlamaForCausalLM., GPT2Model/ (two capitals and a small letter, at least)
CLASS_NAME = re.compile(r"^(?=[A-Za-z0-9]*[a-z])(?=[A-Z][A-Za-z0-9]*[A-Z])[A-Za-z0-9]+[./]")
# the files of a checkpoint as save_pretrained (sharded or not) and Meta's consolidated checkpoints name them
CHECKPOINT_FILE = re.compile(
    r"^(?:(?:model|pytorch_model|adapter_model|diffusion_pytorch_model)(?:-\d{5}-of-\d{5})?\.(?:safetensors|bin)"
    r"|consolidated(?:\.\d+)?\.pth)$"
)
_MODULE_LAYER = re.compile(r"(?:^|[./_])(?:layers?|blocks?|h)[._](\d+)(?:$|[./_])")


def tensor_name(relpath: PurePosixPath, key_path: tuple[str, ...]) -> str:
    """`dir/3_query` for dir/3_query.pth; `weights.model.layers.0.w` for key `model.layers.0.w` of
    weights.safetensors; but `model.layers.0.w` alone (`dir/model.layers.0.w` in a folder) where the file is one of a
    checkpoint's (`CHECKPOINT_FILE`), whose keys are the names, whichever shard holds them."""
    if key_path and CHECKPOINT_FILE.match(relpath.name):
        keys = ".".join(key_path)
        return keys if str(relpath.parent) == "." else f"{relpath.parent}/{keys}"
    stem = str(relpath.with_suffix("")) if relpath.suffix else str(relpath)
    return ".".join((stem, *key_path)) if key_path else stem


def parse_layer_stage(relpath: PurePosixPath, key_path: tuple[str, ...]) -> tuple[int | None, str | None]:
    stem = relpath.stem if relpath.suffix else relpath.name
    found = _LAYER_STAGE.match(stem)
    if found:
        stage = _SHARD_SUFFIX.sub("", found.group(2))
        return int(found.group(1)), stage
    keyed = _LAYER_STAGE.match(key_path[-1]) if len(key_path) == 1 else None
    if keyed:  # one file holding {"3_query": ...}, as a folder of 3_query.pth would
        return int(keyed.group(1)), _SHARD_SUFFIX.sub("", keyed.group(2))
    module = _MODULE_LAYER.search(".".join((stem, *key_path)))
    if module:
        return int(module.group(1)), None
    return None, None


def module_layer(module_path: str) -> int | None:
    """The layer of a module path (`model.layers.7.mlp` -> 7), or of a captured op's (`model.layers.7/add#1`)."""
    found = _MODULE_LAYER.search(module_path.partition("/")[0])
    return int(found.group(1)) if found else None


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders "10_x" after "9_x"."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text) if part)


@lru_cache(maxsize=1 << 17)  # each name is normalised by several strategies, on both sides
def normalize(name: str) -> str:
    """Lower case, one separator, no common wrapper prefixes (`model.`, `module.`, `_orig_mod.`,
    `transformer.`) and no leading model class name (`LlamaForCausalLM.`)."""
    name = CLASS_NAME.sub("", name)
    text = re.sub(r"[\s/\\\-_.:]+", ".", name.lower()).strip(".")
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if text.startswith(prefix):
                text, changed = text[len(prefix) :], True
    return text
