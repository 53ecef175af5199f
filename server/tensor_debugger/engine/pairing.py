"""Pair the tensors of a reference run with those of a candidate run.

Tensor-parallel shards (`_rank{k}`, `_tp{k}` suffixes, `rank{k}/` or `tp{k}/` folders, or a name pattern's
`rank` group) first merge into one logical tensor per run. Each logical tensor also gets an identity: its name
less what only packages it (see `identities`). Then a chain of strategies pairs what is left, each pair
remembering which matched it: manual pairs (which win over everything), layer + stage (+ key path), the same
name or identity, the same module path and place under a renamed model class, a captured module input bound to
the same parameter of the module's `forward` (passed by keyword on one side, by position on the other; or by a
keyword into `**kwargs` on one side, to the parameter of that name on the other; or by keyword to the positional
parameter k on one side, as the k-th positional argument on the other), the same key path, normalised
names, fuzzy names (`fuzzy.py`), and a shape unique on both sides (dumps only). The chain is the session's choice
(`parse_strategies`). Whatever stays unmatched is listed per run.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from tensor_debugger.engine.fuzzy import fuzzy_matches, parse_threshold
from tensor_debugger.engine.logical_tensors import LogicalTensor, TensorRef, group_shards, identities
from tensor_debugger.engine.name_patterns import apply_name_pattern
from tensor_debugger.engine.names import normalize
from tensor_debugger.engine.stages import execution_key

__all__ = ["normalize"]  # where callers have always found it

_T = TypeVar("_T")
_U = TypeVar("_U")
_V = TypeVar("_V")


@dataclass(frozen=True)
class PairPlan:
    a: LogicalTensor  # reference
    b: LogicalTensor  # candidate
    # "manual", "layer_stage", "name", "module", "parameter" ("parameter through **kwargs"), "key", "normalized",
    # "fuzzy 0.93", "shape"
    strategy: str


@dataclass
class Pairing:
    pairs: list[PairPlan] = field(default_factory=list)  # in execution order
    unmatched_a: list[LogicalTensor] = field(default_factory=list)
    unmatched_b: list[LogicalTensor] = field(default_factory=list)


KeyFn = Callable[[LogicalTensor], Hashable | None]


def _unique_index(items: Iterable[_T], key: Callable[[_T], Hashable | None]) -> dict[Hashable, _T]:
    keyed = [(k, item) for item in items if (k := key(item)) is not None]
    counts = Counter(k for k, _ in keyed)
    return {k: item for k, item in keyed if counts[k] == 1}


def unique_matches(
    left: Iterable[_T],
    right: Iterable[_U],
    key_a: Callable[[_T], Hashable | None],
    key_b: Callable[[_U], Hashable | None],
) -> list[tuple[_T, _U]]:
    """The items of `left` and `right` whose key is unique on both sides, paired (each strategy's rule), in the
    order of `left`."""
    index_a, index_b = _unique_index(left, key_a), _unique_index(right, key_b)
    return [(a, index_b[k]) for k, a in index_a.items() if k in index_b]


def _match(
    left: list[LogicalTensor],
    right: list[LogicalTensor],
    key: Callable[[LogicalTensor], Hashable | None],
    strategy: str,
    pairs: list[PairPlan],
) -> tuple[list[LogicalTensor], list[LogicalTensor]]:
    """Pair items whose key is unique on both sides; hand back what is left on each."""
    if not left or not right:
        return left, right
    matched = unique_matches(left, right, key, key)
    if not matched:
        return left, right
    pairs.extend(PairPlan(a, b, strategy) for a, b in matched)
    matched_a, matched_b = {id(a) for a, _ in matched}, {id(b) for _, b in matched}
    return [a for a in left if id(a) not in matched_a], [b for b in right if id(b) not in matched_b]


def _module_place(t: LogicalTensor) -> Hashable | None:
    """The module path without its root (the model's class name, which a port often renames) and the place. A
    captured op's path ends in `/{op}#{n}` (`model.layers.3.self_attn/softmax#1`), the root's own ops' too
    (`LlamaForCausalLM/add#1`): they pair by module path, op and call index. The model called again in one capture
    keeps its call's number (`LlamaForCausalLM#2/add#1`: `#2/add#1`), so its calls do not collide."""
    path = t.first.module_path
    if path is None or t.first.place is None:
        return None
    return (without_root(path), t.first.place)


def without_root(module_path: str) -> str:
    """A module call's path without its root, the model's class name (`Net.layers.0.attn#2` -> `layers.0.attn#2`,
    `Net#2/add#1` -> `#2/add#1`)."""
    root = len(module_path)
    for separator in "./#":
        found = module_path.find(separator)
        root = found if found != -1 and found < root else root
    return module_path[root:].removeprefix(".")


_ARGUMENT = re.compile(r"^inputs_args_(\d+)")

# How a capture records the parameter of the module's `forward` an argument binds to (live/parameters.py): a
# positional parameter as `{name}@{k}` (its position in the signature beside its name: `mask@1`; data dirs from
# before it hold `mask`), a keyword-only one as its name; one past the named positional ones as `*{i}` (its position
# in the call, into `*args`), a keyword no parameter is named for as `**{key}` (into `**kwargs`). None of these marks
# can be in a parameter's name, so none collides with one
ARGS_MARK = "*"
KWARGS_MARK = "**"
POSITION_MARK = "@"
PARAMETER = "parameter"
# the strategy of a pair made by the parameter rule where one side's input went through `**kwargs` (paired by the
# keyword's name with the other side's parameter of that name); its first word is the strategy's, as fuzzy's score
PARAMETER_THROUGH_KWARGS = "parameter through **kwargs"
# the strategy of a pair made by position: a keyword argument bound to the positional parameter k on one side, the
# k-th positional argument (into `*args`, or to a parameter of another name) on the other
PARAMETER_BY_POSITION = "parameter by position"


def parameter_name(parameter: str) -> tuple[str, int | None]:
    """A recorded parameter's name and its position in the signature (None where none was recorded: a keyword-only
    parameter, `*args`' and `**kwargs`' entries, a data dir from before positions were recorded)."""
    if parameter.startswith(ARGS_MARK):
        return parameter, None
    name, mark, position = parameter.rpartition(POSITION_MARK)
    return (name, int(position)) if mark and position.isdigit() else (parameter, None)


def parameter_key(module_path: str, place: str, parameter: str | None) -> Hashable | None:
    """What pairs a captured module input passed by keyword on one side with the one passed by position on the
    other (strategy `parameter`): its module call (without the root), the parameter of the module's `forward` its
    argument binds to, and its part within that argument (`_0` for a tuple's first). A keyword that went into
    `**kwargs` (`**mask`) counts as the parameter of its name (`mask`), so it pairs with `mask` on the other side
    (bound by position or by keyword) and with another `**kwargs`' `mask`; an argument that went into `*args`
    (`*2`) pairs only with the other side's argument at that position into `*args`. `place` is
    `inputs_args_{i}...` or `inputs_kwargs_{key}...`; None for a tensor with no parameter recorded (another
    place, or a Hugging Face trace), or one whose place does not fit it. Read by the session's planning and by
    find_divergence alike, so they cannot pair otherwise."""
    if parameter is None:
        return None
    found = _ARGUMENT.match(place)
    if parameter.startswith(KWARGS_MARK):
        name = parameter[len(KWARGS_MARK) :]
        keyword = f"inputs_kwargs_{name}"
        if found is not None or not (place == keyword or place.startswith(keyword + "_")):
            return None
        return (without_root(module_path), name, place[len(keyword) :])
    if parameter.startswith(ARGS_MARK):
        if found is None or parameter != f"{ARGS_MARK}{found.group(1)}":
            return None
        return (without_root(module_path), parameter, place[found.end() :])
    name = parameter_name(parameter)[0]
    keyword = f"inputs_kwargs_{name}"
    if found is not None:
        part = place[found.end() :]
    elif place == keyword or place.startswith(keyword + "_"):
        part = place[len(keyword) :]
    else:
        return None
    return (without_root(module_path), name, part)


def position_key(
    module_path: str, place: str, parameter: str | None, shape: Hashable = None
) -> tuple[Hashable, bool] | None:
    """What pairs a keyword argument bound to the positional parameter k of one side's `forward` with the other
    side's k-th positional argument (strategy `parameter by position`: `forward(self, x, mask)` called with
    `mask=m` against `forward(self, *args)` called `(h, m)`), and whether it was passed by keyword: the module call
    (without the root), k, the part within the argument and the tensor's `shape` (two signatures of other orders
    put other tensors at one position: of one shape they are more likely one). None where no parameter was
    recorded, for a keyword into `**kwargs` or to a keyword-only parameter (no position), and where the place does
    not fit the parameter."""
    if parameter is None or parameter.startswith(KWARGS_MARK):
        return None
    found = _ARGUMENT.match(place)
    if found is not None:
        return (without_root(module_path), int(found.group(1)), place[found.end() :], shape), False
    name, position = parameter_name(parameter)
    keyword = f"inputs_kwargs_{name}"
    if position is None or not (place == keyword or place.startswith(keyword + "_")):
        return None
    return (without_root(module_path), position, place[len(keyword) :], shape), True


def position_matches(
    left: Sequence[_T],
    right: Sequence[_U],
    key_a: Callable[[_T], tuple[Hashable, bool] | None],
    key_b: Callable[[_U], tuple[Hashable, bool] | None],
) -> list[tuple[_T, _U]]:
    """The items of `left` and `right` paired by `position_key` where one side passed its argument by keyword and
    the other by position (two keywords of other names at one position are other parameters: an optional
    `position_ids=` against an optional `attention_mask=` of another signature's order), unique on both sides."""

    def only(key: Callable[[_V], tuple[Hashable, bool] | None], by_keyword: bool) -> Callable[[_V], Hashable | None]:
        def keyed(item: _V) -> Hashable | None:
            found = key(item)
            return found[0] if found is not None and found[1] == by_keyword else None

        return keyed

    made = unique_matches(left, right, only(key_a, True), only(key_b, False))
    made += unique_matches(left, right, only(key_a, False), only(key_b, True))
    return made


def parameter_strategy(a: str | None, b: str | None) -> str:
    """The strategy of a pair the parameter rule made of inputs bound to `a` and `b`: `PARAMETER_THROUGH_KWARGS`
    where either went through `**kwargs`, `PARAMETER_BY_POSITION` where their names differ (paired by position),
    else `PARAMETER`."""
    if any(p is not None and p.startswith(KWARGS_MARK) for p in (a, b)):
        return PARAMETER_THROUGH_KWARGS
    names = {parameter_name(p)[0] if p is not None else None for p in (a, b)}
    return PARAMETER_BY_POSITION if len(names) > 1 else PARAMETER


def _parameter(t: LogicalTensor) -> Hashable | None:
    """`parameter_key` of a tensor, or of a tensor's shards (ranks') where all are bound to one parameter."""
    if t.first.module_path is None or t.first.place is None or len({s.parameter for s in t.shards}) != 1:
        return None
    return parameter_key(t.first.module_path, t.first.place, t.first.parameter)


def _position(t: LogicalTensor) -> tuple[Hashable, bool] | None:
    """`position_key` of a tensor, or of a tensor's shards (ranks') where all are bound to one parameter."""
    if t.first.module_path is None or t.first.place is None or len({s.parameter for s in t.shards}) != 1:
        return None
    return position_key(t.first.module_path, t.first.place, t.first.parameter, tuple(t.shapes))


def is_op(t: LogicalTensor) -> bool:
    """A captured op's tensor (its module path names the op: `…self_attn/softmax#1`)."""
    return t.first.module_path is not None and "/" in t.first.module_path


def execution_order(t: LogicalTensor) -> tuple[object, ...]:
    """Call order for traced tensors (their position); layer and stage order for dumps."""
    if t.first.module_path is not None:
        return (0, -1, (t.position,))
    return execution_key(t.layer, t.stage, t.position, t.name)


def _layer_stage(t: LogicalTensor) -> Hashable | None:
    if t.layer is None or t.stage is None:
        return None
    return (t.layer, t.stage, t.first.key_path)


# Each strategy's keys, tried in turn: a pair is made where a key is unique on both sides.
STRATEGIES: dict[str, list[KeyFn]] = {
    "layer_stage": [_layer_stage],
    "name": [lambda t: t.name, lambda t: t.identity or None],
    "module": [_module_place],
    # a module's input passed by keyword on one side, by position on the other (`attn(x=h)`, `attn(h)`), where the
    # capture recorded the parameter each binds to; after the names, so it pairs only what they leave. Then (in
    # `pair_runs`) a keyword argument bound to the positional parameter k against the other side's k-th positional
    # argument (`position_matches`: `mask=m` against `*args`' second)
    "parameter": [_parameter],
    "key": [lambda t: t.first.key_path or None],
    "normalized": [lambda t: normalize(t.identity or t.name) or None],
    "fuzzy": [],  # fuzzy.fuzzy_matches, not a key
    # traced tensors are named by module and place: a shape alone would pair an attention mask with a stranger
    "shape": [lambda t: tuple(t.shapes) if t.first.module_path is None else None],
}
DEFAULT_STRATEGIES = ("layer_stage", "name", "module", "parameter", "key", "normalized", "fuzzy", "shape")


def parse_strategies(items: str | Sequence[str] | None) -> list[str]:
    """A chain of strategy names, in order ("layer_stage,name,fuzzy:0.8,shape" or a list); `fuzzy:T` sets the
    fuzzy threshold T (0 to 1). None or empty: the default chain. Raises ValueError naming the problem."""
    if items is None:
        return list(DEFAULT_STRATEGIES)
    names = [part.strip() for part in (items.split(",") if isinstance(items, str) else items)]
    names = [n for n in names if n]
    if not names:
        return list(DEFAULT_STRATEGIES)
    seen: set[str] = set()
    for name in names:
        base, _, threshold = name.partition(":")
        if base not in STRATEGIES:
            raise ValueError(f"unknown pairing strategy {base!r}: choose from {', '.join(STRATEGIES)}")
        if threshold and base != "fuzzy":
            raise ValueError(f"strategy {base!r} takes no value (only fuzzy:THRESHOLD does), got {name!r}")
        if threshold:
            parse_threshold(threshold)
        if base in seen:
            raise ValueError(f"strategy {base!r} is named twice")
        seen.add(base)
    return names


def pair_runs(
    reference: Iterable[TensorRef],
    candidate: Iterable[TensorRef],
    manual: Iterable[tuple[str, str]] = (),
    unpaired: Iterable[tuple[str, str]] = (),
    strategies: Sequence[str] | None = None,
    pattern: re.Pattern[str] | None = None,
) -> Pairing:
    """Pair two runs. `manual` (reference name, candidate name) pairs win; `unpaired` pairs are never made (an
    empty name on one side: that side's tensor is never paired automatically). `strategies`: the chain, in
    order (`parse_strategies`; None: the default). `pattern`: a name pattern (`compile_name_pattern`)."""
    chain = parse_strategies(strategies)
    left = group_shards(apply_name_pattern(reference, pattern), pattern)
    right = group_shards(apply_name_pattern(candidate, pattern), pattern)
    left = [LogicalTensor(t.name, t.shards, i) for t, i in zip(left, identities(left), strict=True)]
    right = [LogicalTensor(t.name, t.shards, i) for t, i in zip(right, identities(right), strict=True)]
    pairs: list[PairPlan] = []
    by_name_a = {t.name: t for t in left}
    by_name_b = {t.name: t for t in right}
    for name_a, name_b in manual:
        a, b = by_name_a.get(name_a), by_name_b.get(name_b)
        if a is not None and b is not None and a in left and b in right:
            pairs.append(PairPlan(a, b, "manual"))
            left = [t for t in left if t is not a]
            right = [t for t in right if t is not b]
    forbidden = set(unpaired)
    alone_a = {a for a, b in forbidden if not b}
    alone_b = {b for a, b in forbidden if not a}
    held_a = [t for t in left if t.name in alone_a]
    held_b = [t for t in right if t.name in alone_b]
    left = [t for t in left if t.name not in alone_a]
    right = [t for t in right if t.name not in alone_b]
    for item in chain:
        strategy, _, value = item.partition(":")
        before = len(pairs)
        if strategy == "fuzzy":
            # an op left over on one side is an op the other implementation does not call (a fused kernel, an
            # extra cast): a near name (`matmul#2` beside `bmm#1`) is another op, never its pair
            threshold = parse_threshold(value) if value else None
            ops_a, ops_b = [t for t in left if is_op(t)], [t for t in right if is_op(t)]
            left, right = [t for t in left if not is_op(t)], [t for t in right if not is_op(t)]
            found = fuzzy_matches(left, right, threshold)
            pairs += [PairPlan(left[i], right[j], f"fuzzy {score:.2f}") for i, j, score in found]
            made_a, made_b = {i for i, _, _ in found}, {j for _, j, _ in found}
            left = [t for i, t in enumerate(left) if i not in made_a] + ops_a
            right = [t for j, t in enumerate(right) if j not in made_b] + ops_b
        for key in STRATEGIES[strategy]:
            left, right = _match(left, right, key, strategy, pairs)
        if strategy == PARAMETER:
            pairs[before:] = [
                replace(p, strategy=parameter_strategy(p.a.first.parameter, p.b.first.parameter))
                for p in pairs[before:]
            ]
            # what the names leave: a keyword argument against the other side's positional one at its position
            by_position = position_matches(left, right, _position, _position)
            pairs += [PairPlan(a, b, PARAMETER_BY_POSITION) for a, b in by_position]
            taken_a, taken_b = {id(a) for a, _ in by_position}, {id(b) for _, b in by_position}
            left = [t for t in left if id(t) not in taken_a]
            right = [t for t in right if id(t) not in taken_b]
        refused = [p for p in pairs[before:] if (p.a.name, p.b.name) in forbidden]
        if refused:
            pairs = [p for p in pairs if p not in refused]
            left += [p.a for p in refused]
            right += [p.b for p in refused]
    pairs.sort(key=lambda p: execution_order(p.a))
    return Pairing(pairs, sorted(left + held_a, key=execution_order), sorted(right + held_b, key=execution_order))
