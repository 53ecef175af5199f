"""Execution order: by layer, then by the known transformer stage order, unknown stages after in natural order."""

from __future__ import annotations

from tensor_debugger.engine.names import natural_key

STAGE_ORDER = (
    "post_ln_pre_attn", "query", "query_final", "key", "key_final", "value", "value_final", "post_attn",
    "scaling", "sliding", "post_attn_pre_resid", "pre_mlp", "post_mlp",
)  # fmt: skip
_RANK = {stage: i for i, stage in enumerate(STAGE_ORDER)}

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
