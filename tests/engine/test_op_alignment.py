"""`align_ops`: two implementations' ops inside a module, aligned on op and shape; `pair_ops`: two runs' captured
ops paired by it, module call by module call."""

from __future__ import annotations

from tensor_debugger.engine.op_alignment import (
    AMBIGUOUS,
    BY_CONTENT,
    LEFT_OVER,
    Content,
    Likeness,
    OpTensor,
    align_ops,
    crossed,
    op_call,
    pair_ops,
)


def test_a_fused_kernel_faces_the_ops_it_replaces_as_one_sides_only_in_place() -> None:
    unfused = [("linear", (2, 8)), ("matmul", (2, 2)), ("mul", (2, 2)), ("softmax", (2, 2)), ("matmul", (2, 8))]
    fused = [("linear", (2, 8)), ("scaled_dot_product_attention", (2, 8)), ("to", (2, 8))]
    assert align_ops(unfused, fused) == [(0, 0), (1, None), (2, None), (3, None), (4, None), (None, 1), (None, 2)]


def test_an_extra_cast_and_a_changed_shape_stay_apart_and_the_rest_pair() -> None:
    a = [("matmul", (4,)), ("mul", (4,)), ("softmax", (4,))]
    b = [("matmul", (4,)), ("float", (4,)), ("mul", (4,)), ("softmax", (5,))]
    assert align_ops(a, b) == [(0, 0), (None, 1), (1, 2), (2, None), (None, 3)]
    assert align_ops([], b) == [(None, 0), (None, 1), (None, 2), (None, 3)]


def test_op_calls_are_named_by_module_call_op_and_index_whatever_the_models_class_name() -> None:
    assert op_call("EagerAttention/reshape#1_outputs") == ("", "reshape", 1)
    assert op_call("EagerAttention.attn/reshape#2_outputs") == ("attn", "reshape", 2)
    assert op_call("Net.attn#2/split#1_outputs_0") == ("attn#2", "split", 1)
    assert op_call("EagerAttention.attn_outputs") is None  # a module's output, no op


def ops(*items: tuple[str, tuple[int, ...]] | tuple[str, tuple[int, ...], str]) -> list[OpTensor]:
    return [OpTensor(i[0], i[1], i[2] if len(i) == 3 else "float32") for i in items]


def test_an_extra_reshape_on_one_side_is_its_alone_and_the_calls_after_it_pair_with_their_true_counterparts() -> None:
    """A repeat_kv by expand and reshape against one by repeat: the eager side's reshape#2 and #3 are its own, its
    reshape#4 (the output's) pairs with the port's reshape#1, not with its reshape#1 (the input's, of the same shape
    but another place); the model's class names differ."""
    eager = ops(
        ("Eager.attn/reshape#1_outputs", (2, 5, 16)),
        ("Eager.attn/transpose#1_outputs", (2, 2, 5, 4)),
        ("Eager.attn/reshape#2_outputs", (2, 4, 5, 4)),
        ("Eager.attn/reshape#3_outputs", (2, 4, 5, 4)),
        ("Eager.attn/matmul#1_outputs", (2, 4, 5, 5)),
        ("Eager.attn/transpose#2_outputs", (2, 5, 4, 4)),
        ("Eager.attn/reshape#4_outputs", (2, 5, 16)),
        ("Eager.attn_outputs", (2, 5, 16)),  # a module's output: no op, not decided here
        ("Eager.mlp/gelu#1_outputs", (2, 5, 16)),  # a module call the port does not make: not decided here
    )
    port = ops(
        ("Port.attn/transpose#1_outputs", (2, 2, 5, 4)),
        ("Port.attn/repeat#1_outputs", (2, 4, 5, 4)),
        ("Port.attn/matmul#1_outputs", (2, 4, 5, 5)),
        ("Port.attn/transpose#2_outputs", (2, 5, 4, 4)),
        ("Port.attn/reshape#1_outputs", (2, 5, 16)),
        ("Port.attn_outputs", (2, 5, 16)),
    )
    found = pair_ops(eager, port)
    assert found.pairs == [
        ("Eager.attn/transpose#1_outputs", "Port.attn/transpose#1_outputs"),
        ("Eager.attn/matmul#1_outputs", "Port.attn/matmul#1_outputs"),
        ("Eager.attn/transpose#2_outputs", "Port.attn/transpose#2_outputs"),
        ("Eager.attn/reshape#4_outputs", "Port.attn/reshape#1_outputs"),
    ]
    assert found.alone_a == [
        "Eager.attn/reshape#1_outputs",
        "Eager.attn/reshape#2_outputs",
        "Eager.attn/reshape#3_outputs",
    ]
    assert found.alone_b == ["Port.attn/repeat#1_outputs"]


