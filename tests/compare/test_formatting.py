"""Numbers as every page and the CLI show them: one format, 4 significant digits."""

from __future__ import annotations

import math

import pytest
from tensor_debugger.compare.reports.formatting import format_cosine, format_fraction, format_number, format_where


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0"),
        (1.3e-6, "1.3e-6"),  # scientific below 1e-3, without trailing zeros
        (0.001234, "0.001234"),
        (0.0009999, "9.999e-4"),
        (0.0625, "0.0625"),
        (3.14159, "3.142"),
        (100.0, "100"),
        (9999.0, "9999"),
        (12345.6, "1.235e4"),  # scientific from 1e4
        (-2.5e-8, "-2.5e-8"),
        (math.nan, "nan"),
        (None, "—"),
    ],
)
def test_one_number_format(value: float | None, text: str) -> None:
    assert format_number(value) == text


def test_a_cosine_that_would_read_1_shows_how_far_from_1_it_is() -> None:
    assert format_cosine(1.0) == "1"
    assert format_cosine(0.99999997) == "1 − 3e-8"
    assert format_cosine(0.9961) == "0.9961"
    assert format_cosine("nan") == "NaN"
    assert format_cosine(None) == ""


def test_fractions_as_percentages() -> None:
    assert format_fraction(0.001953125) == "0.195%"
    assert format_fraction(0.0) == "0%"
    assert format_fraction(None) == ""


def test_where_in_words() -> None:
    assert format_where(None) == ""
    assert format_where([]) == "everywhere (no dimension confines it)"
    named = [{"dim": 1, "name": "heads", "ranges": [[5, 5]]}, {"dim": 2, "name": "tokens", "ranges": [[10, 12]]}]
    assert format_where(named) == "in heads 5, tokens 10-12"
    unnamed = [
        {"dim": 0, "name": None, "ranges": [[3, 4], [10, 12]]},
        {"dim": 2, "name": "tokens", "ranges": [[1, 1], [7, 7]]},
    ]
    assert format_where(unnamed) == "in dim 0 [3-4, 10-12], tokens [1, 7]"


def test_code_spans_escape_what_a_trace_names_and_mark_its_names() -> None:
    from tensor_debugger.compare.reports.formatting import code_spans

    assert code_spans("`a.<b>` records no output: between `q&k`") == (
        "<code>a.&lt;b&gt;</code> records no output: between <code>q&amp;k</code>"
    )
    assert code_spans("the error grows evenly") == "The error grows evenly"
