"""The alignments offered for pairing two tensors by hand (engine.alignment.alignment_choices), and the page form's
reading of the pairing rules."""

from __future__ import annotations

import pytest
from tensor_debugger.engine.alignment import Alignment, Step, align, alignment_choices
from tensor_debugger.errors import InvalidInputError
from tensor_debugger.web.views.pairing_form import PairingForm, rules_from_form


def words(shapes_a: list[tuple[int, ...]], shapes_b: list[tuple[int, ...]]) -> list[str]:
    return [c.words() for c in alignment_choices(shapes_a, shapes_b)]


def test_a_transpose_is_offered_instead_of_flattening() -> None:
    assert words([(32, 64)], [(64, 32)]) == ["candidate dims permuted [1, 0] -> [32, 64]"]
    assert words([(2, 3, 4)], [(4, 3, 2)]) == ["candidate dims permuted [2, 1, 0] -> [2, 3, 4]"]
    assert words([(1, 8, 4)], [(4, 8)]) == [
        "reference size-1 dims dropped -> [8, 4]; candidate dims permuted [1, 0] -> [8, 4]"
    ]


def test_every_fitting_alignment_cheapest_first_and_each_one_valid() -> None:
    assert words([(8, 4)], [(4, 4), (4, 4)]) == [
        "candidate shards concatenated along dim 0 -> [8, 4]",
        "candidate shards concatenated along dim 1 -> [4, 8]; candidate dims permuted [1, 0] -> [8, 4]",
    ]
    assert words([(4, 4)], [(4, 4)]) == ["same shape", "candidate dims permuted [1, 0] -> [4, 4]"]
    cases: list[tuple[list[tuple[int, ...]], list[tuple[int, ...]]]] = [
        ([(8, 4)], [(4, 4), (4, 4)]),
        ([(6, 5, 4)], [(4, 6, 5)]),
        ([(10, 3)], [(12, 3)]),
    ]
    for shapes_a, shapes_b in cases:
        for choice in alignment_choices(shapes_a, shapes_b):
            again = Alignment.from_steps(shapes_a, shapes_b, [Step.from_json(s.to_json()) for s in choice.steps])
            assert again.shape == choice.shape


def test_flattening_only_when_nothing_else_fits() -> None:
    choices = alignment_choices([(6,)], [(2, 3)])
    assert len(choices) == 1 and choices[0].last_resort
    assert alignment_choices([(5,)], [(2, 3)]) == []


def test_the_rules_form() -> None:
    assert rules_from_form({"strategies": " name , fuzzy", "threshold": "0.8", "name_pattern": " x "}) == (
        "name,fuzzy:0.8",
        "x",
    )
    assert rules_from_form({"threshold": "0.9"})[0].split(",")[-2] == "fuzzy:0.9"  # the default chain's fuzzy
    assert rules_from_form({}) == ("", "")
    with pytest.raises(InvalidInputError, match="needs fuzzy in the chain"):
        rules_from_form({"strategies": "name", "threshold": "0.9"})
    shown = PairingForm.of(["layer_stage", "fuzzy:0.7"], None)
    assert (shown.strategies, shown.threshold, shown.name_pattern) == ("layer_stage, fuzzy", "0.7", "")


def test_empty_tensors_of_different_shapes_are_never_flattened_or_permuted() -> None:
    """0 elements against 0 is no evidence that `[0, 8]` is `[0, 4]` or `[8, 0]` (a wrong hidden size of an MoE
    expert given no token): incomparable; dropping size-1 dimensions still aligns them."""
    assert align([(0, 8)], [(0, 4)]) is None
    assert align([(0, 8)], [(8, 0)]) is None
    assert align([(3,)], [(0,)]) is None
    assert words([(0, 8)], [(0, 4)]) == []
    assert align([(0, 8)], [(0, 8)]) is not None
    assert words([(1, 0, 8)], [(0, 8)]) == ["reference size-1 dims dropped -> [0, 8]"]