def test_a_cast_faces_nothing_and_ops_of_other_dtype_kinds_or_module_calls_never_pair() -> None:
    a = ops(("N/matmul#1_outputs", (4,)), ("N/mul#1_outputs", (4,)), ("N/eq#1_outputs", (4,), "bool"))
    b = ops(
        ("N/matmul#1_outputs", (4,)),
        ("N/float#1_outputs", (4,)),
        ("N/mul#1_outputs", (4,), "bfloat16"),  # one value in another precision: pairs
        ("N/eq#1_outputs", (4,), "float32"),  # another kind: does not
        ("N.sub/mul#1_outputs", (4,)),  # another module call
    )
    found = pair_ops(a, b)
    assert found.pairs == [("N/matmul#1_outputs", "N/matmul#1_outputs"), ("N/mul#1_outputs", "N/mul#1_outputs")]
    assert (found.alone_a, found.alone_b) == (["N/eq#1_outputs"], ["N/float#1_outputs", "N/eq#1_outputs"])


def test_calls_that_could_face_either_of_two_are_left_alone_not_guessed() -> None:
    """Llama's eager attention (repeat_kv reshapes keys and values to (1, 4, 8, 8)) against its SDPA one (one
    reshape of that shape, of the attention's output): nothing around them matches, so which of the two faces SDPA's
    is not known; none is paired. A reshape with matching ops around it is."""
    eager = ops(
        ("L.attn/cat#1_outputs", (1, 2, 8, 8)),
        ("L.attn/expand#1_outputs", (1, 2, 2, 8, 8)),
        ("L.attn/reshape#1_outputs", (1, 4, 8, 8)),
        ("L.attn/expand#2_outputs", (1, 2, 2, 8, 8)),
        ("L.attn/reshape#2_outputs", (1, 4, 8, 8)),
        ("L.attn/matmul#1_outputs", (1, 4, 8, 8)),
        ("L.attn/softmax#1_outputs", (1, 4, 8, 8)),
        ("L.attn/transpose#1_outputs", (1, 8, 4, 8)),
        ("L.attn/reshape#3_outputs", (1, 8, 32)),
    )
    sdpa = ops(
        ("L.attn/cat#1_outputs", (1, 2, 8, 8)),
        ("L.attn/scaled_dot_product_attention#1_outputs", (1, 4, 8, 8)),
        ("L.attn/reshape#1_outputs", (1, 4, 8, 8)),
        ("L.attn/transpose#1_outputs", (1, 8, 4, 8)),
        ("L.attn/reshape#2_outputs", (1, 8, 32)),
    )
    found = pair_ops(eager, sdpa)
    assert found.pairs == [
        ("L.attn/cat#1_outputs", "L.attn/cat#1_outputs"),
        ("L.attn/transpose#1_outputs", "L.attn/transpose#1_outputs"),
        ("L.attn/reshape#3_outputs", "L.attn/reshape#2_outputs"),
    ]
    assert "L.attn/reshape#1_outputs" in found.alone_b and "L.attn/reshape#1_outputs" in found.alone_a


