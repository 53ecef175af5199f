"""`engine/lowered.py`: where a candidate's lower precision begins, the rule `find_divergence` and the session's
first divergence both use."""

from __future__ import annotations

from tensor_debugger.engine.lowered import first_lowered, least_precise, lowered
from tensor_debugger.engine.tolerances import less_precise

# a float32 port whose scores are cast to bfloat16 and back: (name, dtype, its namesake's in the reference)
PORT = [
    ("Net_inputs_args_0", "int64", "int64"),
    ("Net.q/linear#1_outputs", "float32", "float32"),
    ("Net/bfloat16#1_outputs", "bfloat16", None),  # no namesake: the reference recorded no bfloat16
    ("Net/matmul#1_outputs", "bfloat16", "float32"),  # its namesake holds another dtype
    ("Net/float#1_outputs", "float32", None),  # no namesake, but float32 the reference records
    ("Net/half#1_outputs", "float16", None),
]
REFERENCE = {"int64", "float32"}


def test_the_tensors_in_a_dtype_the_reference_did_not_record_there_in_the_candidates_order() -> None:
    assert list(lowered(PORT, REFERENCE)) == [
        ("Net/bfloat16#1_outputs", "bfloat16"),
        ("Net/matmul#1_outputs", "bfloat16"),
        ("Net/half#1_outputs", "float16"),
    ]
    assert first_lowered(PORT, REFERENCE, "bfloat16") == "Net/bfloat16#1_outputs"
    assert first_lowered(PORT, REFERENCE, "float16") == "Net/half#1_outputs"
    assert first_lowered(PORT, REFERENCE, "float64") is None


def test_the_least_precise_float_dtype_below_the_references() -> None:
    assert least_precise(["bfloat16", "float16", "int64"], "float32") == "bfloat16"
    assert least_precise(["float16"], "float32") == "float16"
    assert least_precise(["float32", "int8", "complex32", "bool"], "float32") is None  # none less precise, or float
    assert least_precise(["float32"], "float64") == "float32"
    assert less_precise("bfloat16", "float16") and not less_precise("float16", "bfloat16")
    assert not less_precise("int8", "float32") and not less_precise("float16", "int64")
