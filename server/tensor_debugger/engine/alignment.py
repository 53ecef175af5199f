"""Alignment: the chain of views that makes a candidate's layout comparable with the reference's.

Replicas first: where every rank of one side holds a whole copy of the other side's tensor (all its shards of one
shape, each alone aligning with the other side without cutting or flattening), they are not shards of one tensor but
copies of it: they are stacked along a new leading dimension (the rank) and the other side is repeated once per rank,
so that every copy is compared with it. Otherwise the chains below are
tried in order of cost, the cheapest chain wins: shards concatenated along the axis that makes the shapes agree,
size-1 dimensions dropped, the other dimensions permuted with the last kept in place, extra leading rows of one
side cut off; where none of these fits, the dimensions permuted with the last moving too (a transpose); and, only
as a last resort and marked so, both flattened when their element counts agree. The
reference keeps its own order of dimensions: aligned coordinates are the reference's, less its size-1 dims.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Step:
    """One view applied to one side. `kind`: concat, squeeze, permute, truncate, flatten; for replicas, stack (the
    side's copies, each after its other steps, along a new dim 0: the rank) and repeat (the other side, once per
    rank along a new dim 0). Stack and repeat come last on their side."""

    side: str  # "a" (reference) or "b" (candidate)
    kind: str
    axis: int = -1  # concat, truncate
    perm: tuple[int, ...] = ()  # permute: output dim i is input dim perm[i]
    size: int = 0  # truncate: rows kept; stack, repeat: the number of ranks
    shape: Shape = ()  # the side's shape after this step

    def words(self) -> str:
        who = "reference" if self.side == "a" else "candidate"
        if self.kind == "concat":
            return f"{who} shards concatenated along dim {self.axis} -> {list(self.shape)}"
        if self.kind == "squeeze":
            return f"{who} size-1 dims dropped -> {list(self.shape)}"
        if self.kind == "permute":
            return f"{who} dims permuted {list(self.perm)} -> {list(self.shape)}"
        if self.kind == "truncate":
            return f"{who} cut to its first {self.size} rows along dim {self.axis} (the rest not compared)"
        if self.kind == "stack":
            stacked = list(self.shape)
            return f"{who} replicated on {self.size} ranks: copies stacked along a new dim 0 (the rank) -> {stacked}"
        if self.kind == "repeat":
            return f"{who} repeated for each rank's copy -> {list(self.shape)}"
        return f"{who} flattened -> {list(self.shape)} (last resort: element counts agree, layouts may not)"

    def to_json(self) -> dict[str, Any]:
        return {
            "side": self.side,
            "kind": self.kind,
            "axis": self.axis,
            "perm": list(self.perm),
            "size": self.size,
            "shape": list(self.shape),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Step:
        return cls(
            str(data["side"]),
            str(data["kind"]),
            int(data.get("axis", -1)),
            tuple(int(x) for x in data.get("perm", ())),
            int(data.get("size", 0)),
            tuple(int(x) for x in data.get("shape", ())),
        )


_COST = {"concat": 1, "squeeze": 1, "permute": 4, "truncate": 6, "flatten": 100, "stack": 0, "repeat": 0}
REPLICA_KINDS = ("stack", "repeat")


@dataclass(frozen=True)
class Alignment:
    shapes_a: tuple[Shape, ...]
    shapes_b: tuple[Shape, ...]
    steps: tuple[Step, ...] = field(default=())
    shape: Shape = ()  # the aligned shape both sides are read in

    @property
    def last_resort(self) -> bool:
        return any(s.kind == "flatten" for s in self.steps)

    @property
    def replicas(self) -> tuple[str, int] | None:
        """(side, ranks) where one side's shards are whole copies (replicas) of the tensor; None otherwise."""
        return replicas_of(self.steps)

    @property
    def cost(self) -> int:
        return sum(_COST[s.kind] for s in self.steps)

    def words(self) -> str:
        return "; ".join(self._step_words(i) for i in range(len(self.steps))) or "same shape"

    def _step_words(self, index: int) -> str:
        step = self.steps[index]
        if step.kind != "truncate":
            return step.words()
        rows = _rows_before(self.shapes_a if step.side == "a" else self.shapes_b, self.steps[:index], step)
        who = "reference" if step.side == "a" else "candidate"
        return (
            f"{who} cut to its first {step.size} of {rows} rows along dim {step.axis} "
            f"({rows - step.size} {who} rows not compared)"
        )

    def side_steps(self, side: str) -> list[Step]:
        return [s for s in self.steps if s.side == side]

    def key(self) -> str:
        """Canonical text of the steps, part of the comparison cache key."""
        return json.dumps([s.to_json() for s in self.steps], separators=(",", ":"))

    def to_json(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape),
            "steps": [s.to_json() for s in self.steps],
            "words": self.words(),
            "last_resort": self.last_resort,
        }

    @classmethod
    def from_steps(cls, shapes_a: list[Shape], shapes_b: list[Shape], steps: list[Step]) -> Alignment:
        """An alignment given explicitly (a user's override); ValueError when the steps do not fit."""
        final: dict[str, Shape] = {}
        for side, shards in (("a", shapes_a), ("b", shapes_b)):
            shape = _merged_without_steps(shards, [s for s in steps if s.side == side])
            for step in (s for s in steps if s.side == side):
                shape = _apply(shape, step, shards)
            final[side] = shape
        if final["a"] != final["b"]:
            raise ValueError(f"the steps give {list(final['a'])} and {list(final['b'])}, which differ")
        return cls(tuple(shapes_a), tuple(shapes_b), tuple(steps), final["a"])


