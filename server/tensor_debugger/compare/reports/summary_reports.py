"""A pair's verdict on summaries, as its `summary` column stores it and every report (API, CLI, pages) shows it:
a capture's with values="summary" (engine/summary_compare.py's `SketchVerdict.to_json`, "basis": "summary") or a
trace's written with use_repr=True (engine/summaries.py's `SummaryVerdict.to_json`). One structure holds both:
the fields one kind does not have are left unset, and left out of the JSON, so both read as they were stored."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

Number = float | int | str  # engine.metrics's (light here: no numpy): NaN and infinities travel as text


class SummaryCheck(msgspec.Struct, frozen=True):
    """One of a use_repr trace's four statistics on both sides; `ok` null where a side does not know it."""

    name: str
    a: Number | None
    b: Number | None
    diff: Number | None  # |b - a|
    ok: bool | None


class SummaryReport(msgspec.Struct, frozen=True, kw_only=True):
    """The verdict on summaries (see the module docstring). Numbers as `json_number` writes them."""

    basis: str | UnsetType = UNSET  # "summary": a capture's summaries (the fields down to hashes_differ are set)
    has_values: bool  # always false: the elements were never compared
    passed: bool
    identical: bool | UnsetType = UNSET
    shapes_equal: bool
    reason: str | UnsetType = UNSET  # in words, starting "from summaries: "
    sampled: int | UnsetType = UNSET  # elements compared by value
    sampled_max_abs_diff: Number | None | UnsetType = UNSET  # a lower bound of the pair's max |diff|
    sampled_mismatched: int | UnsetType = UNSET
    norm_a: Number | None | UnsetType = UNSET
    norm_b: Number | None | UnsetType = UNSET
    rel_norm_diff: Number | None | UnsetType = UNSET
    mean_shift: Number | None | UnsetType = UNSET
    nan: list[int] | UnsetType = UNSET  # the reference's count, the candidate's
    inf: list[int] | UnsetType = UNSET
    tolerance: str | UnsetType = UNSET
    hashes_differ: bool | None | UnsetType = UNSET  # null: hashes of different kinds, which tell nothing
    rtol: Number | UnsetType = UNSET  # a use_repr trace's verdict: the tolerances it compared with, and its checks
    atol: Number | UnsetType = UNSET
    checks: list[SummaryCheck] | UnsetType = UNSET

    @property
    def on_summary(self) -> bool:
        """A capture's summaries (values="summary"), not a use_repr trace's statistics."""
        return self.basis == "summary"


def summary_report(stored: dict[str, Any] | SummaryReport | None) -> SummaryReport | None:
    """A pair's summary column (its JSON as stored, or already decoded); ValueError where it is not one."""
    if stored is None or isinstance(stored, SummaryReport):
        return stored
    return msgspec.convert(stored, SummaryReport)
