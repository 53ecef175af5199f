"""The captured ops of a candidate and of the run it is compared against, paired as `engine/op_alignment.pair_ops`
aligns them (module call by module call, a sequence alignment on op, place, shape and dtype's kind), before the
pairing chain of `engine/pairing.py` pairs the rest: a `reshape` one side calls more often is that side's alone, in
place, and the calls after it pair with their true counterparts, not with the calls of the same index. The user's
own pairs and unpairs win."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tensor_debugger.engine.logical_tensors import LogicalTensor, TensorRef, group_shards
from tensor_debugger.engine.name_patterns import apply_name_pattern
from tensor_debugger.engine.op_alignment import AMBIGUOUS, BY_CONTENT, LEFT_OVER, Likeness, OpTensor, pair_ops
from tensor_debugger.engine.pairing import (
    PARAMETER,
    PARAMETER_BY_POSITION,
    PARAMETER_THROUGH_KWARGS,
    Pairing,
    PairPlan,
    execution_order,
)

ALIGNED = "module aligned"  # the strategy of a pair of ops the alignment made ("module": by module call and op)
# ops of one name and shape in one module call that the alignment paired by position, settled by their contents
# (engine/op_alignment.settle_by_content): the two sides compute them in another order (k before q)
BY_CONTENT_STRATEGY = "module by content"
LEFT_OVER_STRATEGY = "module left over"  # the one left once the others paired by content
AMBIGUOUS_STRATEGY = "module ambiguous"  # kept by position, which content neither confirms nor replaces
_STRATEGIES = {BY_CONTENT: BY_CONTENT_STRATEGY, LEFT_OVER: LEFT_OVER_STRATEGY, AMBIGUOUS: AMBIGUOUS_STRATEGY}


def op_strategy(settled: str | None) -> str:
    """The strategy of a pair of ops the alignment made, settled `settled` by their contents (None: by position
    alone, or a match of its own)."""
    return _STRATEGIES.get(settled or "", ALIGNED)


def settled_by(strategy: str) -> str | None:
    """How a stored pair of ops was settled by their contents (`BY_CONTENT`, `LEFT_OVER`, `AMBIGUOUS`), from its
    strategy (`op_strategy`'s inverse); None for any other pair."""
    return next((how for how, named in _STRATEGIES.items() if named == strategy), None)


def pairing_note(strategy: str) -> str | None:
    """What a pair's strategy says of how its two ops were paired, in words, where they were not paired by position
    alone, or of how two module inputs were paired where their names differ (the pair page, the JSON's
    `pairing_note`); None for any other pair."""
    if strategy == PARAMETER:
        return (
            "paired by parameter: one side passes this input by keyword and the other by position, and both bind "
            "to the same parameter of the module's forward"
        )
    if strategy == PARAMETER_BY_POSITION:
        return (
            "paired by parameter position: one side passes this input by keyword to its forward's positional "
            "parameter k, and the other passes it as its k-th positional argument (into *args, or to a parameter of "
            "another name)"
        )
    if strategy == PARAMETER_THROUGH_KWARGS:
        return (
            "paired by parameter name through **kwargs: one side passes this input by keyword into its forward's "
            "**kwargs, and the other binds it to its forward's parameter of that name"
        )
    if strategy == BY_CONTENT_STRATEGY:
        return (
            "paired by content: the two sides compute these ops (of one name and shape) in another order; paired by "
            "position they differ, and their summaries match paired so"
        )
    if strategy == LEFT_OVER_STRATEGY:
        return (
            "paired by content: the two sides compute these ops (of one name and shape) in another order; the others "
            "paired by their matching summaries, and this pair is the one left (or each is the other's nearest)"
        )
    if strategy == AMBIGUOUS_STRATEGY:
        return (
            "paired by position, ambiguous: ops of this name and shape in this module call differ paired by "
            "position, and their contents neither confirm that pairing nor give another; which op faces which is "
            "not known: this pair's error counts toward no culprit (its module is judged on its own inputs and "
            "outputs)"
        )
    return None


@dataclass(frozen=True)
class OpPlan:
    """The ops the alignment decided: `pairs` (logical tensors, strategy `ALIGNED`), `alone_a`, `alone_b` (left
    on their side: no other strategy may pair them), and the ids of their stored tensors (`taken`), which the
    pairing chain is not given."""

    pairs: list[PairPlan]
    alone_a: list[LogicalTensor]
    alone_b: list[LogicalTensor]
    taken: frozenset[int]

    def rest(self, tensors: Sequence[TensorRef]) -> list[TensorRef]:
        """`tensors` less those the alignment decided: what the pairing chain pairs."""
        return [t for t in tensors if t.id not in self.taken]

    def merge(self, pairing: Pairing) -> Pairing:
        """`pairing` (of the rest) with the alignment's pairs and ops alone, each list in execution order."""
        return Pairing(
            _in_order([*pairing.pairs, *self.pairs], lambda p: p.a),
            _in_order([*pairing.unmatched_a, *self.alone_a], lambda t: t),
            _in_order([*pairing.unmatched_b, *self.alone_b], lambda t: t),
        )


def plan_ops(
    reference: Sequence[TensorRef],
    candidate: Sequence[TensorRef],
    manual: Sequence[tuple[str, str]],
    unpaired: Sequence[tuple[str, str]],
    pattern: re.Pattern[str] | None,
    content: Callable[[LogicalTensor, LogicalTensor], Likeness] | None = None,
) -> OpPlan:
    """The ops of `reference` and `candidate` (their stored tensors, in execution order) paired by alignment, as
    logical tensors (shards merged, the name pattern applied, as `pair_runs` takes them), less those the user
    paired (`manual`) or held apart (`unpaired` with one name empty): the chain decides those as the user said. A
    pair the user refused (`unpaired` with both names) leaves its two ops on their sides alone. `content`: what two
    ops' contents tell (their summaries), by which ops of one name and shape paired by position are checked."""
    held_a = {a for a, _ in manual} | {a for a, b in unpaired if a and not b}
    held_b = {b for _, b in manual} | {b for a, b in unpaired if b and not a}
    refused = {(a, b) for a, b in unpaired if a and b}
    ops_a, ops_b = _ops(reference, pattern, held_a), _ops(candidate, pattern, held_b)
    judge = None if content is None else lambda a, b: content(ops_a[a], ops_b[b])
    found = pair_ops([_op(t) for t in ops_a.values()], [_op(t) for t in ops_b.values()], judge)
    pairs = [
        PairPlan(ops_a[a], ops_b[b], op_strategy(found.settled.get((a, b))))
        for a, b in found.pairs
        if (a, b) not in refused
    ]
    alone_a = [ops_a[a] for a in found.alone_a] + [ops_a[a] for a, b in found.pairs if (a, b) in refused]
    alone_b = [ops_b[b] for b in found.alone_b] + [ops_b[b] for a, b in found.pairs if (a, b) in refused]
    taken = {s.id for t in [*(p.a for p in pairs), *(p.b for p in pairs), *alone_a, *alone_b] for s in t.shards}
    return OpPlan(pairs, alone_a, alone_b, frozenset(taken))


def _ops(tensors: Sequence[TensorRef], pattern: re.Pattern[str] | None, held: set[str]) -> dict[str, LogicalTensor]:
    """The run's logical tensors captured inside a module (their module path names one) but those `held`, by name,
    in execution order."""
    logical = group_shards(apply_name_pattern(tensors, pattern), pattern)
    found = sorted((t for t in logical if t.first.module_path is not None and t.name not in held), key=_position)
    return {t.name: t for t in found}


def _position(tensor: LogicalTensor) -> int:
    return tensor.position


def _op(tensor: LogicalTensor) -> OpTensor:
    return OpTensor(tensor.name, tensor.first.shape, tensor.first.dtype)


T = TypeVar("T")


def _in_order(items: list[T], tensor: Callable[[T], LogicalTensor]) -> list[T]:
    """`items` in execution order (`engine/pairing.execution_order`), by position where a dump's tensors and traced
    ones are mixed (their orders do not compare)."""
    try:
        return sorted(items, key=lambda item: execution_order(tensor(item)))
    except TypeError:
        return sorted(items, key=lambda item: tensor(item).position)