def test_an_extra_call_right_beside_its_twin_leaves_both_unpaired() -> None:
    """The candidate multiplies by 1.0 right before multiplying by the scale, as the reference does once: which of
    its two `mul`s is the reference's is not known, so none pairs; the matmul before and the softmax after do."""
    a = ops(("N/matmul#1_outputs", (4,)), ("N/mul#1_outputs", (4,)), ("N/softmax#1_outputs", (4,)))
    b = ops(
        ("N/matmul#1_outputs", (4,)),
        ("N/mul#1_outputs", (4,)),
        ("N/mul#2_outputs", (4,)),
        ("N/softmax#1_outputs", (4,)),
    )
    found = pair_ops(a, b)
    assert found.pairs == [("N/matmul#1_outputs", "N/matmul#1_outputs"), ("N/softmax#1_outputs", "N/softmax#1_outputs")]
    assert (found.alone_a, found.alone_b) == (["N/mul#1_outputs"], ["N/mul#1_outputs", "N/mul#2_outputs"])


def test_the_models_own_ops_pair_only_with_those_of_the_same_call_of_the_model() -> None:
    assert op_call("Net#2/mul#1_outputs") == ("", "mul", 1)
    # the reference doubles in its first call, the candidate in its second: two calls' inputs, never a pair
    found = pair_ops(ops(("Net/mul#1_outputs", (1, 4))), ops(("Port#2/mul#1_outputs", (1, 4))))
    assert found.pairs == [] and found.alone_a == found.alone_b == []
    found = pair_ops(
        ops(("Net/mul#1_outputs", (1, 4)), ("Net#2/mul#1_outputs", (1, 4))),
        ops(("Port/mul#1_outputs", (1, 4)), ("Port#2/mul#1_outputs", (1, 4))),
    )
    assert found.pairs == [("Net/mul#1_outputs", "Port/mul#1_outputs"), ("Net#2/mul#1_outputs", "Port#2/mul#1_outputs")]


def linears(root: str, order: str) -> list[OpTensor]:
    """Four `linear`s of one shape in one module call, computing the projections named in `order` ("qkvo")."""
    return [OpTensor(f"{root}.attn/linear#{n}_outputs", (2, 5, 16), "float32") for n in range(1, len(order) + 1)]


def judged_by(a_order: str, b_order: str, values: dict[str, dict[str, float]]) -> Content:
    """What two ops' contents tell when the reference computes `a_order` and the port `b_order`: `values[a][b]`,
    the distance between the reference's projection a and the port's b (0: the same, within tolerance)."""

    def content(a: str, b: str) -> Likeness:
        x = a_order[int(a.partition("#")[2].partition("_")[0]) - 1]
        y = b_order[int(b.partition("#")[2].partition("_")[0]) - 1]
        distance = values.get(x, {}).get(y, 1.0)
        return Likeness(distance == 0.0, distance)

    return content


def test_ops_of_one_name_and_shape_in_another_order_pair_by_content_where_it_matches_one_to_one() -> None:
    """k before q: by position q faced k; their contents match the other way, so they pair by content; v and the
    output projection keep their places (their contents confirm them)."""
    same = {p: {p: 0.0} for p in "qkvo"}
    found = pair_ops(linears("Ref", "qkvo"), linears("Port", "kqvo"), judged_by("qkvo", "kqvo", same))
    assert found.pairs == [
        ("Ref.attn/linear#1_outputs", "Port.attn/linear#2_outputs"),
        ("Ref.attn/linear#2_outputs", "Port.attn/linear#1_outputs"),
        ("Ref.attn/linear#3_outputs", "Port.attn/linear#3_outputs"),
        ("Ref.attn/linear#4_outputs", "Port.attn/linear#4_outputs"),
    ]
    assert found.settled == {found.pairs[0]: BY_CONTENT, found.pairs[1]: BY_CONTENT}
    # without content, or where it proves nothing wrong, position stands
    assert pair_ops(linears("Ref", "qkvo"), linears("Port", "kqvo")).settled == {}
    unknown = pair_ops(linears("Ref", "qkvo"), linears("Port", "kqvo"), lambda a, b: Likeness(None))
    assert unknown.settled == {} and unknown.pairs[0][1] == "Port.attn/linear#1_outputs"


