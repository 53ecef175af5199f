"""`align_ops`: two implementations' ops inside a module, aligned on op and shape."""

from __future__ import annotations

from tensor_debugger.engine.op_alignment import align_ops


def test_a_fused_kernel_faces_the_ops_it_replaces_as_one_sides_only_in_place() -> None:
    unfused = [("linear", (2, 8)), ("matmul", (2, 2)), ("mul", (2, 2)), ("softmax", (2, 2)), ("matmul", (2, 8))]
    fused = [("linear", (2, 8)), ("scaled_dot_product_attention", (2, 8)), ("to", (2, 8))]
    assert align_ops(unfused, fused) == [(0, 0), (1, None), (2, None), (3, None), (4, None), (None, 1), (None, 2)]


def test_an_extra_cast_and_a_changed_shape_stay_apart_and_the_rest_pair() -> None:
    a = [("matmul", (4,)), ("mul", (4,)), ("softmax", (4,))]
    b = [("matmul", (4,)), ("float", (4,)), ("mul", (4,)), ("softmax", (5,))]
    assert align_ops(a, b) == [(0, 0), (None, 1), (1, 2), (2, None), (None, 3)]
    assert align_ops([], b) == [(None, 0), (None, 1), (None, 2), (None, 3)]
