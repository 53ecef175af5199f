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
    (or STAGE_ALIASES), each at a place of its own. Others (`attn_scores`, `rotary_cos`) are sorted by name, which
    says nothing of which ran first."""
    distinct = set(stages)
    if len(distinct) <= 1:
        return True
    ranks = [_RANK.get(stage) if stage is not None else None for stage in distinct]
    return None not in ranks and len(set(ranks)) == len(ranks)


def unordered_words(layer: int | None, stages: Iterable[str | None]) -> str:
    """Why a layer's stages have no known order, in words (for `stages_ordered`'s False): the stages it holds that
    are not in STAGE_ORDER (nor aliases of one), or else those that name one place twice."""
    held = {s for s in stages if s is not None}
    where = f"layer {layer}'s" if layer is not None else "the"
    unknown = sorted((s for s in held if s not in _RANK), key=natural_key)
    if not unknown:
        places: dict[int, list[str]] = {}
        for stage in held:
            places.setdefault(_RANK[stage], []).append(stage)
        twice = sorted((s for same in places.values() if len(same) > 1 for s in same), key=natural_key)
        return (
            f"{where} stages {', '.join(twice)} name one place in the transformer stage order, so which ran first "
            "is not known"
        )
    listed = ", ".join(unknown[:-1]) + f" and {unknown[-1]}" if len(unknown) > 1 else "".join(unknown)
    one = len(unknown) == 1
    return (
        f"{where} stage{'' if one else 's'} {listed} {'is' if one else 'are'} not in the transformer stage order, "
        f"so {'its' if one else 'their'} place among the layer's stages is not known (stages are listed by name)"
    )