def test_a_wrong_op_among_them_is_the_one_left_and_stays_a_bug() -> None:
    """k before q and k wrong: q matches q, the port's k matches nothing; it is the one left, paired with the
    reference's k (its strictly nearest), where it fails."""
    values = {"q": {"q": 0.0}, "k": {"k": 0.4}, "v": {"v": 0.0}, "o": {"o": 0.3}}
    found = pair_ops(linears("Ref", "qkvo"), linears("Port", "kqvo"), judged_by("qkvo", "kqvo", values))
    assert found.pairs[:2] == [
        ("Ref.attn/linear#1_outputs", "Port.attn/linear#2_outputs"),
        ("Ref.attn/linear#2_outputs", "Port.attn/linear#1_outputs"),
    ]
    assert found.settled == {found.pairs[0]: BY_CONTENT, found.pairs[1]: LEFT_OVER}
    # in the reference's order, a wrong k among ops whose contents confirm their places: nothing to say
    same_order = pair_ops(linears("Ref", "qkvo"), linears("Port", "qkvo"), judged_by("qkvo", "qkvo", values))
    assert same_order.settled == {} and same_order.pairs[1] == (
        "Ref.attn/linear#2_outputs",
        "Port.attn/linear#2_outputs",
    )


def test_where_content_decides_nothing_position_stays_and_is_ambiguous() -> None:
    """k before q, both wrong, each nearer the other side's same projection: nothing matches, and by position q
    faces k, which is not its nearest: position stays, ambiguous. An op whose content matches two of the other
    side's decides nothing either."""
    values = {"q": {"q": 0.5, "k": 1.8}, "k": {"k": 0.5, "q": 1.8}, "v": {"v": 0.0}, "o": {"o": 0.3}}
    found = pair_ops(linears("Ref", "qkvo"), linears("Port", "kqvo"), judged_by("qkvo", "kqvo", values))
    assert found.pairs[0] == ("Ref.attn/linear#1_outputs", "Port.attn/linear#1_outputs")
    assert found.settled == {found.pairs[0]: AMBIGUOUS, found.pairs[1]: AMBIGUOUS}  # o: its own nearest, in place
    twice = {"q": {"q": 0.0, "k": 0.0}, "k": {"q": 0.0, "k": 0.0}, "v": {"v": 0.0}, "o": {"o": 0.0}}
    found = pair_ops(linears("Ref", "qkvo"), linears("Port", "kqvo"), judged_by("qkvo", "kqvo", twice))
    assert found.settled == {}  # every pair in place matches: nothing proves position wrong


def test_crossed_names_content_pairs_across_call_indices_before_the_divergence_in_its_module_call() -> None:
    """Slices swapped in use (`getitem#1` with `getitem#2`) before the first divergence, in its module call, in the
    reference's order; not a pair by content of the same index, an ambiguous one, one after it (not in `before`)
    or one of another module call."""
    settled = {
        ("Net.attn/getitem#2_outputs", "Port.attn/getitem#1_outputs"): LEFT_OVER,
        ("Net.attn/getitem#1_outputs", "Port.attn/getitem#2_outputs"): BY_CONTENT,
        ("Net.attn/linear#1_outputs", "Port.attn/linear#1_outputs"): BY_CONTENT,  # another order, same index
        ("Net.attn/view#1_outputs", "Port.attn/view#2_outputs"): AMBIGUOUS,
        ("Net.mlp/getitem#1_outputs", "Port.mlp/getitem#2_outputs"): BY_CONTENT,
        ("Net.attn/mul#1_outputs", "Port.attn/mul#2_outputs"): BY_CONTENT,  # after it
    }
    before = [
        "Net.attn_inputs_args_0",
        "Net.attn/linear#1_outputs",
        "Net.attn/getitem#1_outputs",
        "Net.attn/getitem#2_outputs",
        "Net.attn/view#1_outputs",
        "Net.mlp/getitem#1_outputs",
    ]
    assert crossed(settled, before, "Net.attn") == [
        ("Net.attn/getitem#1_outputs", "Port.attn/getitem#2_outputs"),
        ("Net.attn/getitem#2_outputs", "Port.attn/getitem#1_outputs"),
    ]
    assert crossed(settled, before, "Net.mlp") == [("Net.mlp/getitem#1_outputs", "Port.mlp/getitem#2_outputs")]
    assert crossed(settled, before[:2], "Net.attn") == []
