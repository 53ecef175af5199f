"""The pairing engine's newer strategies: identities without packaging, fuzzy names, the user's chain and a
name pattern."""

from __future__ import annotations

import re

import pytest
from tensor_debugger.engine.fuzzy import similarity, tokens
from tensor_debugger.engine.logical_tensors import LogicalTensor, TensorRef, identities
from tensor_debugger.engine.name_patterns import compile_name_pattern
from tensor_debugger.engine.pairing import pair_runs, parameter_key, parameter_name, parse_strategies, position_key


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


def inputs(root: str, *places: tuple[str, str | None]) -> list[TensorRef]:
    """A captured module call's inputs (`attn`'s, under the model class `root`), each a place and its parameter."""
    return [
        TensorRef(i, f"{root}.attn_{place}", (2,), "float32", i, module_path=f"{root}.attn", place=place, parameter=p)
        for i, (place, p) in enumerate(places)
    ]


def test_a_keyword_input_pairs_with_the_positional_one_bound_to_the_same_parameter() -> None:
    """`attn(h, m)` against `attn(x=h, keep=m)` under a renamed model class: by the parameter each binds to, a
    tuple's parts part by part; never where no parameter was recorded (a Hugging Face trace)."""
    reference = inputs("Net", ("inputs_args_0", "x"), ("inputs_args_1_0", "keep"), ("inputs_args_1_1", "keep"))
    candidate = inputs(
        "Port", ("inputs_kwargs_keep_1", "keep"), ("inputs_kwargs_keep_0", "keep"), ("inputs_kwargs_x", "x")
    )
    assert made(reference, candidate, strategies=["name", "module", "parameter"]) == [
        ("Net.attn_inputs_args_0", "Port.attn_inputs_kwargs_x", "parameter"),
        ("Net.attn_inputs_args_1_0", "Port.attn_inputs_kwargs_keep_0", "parameter"),
        ("Net.attn_inputs_args_1_1", "Port.attn_inputs_kwargs_keep_1", "parameter"),
    ]
    assert "parameter" in parse_strategies(None)  # in the default chain
    assert made(inputs("Net", ("inputs_args_0", None)), inputs("Port", ("inputs_kwargs_x", None))) == []
    assert parameter_key("Net.attn#2", "inputs_kwargs_x_0", "x") == ("attn#2", "x", "_0")
    assert parameter_key("Net.attn", "inputs_kwargs_xy", "x") is None  # not the keyword `x`'s
    assert parameter_key("Net.attn", "outputs", "x") is None
    parts = inputs("Port", ("inputs_kwargs_x", "x"), ("inputs_kwargs_x_0", "x"))  # a part of `x` is not `x`
    assert made(inputs("Net", ("inputs_args_0", "x")), parts, strategies=["parameter"]) == [
        ("Net.attn_inputs_args_0", "Port.attn_inputs_kwargs_x", "parameter")
    ]