@dataclass(frozen=True)
class ReferenceCut:
    """What an alignment left out of the reference: only `kept` of its `rows` along `axis` (after its own views)
    face the candidate; the other rows were compared with nothing."""

    kept: int
    rows: int
    axis: int

    def words(self) -> str:
        left = self.rows - self.kept
        return (
            f"compared {self.kept} of the reference's {self.rows} rows along dim {self.axis}: the candidate has "
            f"{self.kept}, so {left} reference row{'s were' if left != 1 else ' was'} not compared"
        )


def reference_cut(shapes_a: Sequence[Shape], steps: Sequence[Step]) -> ReferenceCut | None:
    """The reference rows an alignment (`steps`, the reference's shards' shapes `shapes_a`) leaves out, or None
    where every reference element faces a candidate element. A pair with such a cut never passes: rows compared
    with nothing are not compared (`cut_verdict`)."""
    for index, step in enumerate(steps):
        if step.side == "a" and step.kind == "truncate":
            rows = _rows_before(shapes_a, steps[:index], step)
            if rows > step.size:
                return ReferenceCut(step.size, rows, step.axis)
    return None


# The rule a verdict on what was compared of a pair comes from: the tolerances on its element values, the noise rule
# (within the rerun's noise floor times the session's factor), or either on summaries alone (hashes, norms, sampled
# elements: a pass there is nothing found, not every element compared).
PassedBy = Literal["tolerance", "noise", "summaries", "noise on summaries"]
_WITHIN: dict[PassedBy, str] = {
    "tolerance": "the rows compared are within tolerance",
    "noise": "the rows compared are within the noise floor",
    "summaries": "the rows compared, on summaries: nothing found outside tolerance",
    "noise on summaries": "the rows compared, on summaries: nothing found outside the noise floor",
}


def cut_verdict(passed: bool, cut: str | None, by: PassedBy = "tolerance") -> tuple[str, str | None]:
    """A pair's status and error from the verdict on what was compared of it (`passed`, by the rule `by`) and the
    reference rows its alignment cut away (`cut`: `ReferenceCut.words`, None where none): the one rule every verdict
    written or judged again (by a rerun's noise) follows. Rows compared with nothing are not compared: such a pair
    fails where what was compared fails, and is otherwise incomparable as a whole, never a pass; its error says by
    which rule what was compared passed."""
    if not passed:
        return "fail", None
    if cut is None:
        return "pass", None
    return "incomparable", f"not a pass: {cut}; {_WITHIN[by]}"


