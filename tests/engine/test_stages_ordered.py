"""engine/stages.py: where the execution order of one layer's stages is known."""

from __future__ import annotations

import pytest
from tensor_debugger.engine.stages import stages_ordered, unordered_words


@pytest.mark.parametrize(
    ("stages", "ordered"),
    [
        (["post_mlp", "query", "post_attn"], True),  # the README's stages
        (["mlp", "o_proj", "post_attention_layernorm", "q_proj"], True),  # a Llama layer's modules
        (["attn", "mlp"], True),
        (["hidden"], True),  # one stage: nothing to order
        (["hidden", "hidden"], True),
        (["attn_scores", "post_attn"], False),  # attn_scores: no known stage
        (["attn_probs", "attn_scores"], False),
        (["o_proj", "post_attn_pre_resid"], False),  # two names of one place
        (["query", None], False),
    ],
)
def test_stages_ordered(stages: list[str | None], ordered: bool) -> None:
    assert stages_ordered(stages) is ordered


def test_unordered_words_name_the_unknown_stages() -> None:
    assert unordered_words(3, ["attn_scores", "query", "attn_probs"]) == (
        "layer 3's stages attn_probs and attn_scores are not in the transformer stage order, so their place among "
        "the layer's stages is not known (stages are listed by name)"
    )
    assert unordered_words(0, ["rotary_cos", "query"]).startswith("layer 0's stage rotary_cos is not in")
