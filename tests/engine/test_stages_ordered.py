"""engine/stages.py: where the execution order of one layer's stages is known."""

from __future__ import annotations

import pytest
from tensor_debugger.engine.stages import stages_ordered, unordered_words


@pytest.mark.parametrize(
    ("stages", "ordered"),
    [
        (["post_mlp", "query", "post_attn"], True),  # the README's stages
        (["mlp", "o_proj", "post_attention_layernorm", "q_proj"], True),  # a Llama layer's modules
        (["attn", "mlp"], True),  # tests/support's layered_dump: two block names, attention before MLP
        (["attn_out", "mlp_out"], True),
        (["attn", "post_ln_pre_attn", "pre_mlp"], True),  # around the attention block, not inside it
        (["attn", "query", "key"], False),  # `attn` may be the attention's input (before query) or its output
        (["attn", "o_proj"], False),
        (["self_attn", "q_proj"], False),
        (["attn", "attn_out"], False),
        (["attn", "self_attn"], False),  # two names of one block
        (["mlp", "mlp_out"], False),
        (["mlp", "query"], True),  # query is outside the MLP block
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


def test_unordered_words_name_the_block_and_the_stages_inside_it() -> None:
    assert unordered_words(0, ["attn", "query", "key"]) == (
        "layer 0's stage attn names the whole attention block (its input or its output) and the layer also holds "
        "key and query, inside that block, so which ran first is not known"
    )
    assert unordered_words(2, ["mlp", "mlp_out", "query"]).startswith("layer 2's stage mlp names the whole MLP block")
