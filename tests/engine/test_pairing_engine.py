"""The pairing engine's newer strategies: identities without packaging, fuzzy names, the user's chain and a
name pattern."""

from __future__ import annotations

import re

import pytest
from tensor_debugger.engine.fuzzy import similarity, tokens
from tensor_debugger.engine.pairing import (
    LogicalTensor,
    TensorRef,
    compile_name_pattern,
    identities,
    pair_runs,
    parse_strategies,
)


def refs(*names: str, shape: tuple[int, ...] = (2,), keys: bool = False) -> list[TensorRef]:
    made = []
    for i, name in enumerate(names):
        key = (name.split(".", 1)[1],) if keys else ()
        made.append(TensorRef(i, name, shape, "float32", i, key_path=key))
    return made


def made(a: list[TensorRef], b: list[TensorRef], **kwargs: object) -> list[tuple[str, str, str]]:
    return [(p.a.name, p.b.name, p.strategy) for p in pair_runs(a, b, **kwargs).pairs]  # type: ignore[arg-type]


def test_identities_drop_packaging() -> None:
    def ident(*names: str, keys: bool = True) -> list[str]:
        return identities([LogicalTensor(r.name, (r,)) for r in refs(*names, keys=keys)])

    assert ident("a.layers.0.w", "a.norm") == ["layers.0.w", "norm"]  # one file: its stem goes
    assert ident("model-00001-of-00002.x", "model-00002-of-00002.y") == ["x", "y"]  # shards are one file
    assert ident("enc.x", "dec.x") == ["enc.x", "dec.x"]  # two files: their names tell the tensors apart
    assert ident("0_query", "0_key", keys=False) == ["0_query", "0_key"]  # a file per tensor: its name is it
    assert ident("out/run/0_query", "out/run/0_key", keys=False) == ["0_query", "0_key"]  # shared folders go


def test_fuzzy_pairs_abbreviations_and_shows_its_score() -> None:
    a = refs("blocks.3.attention_out", "blocks.3.mlp_output", "blocks.4.attention_out")
    b = refs("blocks.3.attn_out", "blocks.3.mlp_out", "blocks.5.attn_out")
    pairs = made(a, b, strategies=["name", "fuzzy"])
    assert ("blocks.3.attention_out", "blocks.3.attn_out", "fuzzy 0.95") in pairs
    assert ("blocks.3.mlp_output", "blocks.3.mlp_out", "fuzzy 0.95") in pairs
    assert len(pairs) == 2  # never across layers: blocks.4 and blocks.5 stay apart


def test_fuzzy_refuses_unlike_tokens_ties_and_low_scores() -> None:
    assert similarity(tokens("layers.0.q_proj"), tokens("layers.0.k_proj")) == 0
    assert made(refs("layers.0.q_proj"), refs("layers.0.k_proj"), strategies=["fuzzy"]) == []
    # two candidates equally close: no guess
    assert made(refs("blocks.1.attention"), refs("blocks.1.attn", "blocks.1.attent"), strategies=["fuzzy"]) == []
    # an extra word lowers the score below a stricter threshold
    loose = made(refs("mlp.fc1"), refs("mlp.linear.fc1"), strategies=["fuzzy"])
    assert loose == [("mlp.fc1", "mlp.linear.fc1", "fuzzy 0.86")]
    assert made(refs("mlp.fc1"), refs("mlp.linear.fc1"), strategies=["fuzzy:0.9"]) == []


def test_fuzzy_is_one_to_one_best_first() -> None:
    a = refs("h.2.attention_out", "h.2.attention_output_proj")
    b = refs("h.2.attn_out")
    assert made(a, b, strategies=["fuzzy"]) == [("h.2.attention_out", "h.2.attn_out", "fuzzy 0.95")]


def test_the_chain_is_the_users() -> None:
    a = refs("x.weight", "y.weight", shape=(3,))
    b = refs("model.x.weight", "z.weight", shape=(3,))
    assert made(a, b) == [("x.weight", "model.x.weight", "normalized"), ("y.weight", "z.weight", "shape")]
    assert made(a, b, strategies=["normalized"]) == [("x.weight", "model.x.weight", "normalized")]
    assert made(a, b, strategies=["name"]) == []
    assert made(a, b, strategies=["shape"]) == []  # shapes not unique
    assert parse_strategies("layer_stage, name,fuzzy:0.8") == ["layer_stage", "name", "fuzzy:0.8"]
    assert parse_strategies(None)[0] == "layer_stage" and parse_strategies("") == parse_strategies(None)
    for bad, words in [
        ("name,nmae", "unknown pairing strategy 'nmae'"),
        ("name,name", "named twice"),
        ("fuzzy:2", "fuzzy threshold"),
        ("shape:1", "takes no value"),
    ]:
        with pytest.raises(ValueError, match=words):
            parse_strategies(bad)


def test_name_pattern_gives_layer_stage_order_and_shards() -> None:
    pattern = compile_name_pattern(r"L(?P<layer>\d+)_(?P<stage>[a-z_]+?)(?:_r(?P<rank>\d+))?$")
    a = refs("L1_mlp", "L0_attn_out", "L0_attn_in")
    b = refs("L1_mlp_r0", "L1_mlp_r1", "L0_attn_out", "L0_attn_in")
    pairing = pair_runs(a, b, pattern=pattern, strategies=["layer_stage"])
    assert [(p.a.name, p.b.name, p.a.layer, p.strategy) for p in pairing.pairs] == [
        ("L0_attn_in", "L0_attn_in", 0, "layer_stage"),
        ("L0_attn_out", "L0_attn_out", 0, "layer_stage"),
        ("L1_mlp", "L1_mlp_r", 1, "layer_stage"),
    ]
    assert [s.name for s in pairing.pairs[2].b.shards] == ["L1_mlp_r0", "L1_mlp_r1"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("L(?P<layer>\\d+", "not a regular expression"),
        ("L(?P<layer>\\d+)", "no named group 'stage'"),
        ("(?P<layer>\\d)(?P<stage>x)(?P<step>y)", "named group 'step'"),
    ],
)
def test_bad_name_patterns_are_named(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        compile_name_pattern(text)