def _rows_before(shards: Sequence[Shape], earlier: Sequence[Step], cut: Step) -> int:
    """The length along `cut`'s axis of its side's shape before it: after the side's earlier steps, or its one
    shard's own shape where there are none (a side of several shards has a concat step first)."""
    mine = [s for s in earlier if s.side == cut.side]
    shape = mine[-1].shape if mine else shards[0]
    return shape[cut.axis] if 0 <= cut.axis < len(shape) else cut.size


def replicas_of(steps: Sequence[Step]) -> tuple[str, int] | None:
    """(side, ranks) of an alignment's steps that stack one side's replicas; None otherwise."""
    stack = next((s for s in steps if s.kind == "stack"), None)
    return None if stack is None else (stack.side, stack.size)


def stored_steps(alignment_json: dict[str, Any] | None) -> list[Step]:
    """The steps of an alignment stored as JSON (`Alignment.to_json`: a pair's alignment column); [] for none."""
    return [Step.from_json(s) for s in (alignment_json or {}).get("steps", [])]


def _merged_without_steps(shards: list[Shape], steps: list[Step]) -> Shape:
    kinds = [s.kind for s in steps]
    if kinds.count("stack") + kinds.count("repeat") > 1 or any(k in REPLICA_KINDS for k in kinds[:-1]):
        raise ValueError("a stack or repeat step comes once, last on its side")
    if "stack" in kinds:
        if "concat" in kinds:
            raise ValueError("replicas are stacked, not concatenated")
        if len(shards) < 2 or len(set(shards)) != 1:
            raise ValueError(f"replicas to stack are two or more shards of one shape, not {[list(s) for s in shards]}")
        return shards[0]
    if len(shards) > 1 and "concat" not in kinds:
        raise ValueError("several shards need a concat step")
    return shards[0]


def _apply(shape: Shape, step: Step, shards: list[Shape]) -> Shape:
    if step.kind == "stack":
        if step.size != len(shards):
            _fail(f"{len(shards)} replicas cannot stack as {step.size}")
        return (step.size, *shape)
    if step.kind == "repeat":
        if step.size < 2:
            _fail(f"repeating {step.size} times compares no replicas")
        return (step.size, *shape)
    if step.kind == "concat":
        return _concat_shape(shards, step.axis) or _fail(f"shards {shards} cannot join along dim {step.axis}")
    if step.kind == "squeeze":
        return tuple(d for d in shape if d != 1)
    if step.kind == "permute":
        if sorted(step.perm) != list(range(len(shape))):
            _fail(f"{list(step.perm)} is not a permutation of {len(shape)} dims")
        return tuple(shape[p] for p in step.perm)
    if step.kind == "truncate":
        if not 0 <= step.axis < len(shape) or step.size > shape[step.axis]:
            _fail(f"cannot keep {step.size} rows of dim {step.axis} of {list(shape)}")
        return shape[: step.axis] + (step.size,) + shape[step.axis + 1 :]
    if step.kind == "flatten":
        return (math.prod(shape),)
    return _fail(f"unknown step {step.kind!r}")


def _fail(message: str) -> Shape:
    raise ValueError(message)


def _concat_shape(shards: list[Shape], axis: int) -> Shape | None:
    first = shards[0]
    if not 0 <= axis < len(first) or any(len(s) != len(first) for s in shards):
        return None
    if any(s[:axis] + s[axis + 1 :] != first[:axis] + first[axis + 1 :] for s in shards):
        return None
    return first[:axis] + (sum(s[axis] for s in shards),) + first[axis + 1 :]


def _merges(side: str, shards: list[Shape]) -> Iterator[tuple[Shape, list[Step]]]:
    if len(shards) == 1:
        yield shards[0], []
        return
    for axis in range(len(shards[0])):
        merged = _concat_shape(shards, axis)
        if merged is not None:
            yield merged, [Step(side, "concat", axis=axis, shape=merged)]


