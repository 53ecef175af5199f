"""Replicas against shards (engine.alignment, engine.views): a rank holding a whole copy of the tensor is stacked
with the other ranks' copies along a new leading dimension (the rank), the other side repeated once per rank; real
tensor-parallel splits keep concatenating."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from tensor_debugger.engine.alignment import Alignment, Step, align, alignment_choices
from tensor_debugger.engine.streaming import compare_views
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.engine.views import SourceView, View, build_view

Shapes = list[tuple[int, ...]]


def views(alignment: Alignment, a: list[NDArray[Any]], b: list[NDArray[Any]]) -> tuple[View, View]:
    def sources(side: list[NDArray[Any]]) -> list[View]:
        return [SourceView(x, lambda v: v.astype(np.float64), k) for k, x in enumerate(side)]

    return build_view(sources(a), alignment.side_steps("a")), build_view(sources(b), alignment.side_steps("b"))


@pytest.mark.parametrize(
    ("shapes_a", "shapes_b", "side", "shape"),
    [
        ([(64,)], [(64,), (64,)], "b", (2, 64)),  # a norm weight on two ranks
        ([(50, 8)], [(50, 8)] * 4, "b", (4, 50, 8)),  # an embedding on four
        ([(64,)], [(1, 64)] * 2, "b", (2, 64)),  # copies with a size-1 dim
        ([(64,), (64,)], [(64,)], "a", (2, 64)),  # the reference's copies
        ([(8, 4), (8, 4)], [(16, 4), (16, 4)], "b", (2, 16, 4)),  # split in the reference, replicated in the candidate
    ],
)
def test_whole_copies_are_replicas(shapes_a: Shapes, shapes_b: Shapes, side: str, shape: tuple[int, ...]) -> None:
    found = align(shapes_a, shapes_b)
    assert found is not None and found.replicas == (side, shape[0]) and found.shape == shape
    assert f"replicated on {shape[0]} ranks" in found.words()
    again = Alignment.from_steps(shapes_a, shapes_b, [Step.from_json(s.to_json()) for s in found.steps])
    assert again.shape == shape and again.replicas == found.replicas
    assert alignment_choices(shapes_a, shapes_b)[0].key() == found.key()  # offered first when pairing by hand


@pytest.mark.parametrize(
    ("shapes_a", "shapes_b", "words"),
    [
        ([(16, 4)], [(8, 4), (8, 4)], "candidate shards concatenated along dim 0 -> [16, 4]"),  # q/k/v
        ([(4, 16)], [(4, 8), (4, 8)], "candidate shards concatenated along dim 1 -> [4, 16]"),  # o_proj
        # the same split on both sides: rank by rank, as before
        (
            [(8,), (8,)],
            [(8,), (8,)],
            "reference shards concatenated along dim 0 -> [16]; candidate shards concatenated along dim 0 -> [16]",
        ),
        (
            [(20, 4)],
            [(12, 4), (12, 4)],
            "candidate shards concatenated along dim 0 -> [24, 4]; "
            "candidate cut to its first 20 of 24 rows along dim 0 (4 candidate rows not compared)",
        ),  # padded: never a truncated replica
    ],
)
def test_real_splits_still_concatenate(shapes_a: Shapes, shapes_b: Shapes, words: str) -> None:
    found = align(shapes_a, shapes_b)
    assert found is not None and found.replicas is None and found.words() == words


def test_every_copy_is_compared_and_the_rank_located() -> None:
    rng = np.random.default_rng(0)
    reference = rng.standard_normal((5, 3))
    copies = [reference.copy() for _ in range(3)]
    copies[2][4, 1] += 0.5
    alignment = align([(5, 3)], [(5, 3)] * 3)
    assert alignment is not None
    a, b = views(alignment, [reference], copies)
    assert a.shape == b.shape == (3, 5, 3)
    np.testing.assert_array_equal(a.read((slice(1, 3), slice(0, 5), slice(0, 3))), np.stack([reference] * 2))
    np.testing.assert_array_equal(b.read((slice(0, 3), slice(2, 5), slice(1, 2))), np.stack(copies)[:, 2:5, 1:2])
    assert b.read((slice(1, 1), slice(0, 5), slice(0, 3))).shape == (0, 5, 3)
    with ThreadPoolExecutor(2) as pool:
        stats = compare_views(a, b, Tolerance(1e-6, 1e-6), False, pool)
    assert stats.numel == 45 and stats.mismatched == 1 and stats.argmax == (2, 4, 1)
    assert b.locate((2, 4, 1)) == (2, (4, 1)) and a.locate((2, 4, 1)) == (0, (4, 1))


def test_steps_that_do_not_fit_are_refused() -> None:
    stack = Step("b", "stack", size=2, shape=(2, 4))
    repeat = Step("a", "repeat", size=2, shape=(2, 4))
    assert Alignment.from_steps([(4,)], [(4,), (4,)], [stack, repeat]).shape == (2, 4)
    with pytest.raises(ValueError, match="one shape"):
        Alignment.from_steps([(4,)], [(4,), (3,)], [stack, repeat])
    with pytest.raises(ValueError, match="cannot stack"):
        Alignment.from_steps([(4,)], [(4,), (4,), (4,)], [stack, repeat])
    with pytest.raises(ValueError, match="last on its side"):
        Alignment.from_steps([(4,)], [(4,), (4,)], [stack, Step("b", "squeeze", shape=(2, 4)), repeat])
