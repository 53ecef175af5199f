"""What lies before a first divergence in each side's order of tensors: the tensors one side recorded that pair with
nothing, the candidate's recorded early, op pairs their contents paired across call indices, the module that made
a call's input. Pure functions of the two orders and what `live/divergence.py` paired in them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

# the candidate's recorded early, by the rule the session's report says it with too
from tensor_debugger.engine.capture_order import OUTPUTS, early_before, is_module_input, module_of
from tensor_debugger.engine.op_alignment import crossed
from tensor_debugger.engine.summary_compare import Sketch

__all__ = ["OUTPUTS", "crossed_before", "early_before", "later_of", "module_before", "names_before", "one_sided_before"]


def names_before(order: Sequence[str], name: str) -> Sequence[str]:
    """The names of `order` before `name`."""
    return order[: order.index(name)]


def later_of(order: Sequence[str], one: str | None, other: str) -> str | None:
    """Whichever of `one` and `other` comes later in `order`; None (the end) where `one` is None."""
    if one is None:
        return None
    return one if order.index(one) >= order.index(other) else other


def crossed_before(
    settled: Mapping[tuple[str, str], str],
    order: Sequence[str],
    name: str,
    ref_lines: Mapping[str, str],
    cand_lines: Mapping[str, str],
) -> tuple[tuple[str, str, str, str], ...]:
    """The op pairs of `name`'s module call before it, in the reference's `order`, that their contents paired
    across call indices (`engine/op_alignment.crossed`, the rule the session's first divergence uses too): each the
    reference's tensor and line, the candidate's and line."""
    found = crossed(settled, order[: order.index(name)], module_of(name))
    return tuple((a, ref_lines.get(a) or "", b, cand_lines.get(b) or "") for a, b in found)


def one_sided_before(
    order: Sequence[str],
    name: str,
    paired: Callable[[str], bool],
    sources: Mapping[str, str],
    summaries: Mapping[str, Sketch],
) -> tuple[tuple[str, str], ...]:
    """The tensors of one side's `order` that have no partner (`paired` False), between the last paired one before
    `name` and `name`, in order, each with its source line ("" where none). Where `name` is one of a module call's
    outputs, its other outputs before it (recorded as the call returned, after everything it computed) are passed
    over: the op that made `name` is nearer than them in the order it ran; so are a module call's other inputs,
    where `name` is one of them (recorded as the call began, after whatever made each). So are paired tensors that
    hold no elements (a cache's `torch.tensor([])` made just before its first `cat`): they agree by holding nothing,
    which tells nothing of the values before them."""
    found: list[tuple[str, str]] = []
    outputs_of = OUTPUTS.sub("", name) if OUTPUTS.search(name) and "/" not in name else None
    inputs_of = module_of(name) if is_module_input(name) else None
    for other in reversed(order[: order.index(name)]):
        if outputs_of is not None and OUTPUTS.search(other) and OUTPUTS.sub("", other) == outputs_of:
            continue
        if inputs_of is not None and is_module_input(other) and module_of(other) == inputs_of:
            continue
        if paired(other):
            if summaries[other].numel == 0:
                continue
            break
        found.append((other, sources.get(other) or ""))
    return tuple(reversed(found))


def module_before(order: Sequence[str], index: int, module: str) -> str | None:
    """The module call of the nearest tensor before `order[index]` that is neither in `module` nor one of its
    ancestors (whose inputs come before everything inside it): the module that made its input."""
    for name in reversed(order[:index]):
        other = module_of(name)
        if other == module or module.startswith(other + ".") or other.startswith(module + "."):
            continue
        return other
    return None