def _squeezed(side: str, shape: Shape) -> tuple[Shape, list[Step]]:
    squeezed = tuple(d for d in shape if d != 1)
    return (squeezed, [Step(side, "squeeze", shape=squeezed)]) if squeezed != shape else (shape, [])


def _permutations(shape_b: Shape, target: Shape) -> Iterator[tuple[int, ...]]:
    """Permutations of b's dims, last kept last, that give `target` (identity first)."""
    n = len(shape_b)
    if n != len(target) or n < 2 or shape_b[-1] != target[-1]:
        return
    for head in itertools.permutations(range(n - 1)):
        perm = (*head, n - 1)
        if tuple(shape_b[p] for p in perm) == target:
            yield perm


def _pair_single(a: Shape, b: Shape) -> list[tuple[list[Step], Shape]]:
    """Every chain aligning one shape with another, cheapest later picked by the caller. Where either side holds
    no element, only dropping size-1 dimensions: no value could tell a permutation or a flattening right from
    wrong (0 elements against 0 is no evidence that `[0, 8]` is `[0, 4]` or `[8, 0]`), so such shapes are
    incomparable."""
    if a == b:
        return [([], a)]
    found: list[tuple[list[Step], Shape]] = []
    qa, steps_a = _squeezed("a", a)
    qb, steps_b = _squeezed("b", b)
    if qa == qb:
        found.append((steps_a + steps_b, qa))
    if math.prod(a) == 0 or math.prod(b) == 0:
        return found
    for perm in _permutations(qb, qa):
        if perm != tuple(range(len(qb))):
            found.append((steps_a + steps_b + [Step("b", "permute", perm=perm, shape=qa)], qa))
            break
    found.extend(_truncations(qa, qb, steps_a, steps_b))
    if not found:  # the last dimension moves too: a transpose (a Conv1D's weight against a Linear's), before flattening
        for perm in _any_permutations(qb, qa):
            found.append((steps_a + steps_b + [Step("b", "permute", perm=perm, shape=qa)], qa))
            break
    if not found and math.prod(a) == math.prod(b):
        n = math.prod(a)
        found.append(([Step("a", "flatten", shape=(n,)), Step("b", "flatten", shape=(n,))], (n,)))
    return found


def _truncations(qa: Shape, qb: Shape, steps_a: list[Step], steps_b: list[Step]) -> list[tuple[list[Step], Shape]]:
    """One side has extra leading rows (dim 0), possibly after permuting the candidate's other dims. None where
    one side has no rows at all: 0 elements against a tensor that has some are incomparable, not compared."""
    if len(qa) != len(qb) or not qa or qa[0] == qb[0] or min(qa[0], qb[0]) == 0:
        return []
    rows = min(qa[0], qb[0])
    long_side = "a" if qa[0] > qb[0] else "b"
    target = (rows,) + qa[1:]
    candidates: list[tuple[list[Step], Shape]] = []
    if qa[1:] == qb[1:]:
        cut = Step(long_side, "truncate", axis=0, size=rows, shape=target)
        candidates.append((steps_a + steps_b + [cut], target))
    elif len(qb) > 2:
        for perm in _permutations(qb[1:], qa[1:]):
            full = (0, *(p + 1 for p in perm))
            permuted = (qb[0],) + qa[1:]
            cut = Step(long_side, "truncate", axis=0, size=rows, shape=target)
            candidates.append((steps_a + steps_b + [Step("b", "permute", perm=full, shape=permuted), cut], target))
            break
    return candidates


