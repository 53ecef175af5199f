"""Execution order: by layer, then by the known transformer stage order, unknown stages after in natural order
(an order that is not known: `stages_ordered` says where the order of a layer's stages is known)."""

from __future__ import annotations

from collections.abc import Iterable

from tensor_debugger.engine.names import natural_key

STAGE_ORDER = (
    "post_ln_pre_attn", "query", "query_final", "key", "key_final", "value", "value_final", "post_attn",
    "scaling", "sliding", "post_attn_pre_resid", "pre_mlp", "post_mlp",
)  # fmt: skip
# Other names of those stages: a Hugging Face decoder layer's modules (Llama, Mistral, Qwen: a dump written by
# forward hooks named after the module), and the attention and MLP blocks' outputs. An alias shares its stage's
# place, so a dump holding both (`0_o_proj`, `0_post_attn_pre_resid`) has no known order between the two.
STAGE_ALIASES = {
    "input_layernorm": "post_ln_pre_attn",
    "q_proj": "query",
    "k_proj": "key",
    "v_proj": "value",
    "o_proj": "post_attn_pre_resid",
    "self_attn": "post_attn_pre_resid",
    "attn": "post_attn_pre_resid",
    "attn_out": "post_attn_pre_resid",
    "post_attention_layernorm": "pre_mlp",
    "mlp": "post_mlp",
    "mlp_out": "post_mlp",
}
_RANK = {stage: i for i, stage in enumerate(STAGE_ORDER)} | {
    alias: STAGE_ORDER.index(stage) for alias, stage in STAGE_ALIASES.items()
}
# Aliases that name a whole block, not one place in it: a dump's `0_attn` is the attention's output where a forward
# hook on the module wrote it, but some name the attention's input so (and `0_mlp` the MLP's). They sort at the
# block's output, and are ordered against each other (attention before MLP in every standard block) and against
# the stages outside their block, where input or output alike ran after the stages before the block's input and
# before those after its output (the block's input itself, `post_ln_pre_attn`, holds the same value as a block
# name that means the input: naming either first names that value). Against a stage inside the block (`query`,
# `o_proj`, `attn_out`), or another name of the block, which ran first is not known.
BLOCK_ALIASES = {"attn": "attention", "self_attn": "attention", "mlp": "MLP"}
_INSIDE = {  # the places of STAGE_ORDER inside each block: after its input, up to its output
    "attention": range(STAGE_ORDER.index("query"), STAGE_ORDER.index("post_attn_pre_resid") + 1),
    "MLP": range(STAGE_ORDER.index("pre_mlp") + 1, STAGE_ORDER.index("post_mlp") + 1),
}

SortKey = tuple[object, ...]


def stage_rank(stage: str | None) -> SortKey:
    if stage is None:
        return (2,)
    if stage in _RANK:
        return (0, _RANK[stage])
    return (1, natural_key(stage))


def execution_key(layer: int | None, stage: str | None, position: int, name: str) -> SortKey:
    """Tensors with a layer come in layer and stage order; the others keep the order of their run's files
    (their position), after the layered ones."""
    if layer is None:
        return (1, position, natural_key(name))
    return (0, layer, stage_rank(stage), position, natural_key(name))


def stages_ordered(stages: Iterable[str | None]) -> bool:
    """Whether the execution order of one layer's `stages` is known: a single stage, or only stages of STAGE_ORDER
    (or STAGE_ALIASES), each at a place of its own, and no name of a whole block (BLOCK_ALIASES) beside a stage
    inside that block. Others (`attn_scores`, `rotary_cos`) are sorted by name, which says nothing of which ran
    first."""
    distinct = set(stages)
    if len(distinct) <= 1:
        return True
    ranks = [_RANK.get(stage) if stage is not None else None for stage in distinct]
    return None not in ranks and len(set(ranks)) == len(ranks) and not _inside_named_blocks(distinct)


def _inside_named_blocks(held: Iterable[str | None]) -> dict[str, list[str]]:
    """Each block name (BLOCK_ALIASES) among `held` with the stages of `held` inside its block (other names of the
    block included), where there are any."""
    known = {s for s in held if s is not None and s in _RANK}
    found: dict[str, list[str]] = {}
    for name in sorted(known & BLOCK_ALIASES.keys()):
        block = BLOCK_ALIASES[name]
        inside = [
            s
            for s in known - {name}
            if BLOCK_ALIASES.get(s) == block or (s not in BLOCK_ALIASES and _RANK[s] in _INSIDE[block])
        ]
        if inside:
            found[name] = sorted(inside, key=natural_key)
    return found


def unordered_words(layer: int | None, stages: Iterable[str | None]) -> str:
    """Why a layer's stages have no known order, in words (for `stages_ordered`'s False): the stages it holds that
    are not in STAGE_ORDER (nor aliases of one), or else those that name one place twice."""
    held = {s for s in stages if s is not None}
    where = f"layer {layer}'s" if layer is not None else "the"
    unknown = sorted((s for s in held if s not in _RANK), key=natural_key)
    blocks = _inside_named_blocks(held)
    if not unknown and blocks:
        name, inside = next(iter(blocks.items()))
        return (
            f"{where} stage {name} names the whole {BLOCK_ALIASES[name]} block (its input or its output) and the "
            f"layer also holds {_listed(inside)}, inside that block, so which ran first is not known"
        )
    if not unknown:
        places: dict[int, list[str]] = {}
        for stage in held:
            places.setdefault(_RANK[stage], []).append(stage)
        twice = sorted((s for same in places.values() if len(same) > 1 for s in same), key=natural_key)
        return (
            f"{where} stages {', '.join(twice)} name one place in the transformer stage order, so which ran first "
            "is not known"
        )
    one = len(unknown) == 1
    return (
        f"{where} stage{'' if one else 's'} {_listed(unknown)} {'is' if one else 'are'} not in the transformer stage "
        f"order, so {'its' if one else 'their'} place among the layer's stages is not known (stages are listed by "
        "name)"
    )


def _listed(names: list[str]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)
