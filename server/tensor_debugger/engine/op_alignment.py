"""Align two implementations' lists of ops inside one module: a sequence alignment on each op's key (its name and
its output's shape), so that where one side calls ops the other does not (a fused kernel against the ops it
fuses, an extra cast), the ops both call still face each other and the rest are listed, in place, as one side's
only."""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher

# a captured op's output: "Net.attn/reshape#3_outputs" (module call "attn" without the model's class name "Net",
# op "reshape", call index 3); "Net/mul#1_outputs" (the model's own call: module call ""); a tuple's output
# "…/split#1_outputs_0", a dict's "…/max#1_outputs_values" (its place: "0", "values"); the model's own ops of its
# second call "Net#2/mul#1_outputs" (the model's call "#2": a module's calls are numbered in its path, "Net.attn#2")
_OP_CALL = re.compile(r"^[^./#]+(#\d+)?\.?(.*)/([^/#]+)#(\d+)_outputs(?:_(.+))?$")


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
    return (found[2], found[3], int(found[4])) if found else None


@dataclass(frozen=True)
class OpTensor:
    """What aligns of one captured tensor: its full name, its shape and its dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Likeness:
    """What two ops' contents (a reference op's and a candidate op's, of one shape) tell of each other: `same`, True
    where what was compared of them agrees within the tolerance (their summaries: equal hashes, or nothing outside
    it), False where it proves them different, None where nothing is known; `distance`, how far apart they are,
    relative (their sampled values' ‖b − a‖ / ‖a‖), None where not known."""

    same: bool | None
    distance: float | None = None


# how a pair of ops of one name and shape, which the alignment paired by position, was settled by content instead
BY_CONTENT = "by content"  # their contents match under another one-to-one pairing of those ops: this one
LEFT_OVER = "left over"  # the one pair left once the others matched by content (or each the nearest of the rest)
AMBIGUOUS = "ambiguous"  # by position, which their contents neither confirm nor replace: which faces which is unknown


def crossed(settled: Mapping[tuple[str, str], str], before: Sequence[str], module_call: str) -> list[tuple[str, str]]:
    """The op pairs (reference name, candidate name) of `settled` that their contents paired (`BY_CONTENT`, or the
    one `LEFT_OVER` once others did) across call indices (`getitem#1` with `getitem#2`), whose reference op is one of
    `before` (the reference's tensors before a first divergence, in its order) and was called in `module_call` (the
    first divergence's module call, the model's class name included: `Net.layers.0.attn`), in `before`'s order. Two
    slices swapped in use (a rotary turning the half it should pass) hold the same values on both sides, so no pair
    of theirs differs: they are named only here."""
    at = {name: k for k, name in enumerate(before)}
    found = [
        (at[a], a, b)
        for (a, b), how in settled.items()
        if how in (BY_CONTENT, LEFT_OVER)
        and a in at
        and "/" in a
        and a.partition("/")[0] == module_call
        and a.rpartition("/")[2] != b.rpartition("/")[2]
    ]
    return [(a, b) for _, a, b in sorted(found)]


Content = Callable[[str, str], Likeness]  # a reference op's and a candidate op's names: what their contents tell


@dataclass(frozen=True)
class OpPairing:
    """Two runs' captured ops, paired by module call and sequence alignment (`pair_ops`): `pairs` (reference name,
    candidate name); `alone_a`, `alone_b`: the ops of a module call both runs made that the alignment left on one
    side only (an extra cast, a fused kernel's ops), which no other rule may pair; `settled`: the pairs not paired
    by position alone, each with how (`BY_CONTENT`, `LEFT_OVER`, `AMBIGUOUS`)."""

    pairs: list[tuple[str, str]] = field(default_factory=list)
    alone_a: list[str] = field(default_factory=list)
    alone_b: list[str] = field(default_factory=list)
    settled: dict[tuple[str, str], str] = field(default_factory=dict)


def pair_ops(a: Sequence[OpTensor], b: Sequence[OpTensor], content: Content | None = None) -> OpPairing:
    """Pair the captured ops' outputs of two runs (`a` the reference's, `b` the candidate's, each in execution
    order): within each module call both runs made (its path less the model's class name; the model's own ops
    within one call of the model, `Net#2/mul#1_outputs` the second's), the two lists of ops aligned (`align_ops`)
    on each output's op, place, shape and dtype's kind, so that an op one side calls more
    often (a `reshape` in one `repeat_kv`, an extra `.float()`, matmul and softmax against a fused
    scaled_dot_product_attention) is that side's alone, in place, and the calls after it face their true
    counterparts, not those of the same call index. Where which call faces which is not certain (`certain_matches`)
    both are left alone: not compared, never a guess. The ops of a module call one run alone made are left out (no
    decision here). Where `content` tells what the ops' contents are (their summaries), ops of one key (name,
    place, shape, dtype's kind) that the alignment paired by position within a module call are checked by it
    (`settle_by_content`): two sides that compute them in another order (k before q) pair by content, and where
    content decides nothing the pairs are marked ambiguous. The one pairing of ops that planning, the reports and
    find_divergence share."""
    calls_a, calls_b = _by_call(a), _by_call(b)
    found = OpPairing()
    for call, mine in calls_a.items():
        theirs = calls_b.get(call)
        if theirs is None:
            continue
        facing = dict(certain_matches([k for k, _ in mine], [k for k, _ in theirs]))
        if content is not None:
            facing, how = settle_by_content(mine, theirs, facing, content)
            found.settled.update({(mine[i][1], theirs[j][1]): words for (i, j), words in how.items()})
        paired_b = set(facing.values())
        found.pairs.extend((mine[i][1], theirs[j][1]) for i, j in facing.items())
        found.alone_a.extend(name for i, (_, name) in enumerate(mine) if i not in facing)
        found.alone_b.extend(name for j, (_, name) in enumerate(theirs) if j not in paired_b)
    return found


def settle_by_content(
    mine: Sequence[tuple[Hashable, str]],
    theirs: Sequence[tuple[Hashable, str]],
    facing: dict[int, int],
    content: Content,
) -> tuple[dict[int, int], dict[tuple[int, int], str]]:
    """`facing` (index in `mine` -> index in `theirs`: one module call's ops, each (key, name), as the alignment
    paired them by position) checked by content, key by key where several pairs share a key (two `linear`s of one
    shape: q and k). Where every such pair's contents match, or none is proved to differ, position stands. Else:

    - the pairs whose contents match one, and only one, op of the other side's, and that op only them, pair by
      content where one of them is not the positional pair (the two sides compute these in another order):
      `BY_CONTENT` those not in place; the ops left pair in order, `LEFT_OVER` (those not in place) where that is
      one pair, or where its two ops are each other's strictly nearest by content, else `AMBIGUOUS`; but where a
      pair so left, not in place, is farther apart than either of its ops is from its positional partner (a one-way
      match: the candidate's first op holds what the reference's second does, as a loop counter off by one makes),
      no other order is proved: position stands, the pairs that do not match `AMBIGUOUS`;
    - where content agrees with position (its matches are the positional pairs), the other pairs keep position,
      silently where they are one pair (a bug in one of them stays a bug) or where its two ops are each other's
      strictly nearest, else `AMBIGUOUS`;
    - an op whose content matches several of the other side's: position stands, the pairs that do not match are
      `AMBIGUOUS`.

    Returns the new `facing` and how each pair not settled by position alone was."""
    groups: dict[Hashable, list[tuple[int, int]]] = {}
    for i, j in sorted(facing.items()):
        groups.setdefault(mine[i][0], []).append((i, j))
    facing = dict(facing)
    how: dict[tuple[int, int], str] = {}
    for group in groups.values():
        if len(group) < 2:
            continue
        diagonal = [content(mine[i][1], theirs[j][1]) for i, j in group]
        if not any(d.same is False for d in diagonal):
            continue  # nothing proves position wrong
        refs, cands = [i for i, _ in group], [j for _, j in group]
        table = {
            (k, m): diagonal[k] if k == m else content(mine[refs[k]][1], theirs[cands[m]][1])
            for k in range(len(group))
            for m in range(len(group))
        }
        matches = {k: {m for m in range(len(group)) if table[k, m].same} for k in range(len(group))}
        matched_by = {m: {k for k in range(len(group)) if table[k, m].same} for m in range(len(group))}
        one_to_one = {k: next(iter(ms)) for k, ms in matches.items() if len(ms) == 1}
        one_to_one = {k: m for k, m in one_to_one.items() if matched_by[m] == {k}}
        if any(matches[k] and k not in one_to_one for k in matches):  # content matching several: decides nothing
            how.update({group[k]: AMBIGUOUS for k in range(len(group)) if not table[k, k].same})
            continue
        rest_a = [k for k in range(len(group)) if k not in one_to_one]
        rest_b = [m for m in range(len(group)) if m not in one_to_one.values()]
        left = list(zip(rest_a, rest_b, strict=True))
        if any(k != m and _farther_than_position(k, m, table) for k, m in left):
            # a one-way match (the candidate's first op holds what the reference's second does: a loop counter off
            # by one) leaves a pair farther apart than position put them: no other order is proved
            how.update({group[k]: AMBIGUOUS for k in range(len(group)) if not table[k, k].same})
            continue
        nearest = {(k, m) for k, m in left if len(left) == 1 or _nearest(k, m, left, table)}
        if all(k == m for k, m in one_to_one.items()):  # content agrees with position
            how.update({group[k]: AMBIGUOUS for k, m in left if (k, m) not in nearest})
            continue
        for k in [*one_to_one, *rest_a]:
            del facing[refs[k]]
        for k, m in one_to_one.items():
            facing[refs[k]] = cands[m]
            if k != m:  # a match in place is position confirmed
                how[refs[k], cands[m]] = BY_CONTENT
        for k, m in left:
            facing[refs[k]] = cands[m]
            if (k, m) not in nearest or k != m:
                how[refs[k], cands[m]] = LEFT_OVER if (k, m) in nearest else AMBIGUOUS
    return dict(sorted(facing.items())), how


def _farther_than_position(k: int, m: int, table: dict[tuple[int, int], Likeness]) -> bool:
    """Whether the pair (`k`, `m`) left once the others matched by content, not in place, is farther apart by
    content than either of its ops is from the op position paired it with (all distances known)."""
    here = table[k, m].distance
    return here is not None and any(d is not None and d < here for d in (table[k, k].distance, table[m, m].distance))


def _nearest(k: int, m: int, left: Sequence[tuple[int, int]], table: dict[tuple[int, int], Likeness]) -> bool:
    """Whether the pair (`k`, `m`) of `left` (pairs of indices into a group) is each side's strictly nearest by
    content among the ops of `left` (their distances known)."""
    here = table[k, m].distance
    if here is None:
        return False
    for k2, m2 in left:
        if (k2, m2) == (k, m):
            continue
        across = (table[k, m2].distance, table[k2, m].distance)
        if any(d is None or d <= here for d in across):
            return False
    return True


def certain_matches(a: Sequence[Hashable], b: Sequence[Hashable]) -> list[tuple[int, int]]:
    """(index in `a`, index in `b`) of the keys the alignment (`align_ops`'s) pairs where which faces which is
    certain, in order. Each run of keys it matches (a block) stands only where that run occurs once on each side
    between the blocks before and after it: two `reshape`s of one shape in the reference's repeat_kv against one
    in SDPA's output, with nothing around them that also matches, could face either, so neither does. And a block's
    end key that the unmatched ops just after it (or just before it) also begin with (end with), on either side,
    could face that one as well: it is not paired either (`x * 1.0` right before the `* scale` both run)."""
    matcher = SequenceMatcher(None, list(a), list(b), autojunk=False)
    blocks = [m for m in matcher.get_matching_blocks() if m.size]
    found: list[tuple[int, int]] = []
    for n, block in enumerate(blocks):
        before = blocks[n - 1] if n else None
        after = blocks[n + 1] if n + 1 < len(blocks) else None
        start_a, start_b = (before.a + before.size, before.b + before.size) if before else (0, 0)
        end_a, end_b = (after.a, after.b) if after else (len(a), len(b))
        run = list(a[block.a : block.a + block.size])
        if _occurrences(a[start_a:end_a], run) != 1 or _occurrences(b[start_b:end_b], run) != 1:
            continue
        # its ends could slide: a key that also begins the unmatched ops after it (or ends those before it), on
        # either side, could face that one as well (an extra `mul` right after the `mul` both call)
        after_keys = {
            keys[i] for keys, i, end in ((a, block.a + block.size, end_a), (b, block.b + block.size, end_b)) if i < end
        }
        before_keys = {
            keys[i] for keys, i, start in ((a, block.a - 1, start_a), (b, block.b - 1, start_b)) if i >= start
        }
        low, high = 0, block.size
        while high > low and run[high - 1] in after_keys:
            high -= 1
        while low < high and run[low] in before_keys:
            low += 1
        found.extend((block.a + k, block.b + k) for k in range(low, high))
    return found


def _occurrences(keys: Sequence[Hashable], run: list[Hashable]) -> int:
    """How many times `run` occurs in `keys`, contiguous (at most 2: only whether it is once matters)."""
    size, count = len(run), 0
    if len(keys) < 2 * size:
        return 1 if len(keys) >= size else 0  # it occurs there (a block is in its own span) and has no room twice
    for start in range(len(keys) - size + 1):
        if keys[start] == run[0] and list(keys[start : start + size]) == run:
            count += 1
            if count == 2:
                break
    return count


def _by_call(tensors: Sequence[OpTensor]) -> dict[tuple[str, str], list[tuple[Hashable, str]]]:
    """The captured ops' outputs among `tensors`, by module call (without the model's class name; the model's own
    ops by its call, "" or "#2": each call of the model has other inputs), each with what aligns (op, place, shape,
    dtype's kind) and its name, in order."""
    calls: dict[tuple[str, str], list[tuple[Hashable, str]]] = {}
    for tensor in tensors:
        found = _OP_CALL.match(tensor.name)
        if found is not None:
            key = (found[3], found[5] or "", tuple(tensor.shape), _kind(tensor.dtype))
            calls.setdefault((found[1] or "", found[2]), []).append((key, tensor.name))
    return calls


def _kind(dtype: str) -> str:
    """A dtype's kind: "bool", "int" (uint8, int64, ...), "complex", else "float" (float32, bfloat16, float8...)."""
    if dtype == "bool":
        return "bool"
    if dtype.startswith(("int", "uint")):
        return "int"
    return "complex" if dtype.startswith("complex") else "float"
