"""Inside the module call that holds a first divergence, the candidate's ops that paired with none of the
reference's, related by values to slices of the reference's tensors (engine/head_slices.py): a loop over heads
against one batched op. Read from `find_divergence`'s second pass (full values of that module on both sides)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace

import numpy as np
import torch

from tensor_debugger.engine.head_slices import BUDGET, Array, HeadSlices, relate, slices_between
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.ingest.fold64 import dtype_name


def slices_inside(
    calls: tuple[str, str],
    kept: tuple[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]],
    candidate_order: Sequence[str],
    before: tuple[str, str],
    paired: Collection[str],
    tolerance_of: Callable[[str, str], Tolerance],
) -> HeadSlices | None:
    """The candidate's ops of module call `calls[1]` recorded before `before[1]` (its tensor at the first
    divergence, in `candidate_order`) that paired with none of the reference's (not in `paired`), with full values
    (`kept[1]`), checked against slices of the reference's tensors recorded in its call `calls[0]` up to
    `before[0]` (`kept[0]`, in order: its ops, and its submodules' tensors where the call is the module's first).
    None where no such op has full values (the op lists of that call align, or it was not recorded)."""
    call_a, call_b = calls
    ours = [
        n
        for n in candidate_order[: candidate_order.index(before[1])]
        if n.startswith(call_b + "/") and n not in paired and n in kept[1]
    ]
    if not ours:
        return None
    inside = (call_a + "/",) if "#" in call_a else (call_a + "/", call_a + ".")
    recorded = list(kept[0])
    upto = recorded[: recorded.index(before[0]) + 1] if before[0] in kept[0] else recorded
    # only the candidate's ops up to the budget of elements compared (each is compared whole at least once), and
    # only the reference's tensors whose shapes relate to one of theirs, are converted to float64
    held, budget = [], BUDGET
    for n in ours:
        budget -= kept[1][n].numel()
        if budget < 0:
            break
        held.append(n)
    shapes = {tuple(kept[1][n].shape) for n in held}
    theirs = [
        n
        for n in upto
        if n.startswith(inside) and any(slices_between(n, tuple(kept[0][n].shape), shape) for shape in shapes)
    ]
    if not theirs or not held:
        return None
    tolerance = tolerance_of(_floating(kept[0], theirs), _floating(kept[1], ours))

    def close(reference: Array, candidate: Array) -> bool:
        return bool(np.allclose(candidate, reference, rtol=tolerance.rtol, atol=tolerance.atol, equal_nan=True))

    found = relate(
        [(n, _array(kept[0][n])) for n in theirs],
        [(n, _array(kept[1][n])) for n in held],
        close,
    )
    if len(held) < len(ours) and found is not None and found.first is None:
        # the budget left the candidate's later ops unchecked: "none of them differs" would say more than was seen
        return replace(found, cut=True)
    return found


def inside_lines(
    found: HeadSlices | None, reference_lines: Mapping[str, str], candidate_lines: Mapping[str, str]
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """The line that made each tensor `found` names, where one was recorded: the reference's sliced tensors', the
    candidate's ops'."""
    if found is None:
        return (), ()
    theirs = [m.slice.reference for m in found.matched]
    ours = [*found.unrelated, *(m.candidate for m in found.matched)]
    if found.first is not None:
        ours.append(found.first.candidate)
        theirs += [found.first.slice.reference] if found.first.slice is not None else []
    return _lines(theirs, reference_lines), _lines(ours, candidate_lines)


def _lines(names: Sequence[str], lines: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple((n, lines[n]) for n in dict.fromkeys(names) if lines.get(n))


def _floating(values: Mapping[str, torch.Tensor], names: Sequence[str]) -> str:
    """The dtype of the first floating tensor of `names` ("float32" where none is)."""
    return next((dtype_name(values[n].dtype) for n in names if values[n].is_floating_point()), "float32")


def _array(value: torch.Tensor) -> Array:
    """A tensor's values as numpy: floating in float64 (bfloat16 has no numpy dtype), complex in complex128, bool
    as 0 and 1."""
    value = value.detach().cpu().resolve_conj().resolve_neg()
    if value.is_complex():
        value = value.to(torch.complex128)
    elif value.is_floating_point():
        value = value.to(torch.float64)
    elif value.dtype == torch.bool:  # numpy's isclose subtracts, which bool arrays refuse
        value = value.to(torch.int64)
    array: Array = value.numpy()
    return array
