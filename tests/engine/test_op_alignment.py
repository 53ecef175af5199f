"""`align_ops`: two implementations' ops inside a module, aligned on op and shape."""

from __future__ import annotations

from tensor_debugger.engine.op_alignment import align_ops, call_counts, op_call, uneven_ops


def test_a_fused_kernel_faces_the_ops_it_replaces_as_one_sides_only_in_place() -> None:
    unfused = [("linear", (2, 8)), ("matmul", (2, 2)), ("mul", (2, 2)), ("softmax", (2, 2)), ("matmul", (2, 8))]
    fused = [("linear", (2, 8)), ("scaled_dot_product_attention", (2, 8)), ("to", (2, 8))]
    assert align_ops(unfused, fused) == [(0, 0), (1, None), (2, None), (3, None), (4, None), (None, 1), (None, 2)]


def test_an_extra_cast_and_a_changed_shape_stay_apart_and_the_rest_pair() -> None:
    a = [("matmul", (4,)), ("mul", (4,)), ("softmax", (4,))]
    b = [("matmul", (4,)), ("float", (4,)), ("mul", (4,)), ("softmax", (5,))]
    assert align_ops(a, b) == [(0, 0), (None, 1), (1, 2), (2, None), (None, 3)]
    assert align_ops([], b) == [(None, 0), (None, 1), (None, 2), (None, 3)]


def test_ops_called_unevenly_are_found_by_module_call_and_op_whatever_the_models_class_name() -> None:
    eager = [
        "EagerAttention/reshape#1_outputs",
        "EagerAttention.attn/reshape#1_outputs",
        "EagerAttention.attn/reshape#2_outputs",
        "EagerAttention.attn/mul#1_outputs",
        "EagerAttention.attn_outputs",  # a module's output, no op
    ]
    port = ["Port/reshape#1_outputs", "Port.attn/reshape#1_outputs", "Port.attn/mul#1_outputs", "Port.attn_outputs"]
    assert op_call(eager[0]) == ("", "reshape", 1)
    assert op_call(eager[2]) == ("attn", "reshape", 2)
    assert op_call(eager[4]) is None
    assert call_counts(eager) == {("", "reshape"): 1, ("attn", "reshape"): 2, ("attn", "mul"): 1}
    assert uneven_ops(eager, port) == {("attn", "reshape")}
    assert uneven_ops(eager, eager) == set()
