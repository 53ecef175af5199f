"""Pair the tensors of a reference run with those of a candidate run.

Tensor-parallel shards (`_rank{k}`, `_tp{k}` suffixes, `rank{k}/` or `tp{k}/` folders) first merge into one
logical tensor per run. Then a chain of strategies pairs what is left, each pair remembering which matched it:
manual pairs (which win over everything), layer + stage (+ key path), the same name, the same module path and
place under a renamed model class, the same key path, normalised names, and a shape unique on both sides (dumps
only). Whatever stays unmatched is listed per run.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from tensor_debugger.engine.stages import execution_key

_SHARD_SUFFIX = re.compile(r"^(?P<base>.+?)_(?:rank|tp)(?P<rank>\d+)(?P<rest>(?:\..*)?)$", re.IGNORECASE)
_SHARD_FOLDER = re.compile(r"(?:^|/)(?:rank|tp)[_-]?(?P<rank>\d+)(?:/|$)", re.IGNORECASE)
_PREFIXES = ("orig.mod.", "module.", "model.", "transformer.", "base.model.")  # after normalising separators


@dataclass(frozen=True)
class TensorRef:
    """What the engine needs to know of a stored tensor."""

    id: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    position: int
    layer: int | None = None
    stage: str | None = None
    key_path: tuple[str, ...] = ()
    digest: str = ""
    module_path: str | None = None  # from a module trace or a capture
    place: str | None = None


@dataclass(frozen=True)
class LogicalTensor:
    """One tensor of a run: a stored tensor, or the shards of one split across tensor-parallel ranks."""

    name: str
    shards: tuple[TensorRef, ...]  # in rank order

    @property
    def first(self) -> TensorRef:
        return self.shards[0]

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [s.shape for s in self.shards]

    @property
    def layer(self) -> int | None:
        return self.first.layer

    @property
    def stage(self) -> str | None:
        return self.first.stage

    @property
    def position(self) -> int:
        return min(s.position for s in self.shards)


@dataclass(frozen=True)
class PairPlan:
    a: LogicalTensor  # reference
    b: LogicalTensor  # candidate
    strategy: str  # "manual", "layer_stage", "name", "module", "key", "normalized", "shape"


@dataclass
class Pairing:
    pairs: list[PairPlan] = field(default_factory=list)  # in execution order
    unmatched_a: list[LogicalTensor] = field(default_factory=list)
    unmatched_b: list[LogicalTensor] = field(default_factory=list)


def shard_of(name: str) -> tuple[str, int | None]:
    """(logical name, rank) of a stored tensor's name; rank None when it is not a shard."""
    folder = _SHARD_FOLDER.search(name)
    if folder:
        start, end = folder.span()
        joined = name[:start] + ("/" if start and end < len(name) else "") + name[end:]
        return joined.strip("/"), int(folder.group("rank"))
    suffix = _SHARD_SUFFIX.match(name)
    if suffix:
        return suffix.group("base") + suffix.group("rest"), int(suffix.group("rank"))
    return name, None


def group_shards(tensors: Iterable[TensorRef]) -> list[LogicalTensor]:
    """Merge shards of one tensor; a lone `_rank0` stays a tensor of its own name without the mark."""
    groups: dict[str, list[tuple[int, TensorRef]]] = {}
    for tensor in tensors:
        logical, rank = shard_of(tensor.name)
        groups.setdefault(logical, []).append((rank if rank is not None else -1, tensor))
    merged: list[LogicalTensor] = []
    for logical, members in groups.items():
        ranks = [r for r, _ in members]
        if len(members) > 1 and (-1 in ranks or len(set(ranks)) != len(ranks)):
            # not a clean set of shards (a plain tensor beside ranked ones): keep each under its own name
            merged.extend(LogicalTensor(t.name, (t,)) for _, t in members)
            continue
        merged.append(LogicalTensor(logical, tuple(t for _, t in sorted(members, key=lambda m: m[0]))))
    return merged


def normalize(name: str) -> str:
    """Lower case, one separator, no common wrapper prefixes (`model.`, `module.`, `_orig_mod.`)."""
    text = re.sub(r"[\s/\\\-_.:]+", ".", name.lower()).strip(".")
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if text.startswith(prefix):
                text, changed = text[len(prefix) :], True
    return text


KeyFn = Callable[[LogicalTensor], Hashable | None]


def _unique_index(items: list[LogicalTensor], key: KeyFn) -> dict[Hashable, LogicalTensor]:
    counts = Counter(k for k in map(key, items) if k is not None)
    return {k: item for item in items if (k := key(item)) is not None and counts[k] == 1}


def _match(
    left: list[LogicalTensor], right: list[LogicalTensor], key: Callable[[LogicalTensor], Hashable | None],
    strategy: str, pairs: list[PairPlan],
) -> tuple[list[LogicalTensor], list[LogicalTensor]]:
    """Pair items whose key is unique on both sides; hand back what is left on each."""
    index_a, index_b = _unique_index(left, key), _unique_index(right, key)
    matched_a: set[int] = set()
    matched_b: set[int] = set()
    for k, a in index_a.items():
        b = index_b.get(k)
        if b is not None:
            pairs.append(PairPlan(a, b, strategy))
            matched_a.add(id(a))
            matched_b.add(id(b))
    return [a for a in left if id(a) not in matched_a], [b for b in right if id(b) not in matched_b]


def _module_place(t: LogicalTensor) -> Hashable | None:
    """The module path without its root (the model's class name, which a port often renames) and the place."""
    if t.first.module_path is None or t.first.place is None:
        return None
    return (t.first.module_path.partition(".")[2], t.first.place)


def execution_order(t: LogicalTensor) -> tuple[object, ...]:
    """Call order for traced tensors (their position); layer and stage order for dumps."""
    if t.first.module_path is not None:
        return (0, -1, (t.position,))
    return execution_key(t.layer, t.stage, t.position, t.name)


def _layer_stage(t: LogicalTensor) -> Hashable | None:
    if t.layer is None or t.stage is None:
        return None
    return (t.layer, t.stage, t.first.key_path)


STRATEGIES: list[tuple[str, Callable[[LogicalTensor], Hashable | None]]] = [
    ("layer_stage", _layer_stage),
    ("name", lambda t: t.name),
    ("module", _module_place),
    ("key", lambda t: t.first.key_path or None),
    ("normalized", lambda t: normalize(t.name)),
    # traced tensors are named by module and place: a shape alone would pair an attention mask with a stranger
    ("shape", lambda t: tuple(t.shapes) if t.first.module_path is None else None),
]


def pair_runs(
    reference: Iterable[TensorRef], candidate: Iterable[TensorRef],
    manual: Iterable[tuple[str, str]] = (), unpaired: Iterable[tuple[str, str]] = (),
) -> Pairing:
    """Pair two runs. `manual` (reference name, candidate name) pairs win; `unpaired` pairs are never made."""
    left, right = group_shards(reference), group_shards(candidate)
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
    for strategy, key in STRATEGIES:
        before = len(pairs)
        left, right = _match(left, right, key, strategy, pairs)
        refused = [p for p in pairs[before:] if (p.a.name, p.b.name) in forbidden]
        if refused:
            pairs = [p for p in pairs if p not in refused]
            left += [p.a for p in refused]
            right += [p.b for p in refused]
    pairs.sort(key=lambda p: execution_order(p.a))
    return Pairing(pairs, sorted(left, key=execution_order), sorted(right, key=execution_order))