def _replica_chains(shapes_a: list[Shape], shapes_b: list[Shape]) -> list[Alignment]:
    """Chains comparing one side's replicas, each with the other side: where every shard of that side has one shape
    holding as many elements as the other side (concatenated if it is sharded), and that shape aligns with it by
    dropping size-1 dims and permuting alone (never cutting rows or flattening: a real tensor-parallel split's
    shards each hold a part of the elements). Cheapest first."""
    found: list[Alignment] = []
    for side, mine, other in (("b", shapes_b, shapes_a), ("a", shapes_a, shapes_b)):
        if len(mine) < 2 or len(set(mine)) != 1 or math.prod(mine[0]) == 0:
            continue
        ranks, copy = len(mine), mine[0]
        other_side = "a" if side == "b" else "b"
        for merged, concat in _merges(other_side, other):
            if math.prod(merged) != math.prod(copy):
                continue
            pairs = _pair_single(merged, copy) if side == "b" else _pair_single(copy, merged)
            for steps, shape in pairs:
                if any(s.kind in ("truncate", "flatten") for s in steps):
                    continue
                stacked = (ranks, *shape)
                chain = [
                    *concat,
                    *(s for s in steps if s.side == other_side),
                    *(s for s in steps if s.side == side),
                    Step(side, "stack", size=ranks, shape=stacked),
                    Step(other_side, "repeat", size=ranks, shape=stacked),
                ]
                found.append(Alignment(tuple(shapes_a), tuple(shapes_b), tuple(chain), stacked))
    return sorted(found, key=lambda c: c.cost)


def align(shapes_a: list[Shape], shapes_b: list[Shape]) -> Alignment | None:
    """The cheapest chain of views making both sides the same shape, or None: incomparable. One side's replicas
    (`_replica_chains`) come before any chain of shards."""
    replicas = _replica_chains(shapes_a, shapes_b)
    if replicas:
        return replicas[0]
    best: Alignment | None = None
    for merged_a, concat_a in _merges("a", shapes_a):
        for merged_b, concat_b in _merges("b", shapes_b):
            for steps, shape in _pair_single(merged_a, merged_b):
                candidate = Alignment(tuple(shapes_a), tuple(shapes_b), tuple(concat_a + concat_b + steps), shape)
                if best is None or candidate.cost < best.cost:
                    best = candidate
    return best


def _any_permutations(shape_b: Shape, target: Shape, limit: int = 6) -> Iterator[tuple[int, ...]]:
    """Every permutation of b's dims (the last one moving too: a transpose) that gives `target`, not the
    identity; none past `limit` dims (too many to list)."""
    n = len(shape_b)
    if n != len(target) or n < 2 or n > limit or sorted(shape_b) != sorted(target):
        return
    for perm in itertools.permutations(range(n)):
        if perm != tuple(range(n)) and tuple(shape_b[p] for p in perm) == target:
            yield perm


def alignment_choices(shapes_a: list[Shape], shapes_b: list[Shape]) -> list[Alignment]:
    """Every alignment that fits, cheapest first, for a user to choose from (pairing two tensors by hand):
    each concat axis of the shards, size-1 dims dropped, any permutation of the candidate's dims (every transpose,
    where `align` takes the first only when nothing cheaper fits), extra leading rows cut off. Flattening both is
    offered only when nothing else fits. The same final steps are listed once."""
    found: dict[str, Alignment] = {c.key(): c for c in _replica_chains(shapes_a, shapes_b)}
    flat: list[Alignment] = []
    for merged_a, concat_a in _merges("a", shapes_a):
        for merged_b, concat_b in _merges("b", shapes_b):
            chains = _pair_single(merged_a, merged_b)
            qa, steps_a = _squeezed("a", merged_a)
            qb, steps_b = _squeezed("b", merged_b)
            chains += [
                (steps_a + steps_b + [Step("b", "permute", perm=perm, shape=qa)], qa)
                for perm in _any_permutations(qb, qa)
            ]
            for steps, shape in chains:
                candidate = Alignment(tuple(shapes_a), tuple(shapes_b), tuple(concat_a + concat_b + steps), shape)
                if candidate.last_resort:
                    flat.append(candidate)
                else:
                    found.setdefault(candidate.key(), candidate)
    choices = sorted(found.values(), key=lambda c: (c.replicas is None, c.cost))
    return choices or sorted({c.key(): c for c in flat}.values(), key=lambda c: c.cost)
