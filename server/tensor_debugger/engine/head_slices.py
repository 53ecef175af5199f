"""Relate one implementation's per-part ops to slices of the other's whole ops, by values: attention computed by a
Python loop over heads (`q[..., h*d:(h+1)*d]`, `v[..., h::H]`, one softmax per head) against one batched matmul and
softmax. The sequence alignment (engine/op_alignment.py) pairs none of these ops (other names, other shapes), so
inside the module call that holds a first divergence the one side's ops without partner are checked, in order,
against the slices of the other's tensors whose shapes relate to theirs:

- one dimension more: each index of that dimension (`[:, 2]`: a head of a `[b, H, t, t]` softmax against a
  `[b, t, t]` one);
- one dimension `parts` times larger: each contiguous block (`[..., 8:12]`) and each strided part (`[..., 2::4]`);
- the same shape: the whole tensor (`cat` of the heads against the batched `reshape`).

A relation is found by values only (equal within a tolerance), never by name or order, and the words say so. The
first op whose shape relates to some slice but whose values equal none, or which equals a part out of turn (part 1
again where part 2 was due, among the ops of its kind matching one tensor's parts), is where the two may begin to
differ. The cost is bounded: only ops before the first divergence in its own module call, only slices of related
shapes, at most `MAX_PARTS` parts per dimension, and at most `budget` elements compared in all."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.generic]
Close = Callable[[Array, Array], bool]  # the reference's values, the candidate's (one shape): equal within tolerance
MAX_PARTS = 256  # parts of one dimension tried (a head count, or elements for one-wide slices)
BUDGET = 50_000_000  # elements compared in all, over every slice tried (about 1 s of CPU here: bench/head_slices.py)


@dataclass(frozen=True)
class Slice:
    """A slice of the reference's tensor `reference` (of rank `rank`) along dimension `dim`: part `part` of `parts`,
    one index of it (`indexed`, the dimension dropped), every `parts`-th element from `part` (`strided`), else a
    contiguous block of `size`; `parts` 1 (not indexed) is the whole tensor."""

    reference: str
    rank: int
    dim: int
    part: int
    parts: int
    size: int = 1
    indexed: bool = False
    strided: bool = False

    def index(self) -> str:
        """As Python indexes it: `[:, 2]`, `[:, :, 8:12]`, `[..., 2::4]`; "" for the whole tensor."""
        if self.parts == 1 and not self.indexed:
            return ""
        if self.indexed:
            at = str(self.part)
        elif self.strided:
            at = f"{self.part}::{self.parts}"
        else:
            at = f"{self.part * self.size}:{(self.part + 1) * self.size}"
        if self.dim == self.rank - 1 and self.dim > 1:
            return f"[..., {at}]"
        return "[" + ", ".join([":"] * self.dim + [at]) + "]"

    def words(self) -> str:
        """`R[:, 2]` (part 2 of 4 along dim 1), or `R` (the whole tensor)."""
        if self.parts == 1 and not self.indexed:
            return f"{self.reference} (the whole tensor)"
        how = "strided, " if self.strided else ""
        return f"{self.reference}{self.index()} ({how}part {self.part} of {self.parts} along dim {self.dim})"

    def take(self, value: Array) -> Array:
        """This slice of `value` (the reference's tensor)."""
        if self.indexed:
            taken: Array = np.take(value, self.part, axis=self.dim)
            return taken
        if self.parts == 1:
            return value
        where: list[slice] = [slice(None)] * value.ndim
        if self.strided:
            where[self.dim] = slice(self.part, None, self.parts)
        else:
            where[self.dim] = slice(self.part * self.size, (self.part + 1) * self.size)
        return value[tuple(where)]

    def kind(self) -> tuple[str, int, bool, bool]:
        """What every part of one slicing shares: the tensor, the dimension, indexed, strided."""
        return (self.reference, self.dim, self.indexed, self.strided)


def slices_between(reference: str, shape: Sequence[int], of: Sequence[int]) -> list[Slice]:
    """The slices of the reference's tensor `reference` (shape `shape`) of the shape `of` (a candidate's op's), in
    order: the whole tensor, each index of a dimension it has more, each contiguous then strided part of a
    dimension `parts` times larger (at most MAX_PARTS parts)."""
    shape, of = tuple(shape), tuple(of)
    rank = len(shape)
    if shape == of:
        return [Slice(reference, rank, 0, 0, 1)]
    found: list[Slice] = []
    if rank == len(of) + 1:
        for dim in range(rank):
            if shape[:dim] + shape[dim + 1 :] == of and 1 < shape[dim] <= MAX_PARTS:
                found += [Slice(reference, rank, dim, part, shape[dim], indexed=True) for part in range(shape[dim])]
    elif rank == len(of):
        for dim in range(rank):
            size, whole = of[dim], shape[dim]
            if shape[:dim] != of[:dim] or shape[dim + 1 :] != of[dim + 1 :] or size == 0 or whole % size:
                continue
            parts = whole // size
            if not 1 < parts <= MAX_PARTS:
                continue
            found += [Slice(reference, rank, dim, part, parts, size) for part in range(parts)]
            if size > 1:  # one element wide, a strided part is a block
                found += [Slice(reference, rank, dim, part, parts, size, strided=True) for part in range(parts)]
    return found


@dataclass(frozen=True)
class Matched:
    """A candidate's op whose values equal a slice of the reference's tensor (found by values)."""

    candidate: str
    slice: Slice
    others: int = 0  # further slices its values equal as well


@dataclass(frozen=True)
class Unmatched:
    """The first candidate's op whose shape relates to slices of the reference's tensors but whose values equal
    none of them (`due` None), or equal a part out of turn (`due`: the part its kind was due to match next, `slice`
    the part it equals); `slice`, else the nearest slice by max |diff| (`max_abs_diff`), None where none was
    compared."""

    candidate: str
    slice: Slice | None
    max_abs_diff: float | None = None
    due: int | None = None
    # it equals slices, but in none of the layouts (the sliced tensor's shape, dimension, indexed or strided) that
    # the ops of its function and shape before it equal theirs in (`v[..., h::H]` where q and k took blocks)
    layout: bool = False


@dataclass(frozen=True)
class HeadSlices:
    """What relating one module call's ops to slices found: `matched`, the candidate's ops before `first` whose
    values equal a slice (in order); `first`, the first that does not (or equals one out of turn), None where every
    op related does; `unrelated`, the candidate's ops before `first` whose shapes relate to no slice (not compared);
    `compared`, the slices compared; `cut`, whether the element budget ended it before every op was checked."""

    matched: tuple[Matched, ...]
    first: Unmatched | None
    unrelated: tuple[str, ...]
    compared: int
    cut: bool = False


def relate(
    reference: Sequence[tuple[str, Array]],
    candidate: Sequence[tuple[str, Array]],
    close: Close,
    budget: int = BUDGET,
) -> HeadSlices:
    """Check the candidate's ops (`candidate`, in order, each name and values) against the slices of the
    reference's tensors (`reference`, in its order) their shapes relate to (`slices_between`), until the first that
    equals none, or equals one out of turn: among the candidate's ops of one function and shape matching one
    slicing of one tensor (its dimension, indexed or strided), the parts are due in order (0, 1, 2, ...; 0 may start
    again), and an op that matches only other parts is out of turn (a head's slice taken for the next head's); and
    an op whose equal slices are all in layouts (`_layout`) none of the earlier ops of its function and shape
    matched is out of layout (`v[..., h::H]` where the other heads' slices were blocks)."""
    matched: list[Matched] = []
    unrelated: list[str] = []
    turns: dict[tuple[object, ...], int] = {}  # (op function, shape, slicing) -> the last part matched
    layouts: dict[tuple[object, ...], set[tuple[object, ...]]] = {}  # (op function, shape) -> layouts matched
    compared = spent = 0
    reference = _distinct(reference)
    values = dict(reference)
    for name, value in candidate:
        related = [s for ref, held in reference for s in slices_between(ref, held.shape, value.shape)]
        if not related:
            unrelated.append(name)
            continue
        function = _function(name)
        # first the parts due of the slicings its kind matched before: where one of them equals it, it is in turn
        # and the rest are not compared (a loop's later heads cost a compare or two each, not every slice)
        due_now = [s for s in related if turns.get((function, value.shape, s.kind()), -2) + 1 == s.part]
        quick: list[Slice] = []
        for piece in due_now:
            if spent + value.size > budget:
                return HeadSlices(tuple(matched), None, tuple(unrelated), compared, cut=True)
            spent += value.size
            compared += 1
            if close(piece.take(values[piece.reference]), value):
                quick.append(piece)
        if quick:
            for piece in quick:
                turns[function, value.shape, piece.kind()] = piece.part
            matched.append(Matched(name, quick[0], len(quick) - 1))
            continue
        equal: list[Slice] = []
        nearest: tuple[float, Slice] | None = None
        for piece in related:
            if piece in due_now:
                continue  # compared above: not equal
            if spent + value.size > budget:
                return HeadSlices(tuple(matched), None, tuple(unrelated), compared, cut=True)
            taken = piece.take(values[piece.reference])
            spent += value.size
            compared += 1
            if close(taken, value):
                equal.append(piece)
            elif not equal:
                gap = _max_abs_diff(taken, value)
                if nearest is None or gap < nearest[0]:
                    nearest = (gap, piece)
        if not equal:
            for piece in due_now:  # compared above, not equal: the nearest may be among them
                gap = _max_abs_diff(piece.take(values[piece.reference]), value)
                if nearest is None or gap < nearest[0]:
                    nearest = (gap, piece)
            at, piece_near = (nearest[0], nearest[1]) if nearest is not None else (None, None)
            return HeadSlices(tuple(matched), Unmatched(name, piece_near, at), tuple(unrelated), compared)
        seen = layouts.setdefault((function, value.shape), set())
        mine = {_layout(s, values[s.reference].shape) for s in equal}
        if seen and not seen & mine:
            return HeadSlices(tuple(matched), Unmatched(name, equal[0], 0.0, layout=True), tuple(unrelated), compared)
        seen |= mine
        # the parts due of the slicings this op's kind matched before (the whole tensor has no turns)
        due = {
            s: turns[function, value.shape, s.kind()] + 1 for s in equal if (function, value.shape, s.kind()) in turns
        }
        in_turn = [s for s in due if s.part in (0, due[s])]
        if due and not in_turn:
            first = next(iter(due))
            return HeadSlices(tuple(matched), Unmatched(name, first, 0.0, due[first]), tuple(unrelated), compared)
        for piece in equal:  # every slicing it equals takes its turn (one value may be two tensors' slices)
            if piece.parts > 1 or piece.indexed:
                turns[function, value.shape, piece.kind()] = piece.part
        chosen = in_turn[0] if in_turn else equal[0]
        matched.append(Matched(name, chosen, len(equal) - 1))
    return HeadSlices(tuple(matched), None, tuple(unrelated), compared)


def _distinct(tensors: Sequence[tuple[str, Array]]) -> list[tuple[str, Array]]:
    """`tensors` less those holding what an earlier one holds, bit for bit (a module's output and its last op's):
    one value, so one turn of parts."""
    seen: set[tuple[object, ...]] = set()
    kept: list[tuple[str, Array]] = []
    for name, value in tensors:
        key = (value.shape, value.dtype.str, hashlib.blake2b(np.ascontiguousarray(value).tobytes()).digest())
        if key not in seen:
            seen.add(key)
            kept.append((name, value))
    return kept


def _layout(piece: Slice, shape: tuple[int, ...]) -> tuple[object, ...]:
    """How a slice is taken, whatever the tensor: its shape, dimension, indexed, strided (the whole: its shape)."""
    return (shape, piece.dim, piece.indexed, piece.strided, piece.parts == 1)


def _function(name: str) -> str:
    """The op's function of a captured op's output name (`Net.attn/getitem#3_outputs` -> `getitem`)."""
    return name.rpartition("/")[2].partition("#")[0]


def _max_abs_diff(a: Array, b: Array) -> float:
    """max |a - b| over the elements where both are finite; inf where their non-finite elements differ."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    finite = np.isfinite(x) & np.isfinite(y)
    if not np.array_equal(~finite & np.isnan(x), ~finite & np.isnan(y)):
        return float("inf")
    return float(np.max(np.abs(x[finite] - y[finite]), initial=0.0))
