"""Align two implementations' lists of ops inside one module: a sequence alignment on each op's key (its name and
its output's shape), so that where one side calls ops the other does not (a fused kernel against the ops it
fuses, an extra cast), the ops both call still face each other and the rest are listed, in place, as one side's
only."""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Sequence
from difflib import SequenceMatcher

# a captured op's output: "Net.attn/reshape#3_outputs" (module call "attn" without the model's class name "Net",
# op "reshape", call index 3); "Net/mul#1_outputs" (the model's own call: module call ""); one of several outputs
# of an op's call: "Net.router/topk#1_outputs_0", "Net.attn/chunk#1_outputs_2"
_OP_CALL = re.compile(r"^[^./]+\.?(.*)/([^/#]+)#(\d+)_outputs(?:_[^/]+)?$")


def align_ops(a: Sequence[Hashable], b: Sequence[Hashable]) -> list[tuple[int | None, int | None]]:
    """(index in `a`, index in `b`) for each row of the alignment, in order: both where the keys are equal (a
    longest matching subsequence), one None where an op is on one side only (the reference's first where both
    sides have ops between two matches)."""
    rows: list[tuple[int | None, int | None]] = []
    matcher = SequenceMatcher(None, list(a), list(b), autojunk=False)
    for tag, a_start, a_end, b_start, b_end in matcher.get_opcodes():
        if tag == "equal":
            rows.extend(zip(range(a_start, a_end), range(b_start, b_end), strict=True))
            continue
        rows.extend((i, None) for i in range(a_start, a_end))
        rows.extend((None, j) for j in range(b_start, b_end))
    return rows


def out_of_step(name: str, shapes: tuple[Sequence[int], Sequence[int]], dtypes: tuple[str, str]) -> bool:
    """Whether two captured tensors paired by name (`name`, the reference's) are not one value computed two ways:
    two ops' outputs whose calls of that op fell out of step (one side calls it more often: an extra `getitem` in
    one mask builder, a `reshape` in one `repeat_kv`), their shapes or their dtypes' kinds (bool, integer, floating,
    complex) differing; or a module's inputs of different kinds (an additive float mask against a bool one: eager
    attention's against SDPA's). float32 against bfloat16 is one value in two precisions."""
    kinds_differ = _kind(dtypes[0]) != _kind(dtypes[1])
    if "/" in name and "#" in name.rpartition("/")[2]:  # an op's output: "…/mul#1_outputs", not "…/grad_input"
        return kinds_differ or tuple(shapes[0]) != tuple(shapes[1])
    return kinds_differ and "_inputs_" in name


def op_call(name: str) -> tuple[str, str, int] | None:
    """(module call without the model's class name, op, call index) of a captured op's output, by its full name
    (the class name first: it may differ between a model and its port); None for any other tensor."""
    found = _OP_CALL.match(name)
    return (found[1], found[2], int(found[3])) if found else None


def call_counts(names: Iterable[str]) -> dict[tuple[str, str], int]:
    """How many times each (module call, op) was called, of the captured ops' outputs among `names` (one run's):
    its highest call index."""
    counts: dict[tuple[str, str], int] = {}
    for name in names:
        call = op_call(name)
        if call is not None:
            counts[call[:2]] = max(counts.get(call[:2], 0), call[2])
    return counts


def uneven_ops(a: Iterable[str], b: Iterable[str]) -> set[tuple[str, str]]:
    """The (module call, op) that two runs (their tensors' names, `a` and `b`) call a different number of times:
    which of their calls face each other is not known (eager attention's repeat_kv reshapes against SDPA's none),
    so none of them is one value computed two ways."""
    counts_a, counts_b = call_counts(a), call_counts(b)
    return {key for key in counts_a.keys() | counts_b.keys() if counts_a.get(key) != counts_b.get(key)}


def _kind(dtype: str) -> str:
    """A dtype's kind: "bool", "int" (uint8, int64, ...), "complex", else "float" (float32, bfloat16, float8...)."""
    if dtype == "bool":
        return "bool"
    if dtype.startswith(("int", "uint")):
        return "int"
    return "complex" if dtype.startswith("complex") else "float"
