"""Fuzzy pairing: names that differ by an abbreviation, a typo or an extra word (`blocks.3.attention_out` and
`blocks.3.attn_out`).

A name (its identity, normalised) splits into tokens at separators, case changes and digits. Two names are
compared only when their parsed layers and their numbers are the same, so no pair crosses layers or indices.
Tokens pair one to one: equal tokens score 1, an abbreviation (`attn` of `attention`, `out` of `output`) 0.8,
a word of a compound (`norm` of `layernorm`) 0.7, a near spelling up to 0.9 times its similarity; a name's
score is twice the sum over the sum of both token counts (Dice). Two tokens that differ with no likeness at all
(`q` against `k`) rule the pair out, however the rest agrees. Pairs at or above the threshold are made best
first, one to one, and never where a tensor has two candidates equally close.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Hashable, Sequence
from difflib import SequenceMatcher
from functools import lru_cache
from typing import Protocol

from tensor_debugger.engine.names import CLASS_NAME, normalize


class Named(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def identity(self) -> str: ...

    @property
    def layer(self) -> int | None: ...


DEFAULT_THRESHOLD = 0.75
_SPLIT = re.compile(r"[^a-z0-9]+|(?<=[a-z])(?=[0-9])|(?<=[0-9])(?=[a-z])")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def parse_threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise ValueError(f"fuzzy threshold must be a number above 0 and at most 1, got {text!r}")
    return value


def tokens(name: str) -> tuple[str, ...]:
    return tuple(t for t in _SPLIT.split(normalize(_CAMEL.sub(".", CLASS_NAME.sub("", name)))) if t)


def _is_abbreviation(short: str, long: str) -> bool:
    if len(short) < 2 or short[0] != long[0]:
        return False
    rest = iter(long)
    return all(c in rest for c in short)


@lru_cache(maxsize=1 << 16)  # a run's names share few distinct tokens
def token_similarity(x: str, y: str) -> float:
    if x == y:
        return 1.0
    if x.isdigit() or y.isdigit():
        return 0.0
    short, long = sorted((x, y), key=len)
    if _is_abbreviation(short, long):
        return 0.8
    if len(short) >= 3 and short in long:
        return 0.7  # a word of a compound: norm in layernorm
    ratio = SequenceMatcher(None, x, y).ratio()
    return 0.9 * ratio if ratio >= 0.75 else 0.0


def similarity(a: tuple[str, ...], b: tuple[str, ...]) -> float:
    """Dice score over tokens paired one to one, best first; 0 when two tokens differ beyond likeness."""
    if a == b:
        return 1.0 if a else 0.0
    if not a or not b:
        return 0.0
    rest_b = list(b)
    rest_a = []
    for token in a:  # equal tokens first: nothing scores higher
        if token in rest_b:
            rest_b.remove(token)
        else:
            rest_a.append(token)
    matched = _leftovers(tuple(sorted(rest_a)), tuple(sorted(rest_b)))
    if matched < 0:
        return 0.0
    return 2 * (len(a) - len(rest_a) + matched) / (len(a) + len(b))


@lru_cache(maxsize=1 << 16)  # the same renaming recurs in every layer
def _leftovers(a: tuple[str, ...], b: tuple[str, ...]) -> float:
    """The summed similarity of the tokens that differ, paired best first; -1 when a token of each side is left
    with nothing alike (a substitution: q_proj against k_proj)."""
    scored = sorted(((token_similarity(x, y), i, j) for i, x in enumerate(a) for j, y in enumerate(b)), reverse=True)
    used_a: set[int] = set()
    used_b: set[int] = set()
    total = 0.0
    for score, i, j in scored:
        if score <= 0:
            break
        if i in used_a or j in used_b:
            continue
        used_a.add(i)
        used_b.add(j)
        total += score
    if len(used_a) < len(a) and len(used_b) < len(b):
        return -1.0
    return total


def _bucket(t: Named, words: tuple[str, ...]) -> Hashable:
    return (t.layer, tuple(w for w in words if w.isdigit()))


def fuzzy_matches(
    left: Sequence[Named],
    right: Sequence[Named],
    threshold: float | None = None,
) -> list[tuple[int, int, float]]:
    """(index in left, index in right, score) of each fuzzy pair (see the module)."""
    limit = DEFAULT_THRESHOLD if threshold is None else threshold
    words_a = [tokens(t.identity or t.name) for t in left]
    words_b = [tokens(t.identity or t.name) for t in right]
    buckets_b: dict[Hashable, list[int]] = defaultdict(list)
    for j, t in enumerate(right):
        buckets_b[_bucket(t, words_b[j])].append(j)
    candidates: list[tuple[float, int, int]] = []
    for i, t in enumerate(left):
        for j in buckets_b.get(_bucket(t, words_a[i]), ()):
            score = similarity(words_a[i], words_b[j])
            if score >= limit:
                candidates.append((round(score, 6), i, j))
    of_a: dict[int, list[tuple[float, int]]] = defaultdict(list)
    of_b: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for score, i, j in candidates:
        of_a[i].append((score, j))
        of_b[j].append((score, i))
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
    taken_a: set[int] = set()
    taken_b: set[int] = set()
    made: list[tuple[int, int, float]] = []
    for score, i, j in candidates:
        if i in taken_a or j in taken_b:
            continue
        # never where either side has another candidate, still free, just as close: a guess between equals
        tied_a = any(s == score and k != j and k not in taken_b for s, k in of_a[i])
        tied_b = any(s == score and k != i and k not in taken_a for s, k in of_b[j])
        if tied_a:
            taken_a.add(i)
        if tied_b:
            taken_b.add(j)
        if tied_a or tied_b:
            continue
        taken_a.add(i)
        taken_b.add(j)
        made.append((i, j, score))
    return made