def test_a_keyword_through_kwargs_pairs_with_the_parameter_of_its_name() -> None:
    """`attn(h, m)` into `forward(self, x, mask=None)` against `attn(h, mask=m)` into `forward(self, x, **kwargs)`
    (recorded `**mask`): paired by the keyword's name, said so in the strategy; an argument into `*args` (`*1`)
    pairs with no named parameter, nor with a `**kwargs` keyword; a key one side's `**kwargs` alone has stays
    unpaired; where both sides' `**kwargs` carry the key the names pair them first."""
    reference = inputs(
        "Net",
        ("inputs_args_0", "hidden_states"),
        ("inputs_args_1_0", "attention_mask"),
        ("inputs_args_1_1", "attention_mask"),
    )
    candidate = inputs(
        "Port",
        ("inputs_kwargs_attention_mask_1", "**attention_mask"),
        ("inputs_kwargs_attention_mask_0", "**attention_mask"),
        ("inputs_kwargs_hidden_states", "hidden_states"),
        ("inputs_kwargs_position_ids", "**position_ids"),
    )
    pairing = pair_runs(reference, candidate, strategies=["name", "module", "parameter"])
    assert [(p.a.name, p.b.name, p.strategy) for p in pairing.pairs] == [
        ("Net.attn_inputs_args_0", "Port.attn_inputs_kwargs_hidden_states", "parameter"),
        ("Net.attn_inputs_args_1_0", "Port.attn_inputs_kwargs_attention_mask_0", "parameter through **kwargs"),
        ("Net.attn_inputs_args_1_1", "Port.attn_inputs_kwargs_attention_mask_1", "parameter through **kwargs"),
    ]
    assert [t.name for t in pairing.unmatched_b] == ["Port.attn_inputs_kwargs_position_ids"]  # one side's only
    assert parameter_key("Net.attn", "inputs_kwargs_mask_0", "**mask") == ("attn", "mask", "_0")
    assert parameter_key("Net.attn", "inputs_kwargs_mask_0", "mask") == parameter_key(
        "Net.attn", "inputs_args_1_0", "mask"
    )
    assert parameter_key("Net.attn", "inputs_args_1", "**mask") is None  # a keyword's mark on a positional place
    assert parameter_key("Net.attn", "inputs_kwargs_masks", "**mask") is None
    assert parameter_key("Net.attn", "inputs_args_2_0", "*2") == ("attn", "*2", "_0")
    assert parameter_key("Net.attn", "inputs_args_2", "*1") is None  # the position is the place's
    # `*args`' second argument against a parameter's, or against a `**kwargs` keyword: no pair
    overflow = inputs("Net", ("inputs_args_1", "*1"))
    assert made(overflow, inputs("Port", ("inputs_kwargs_mask", "**mask")), strategies=["parameter"]) == []
    assert made(overflow, inputs("Port", ("inputs_args_1", "mask")), strategies=["module", "parameter"]) == [
        ("Net.attn_inputs_args_1", "Port.attn_inputs_args_1", "module")  # the place's name, as before
    ]
    # both sides' `**kwargs` with the key: their names pair them
    both = made(
        inputs("Net", ("inputs_kwargs_mask", "**mask")),
        inputs("Port", ("inputs_kwargs_mask", "**mask")),
        strategies=["name", "module", "parameter"],
    )
    assert both == [("Net.attn_inputs_kwargs_mask", "Port.attn_inputs_kwargs_mask", "module")]
    # recorded nowhere (a Hugging Face trace): unpaired as before
    assert made(inputs("Net", ("inputs_args_1", None)), inputs("Port", ("inputs_kwargs_mask", None))) == []


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
    # attn_out is the attention block's output, a stage of the transformer order (engine/stages.STAGE_ALIASES);
    # attn_in is no known stage, so it comes after, by name (no execution order: stages_ordered is False)
    assert [(p.a.name, p.b.name, p.a.layer, p.strategy) for p in pairing.pairs] == [
        ("L0_attn_out", "L0_attn_out", 0, "layer_stage"),
        ("L0_attn_in", "L0_attn_in", 0, "layer_stage"),
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


def test_a_keyword_bound_to_a_positional_parameter_pairs_with_the_other_sides_argument_at_its_position() -> None:
    """`m(h, mask=m)` into `forward(self, x, mask)` (recorded `mask@1`) against `m(h, m)` into `forward(self,
    *args)` (`*1`): paired by position 1, said so in the strategy, a tuple's parts part by part; what the names pair
    is paired by them first; two keywords of other names at one position (other parameters of two signatures'
    orders), a keyword-only parameter (no position) and a `**kwargs` keyword stay unpaired; a data dir from before
    positions were recorded (`mask`) pairs by name as before."""
    reference = inputs(
        "Net", ("inputs_args_0", "x@0"), ("inputs_kwargs_mask_0", "mask@1"), ("inputs_kwargs_mask_1", "mask@1")
    )
    candidate = inputs("Port", ("inputs_args_0", "*0"), ("inputs_args_1_1", "*1"), ("inputs_args_1_0", "*1"))
    assert made(reference, candidate, strategies=["name", "module", "parameter"]) == [
        ("Net.attn_inputs_args_0", "Port.attn_inputs_args_0", "module"),
        ("Net.attn_inputs_kwargs_mask_0", "Port.attn_inputs_args_1_0", "parameter by position"),
        ("Net.attn_inputs_kwargs_mask_1", "Port.attn_inputs_args_1_1", "parameter by position"),
    ]
    # the other way round, and against a positional argument bound to a parameter of another name
    assert made(
        inputs("Net", ("inputs_args_1", "keep@1")),
        inputs("Port", ("inputs_kwargs_mask", "mask@1")),
        strategies=["parameter"],
    ) == [("Net.attn_inputs_args_1", "Port.attn_inputs_kwargs_mask", "parameter by position")]
    # the names first: `mask` by keyword on both sides' other positions is one parameter
    named = made(
        inputs("Net", ("inputs_args_1", "mask@1")),
        inputs("Port", ("inputs_kwargs_mask", "mask@2"), ("inputs_args_1", "*1")),
        strategies=["name", "parameter"],
    )
    assert named == [("Net.attn_inputs_args_1", "Port.attn_inputs_kwargs_mask", "parameter")]
    keywords = (
        inputs("Net", ("inputs_kwargs_position_ids", "position_ids@2")),
        inputs("Port", ("inputs_kwargs_attention_mask", "attention_mask@2")),
    )
    assert made(*keywords, strategies=["parameter"]) == []
    overflow = inputs("Port", ("inputs_args_1", "*1"))
    assert made(inputs("Net", ("inputs_kwargs_mask", "mask")), overflow, strategies=["parameter"]) == []  # keyword-only
    assert made(inputs("Net", ("inputs_kwargs_mask", "**mask")), overflow, strategies=["parameter"]) == []
    assert made(
        inputs("Net", ("inputs_args_1", "mask")),
        inputs("Port", ("inputs_kwargs_mask", "mask@1")),
        strategies=["parameter"],
    ) == [("Net.attn_inputs_args_1", "Port.attn_inputs_kwargs_mask", "parameter")]
    assert parameter_name("mask@1") == ("mask", 1) and parameter_name("mask") == ("mask", None)
    assert parameter_name("*1") == ("*1", None)
    assert position_key("Net.attn#2", "inputs_kwargs_mask_0", "mask@1") == (("attn#2", 1, "_0", None), True)
    assert position_key("Net.attn", "inputs_args_1_0", "*1", (2, 3)) == (("attn", 1, "_0", (2, 3)), False)
    # of other shapes at one position: other tensors (the port's positional embeddings where the mask was)
    wide = [
        TensorRef(
            9,
            "Port.attn_inputs_args_1",
            (4,),
            "float32",
            9,
            module_path="Port.attn",
            place="inputs_args_1",
            parameter="*1",
        )
    ]
    assert made(inputs("Net", ("inputs_kwargs_mask", "mask@1")), wide, strategies=["parameter"]) == []
    assert position_key("Net.attn", "inputs_kwargs_masks", "mask@1") is None  # not the keyword `mask`'s
    assert position_key("Net.attn", "inputs_args_1", None) is None  # recorded nowhere (a Hugging Face trace)
