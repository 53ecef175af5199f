"""What a capture's names and order tell of a first divergence, by one rule wherever it is said: `find_divergence`
(live/divergence.py, on the captures it holds) and a session's own report (compare/reports/before_divergence.py, on
the rows it stores). How a capture names a module call's tensors (live/recorder.py): `Net.attn_inputs_args_0`,
`Net.attn_outputs`, an op's `Net.attn/mul#1_outputs`."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

_PLACE = re.compile(r"_(?:inputs_(?:args|kwargs)_.+|outputs(?:_.+)?)$")
OUTPUTS = re.compile(r"_outputs(?:_.+)?$")  # a module call's outputs: "Net.head_outputs", "Net_outputs_1"


def module_of(name: str) -> str:
    """The module call of a tensor's name: `Net.layers.1.self_attn/mul#1_outputs` -> `Net.layers.1.self_attn`."""
    return _PLACE.sub("", name).partition("/")[0]


def is_module_input(name: str) -> bool:
    """Whether a tensor's name is a module's input's (`Net.attn.o_inputs_args_0`), not an op's or an output's."""
    return "/" not in name and "_inputs_" in name[len(module_of(name)) :]


def early_before(
    order: Sequence[str],
    name: str,
    partner_of: Mapping[str, str],
    reference_index: Mapping[str, int],
    index: int,
    sources: Mapping[str, str],
    reference_sources: Mapping[str, str],
) -> tuple[tuple[str, str, str], ...]:
    """The candidate's tensors of `order` just before `name` whose partners (`partner_of`: the reference's, by
    key) the reference recorded after its first divergence (at `index` in its order, as `reference_index` places
    each partner): from `name` back to the last whose partner comes before it, those unpaired passed over, as a
    module call's other outputs are. Inside an op's own module call (its submodules' calls too), tensors whose
    partners come before are passed over as well: ops that agree can lie between (a rotary's `unsqueeze` of its
    cosines, after the query's norm called before the rotary where the reference calls it after). Each with its
    line and its partner's."""
    found: list[tuple[str, str, str]] = []
    outputs_of = OUTPUTS.sub("", name) if OUTPUTS.search(name) and "/" not in name else None
    at = order.index(name)
    call = module_of(name) if "/" in name else None
    # where the op's module call begins in the order (its first tensor: an input); what follows it up to the op is
    # inside that call, its submodules' calls included, whichever call of the module it is (a second call's
    # submodules are named `M.a.rot#2`, not `M.a#2.rot`)
    begins = next((i for i, n in enumerate(order[:at]) if module_of(n) == call), None) if call is not None else at
    if begins is None:  # the call recorded nothing of its own before the op (no tensor argument): its submodules'
        # calls just before the op, by path, are inside it
        inside = re.sub(r"#\d+$", "", call or "")
        begins = at
        while begins > 0 and re.sub(r"#\d+", "", module_of(order[begins - 1])).startswith(inside + "."):
            begins -= 1
    for position in range(at - 1, -1, -1):
        other = order[position]
        if outputs_of is not None and OUTPUTS.search(other) and OUTPUTS.sub("", other) == outputs_of:
            continue
        partner = partner_of.get(other)
        if partner is None:
            continue
        if reference_index[partner] < index:
            if position >= begins:
                continue
            break
        found.append((other, sources.get(other) or "", reference_sources.get(partner) or ""))
    return tuple(reversed(found))


def holds_one_value(numel: int, minimum: float | None, maximum: float | None, nan: int) -> bool:
    """Whether a tensor tells nothing by its content hash: empty, every element one value (zeros, ones, a mask of
    one kind match anything of their shape), or holding a NaN (its hash equal to another's is no pass)."""
    return not numel or minimum == maximum or nan > 0


def held_before(before: Sequence[str], hashes: Mapping[str, frozenset[str]], theirs: frozenset[str]) -> str | None:
    """The last of the reference's tensors `before` a first divergence (in its order) with a content hash among
    `theirs` (the candidate's tensor's hashes, each "<kind>:<hex>": the dtype, the shape and every byte equal;
    `hashes`, each tensor's); None where none has. The caller leaves out a candidate's tensor that
    `holds_one_value`."""
    return next((n for n in reversed(before) if hashes.get(n, frozenset()) & theirs), None)
