"""Verdicts for pairs whose element values are not available (a trace written with `use_repr=True`).

What such a trace keeps of a tensor is its shape, its dtype and four statistics printed with 5 significant digits:
mean, std, min and max. Two tensors pass when their shapes are equal and each statistic present on both sides
satisfies |b - a| <= atol + rtol' * |a|, where rtol' is the pair's rtol but never tighter than the printing allows
(SUMMARY_RTOL_FLOOR). A pass says only that these four numbers agree; the elements were never seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tensor_debugger.engine.metrics import json_number
from tensor_debugger.engine.tolerances import Tolerance

STATISTICS = ("mean", "std", "min", "max")
SUMMARY_RTOL_FLOOR = 1e-4  # two values rounded to 5 significant digits differ by up to 1e-4 relative


@dataclass(frozen=True)
class ReportedSummary:
    """A tensor known by its shape, dtype and statistics (as a trace written with use_repr=True reports them, or as
    ingest summarised it), compared without its values."""

    shape: tuple[int, ...]
    dtype: str
    stats: dict[str, float | None]  # of STATISTICS; None when unknown


@dataclass(frozen=True)
class StatisticCheck:
    name: str
    a: float | None
    b: float | None
    diff: float | None  # |b - a|
    ok: bool | None  # None when a side does not know this statistic


@dataclass(frozen=True)
class SummaryVerdict:
    passed: bool
    shapes_equal: bool
    checks: tuple[StatisticCheck, ...]
    rtol: float
    atol: float

    def to_json(self) -> dict[str, Any]:
        return {
            "has_values": False,
            "passed": self.passed,
            "shapes_equal": self.shapes_equal,
            "rtol": self.rtol,
            "atol": self.atol,
            "checks": [
                {"name": c.name, "a": _number(c.a), "b": _number(c.b), "diff": _number(c.diff), "ok": c.ok}
                for c in self.checks
            ],
        }


def compare_summaries(a: ReportedSummary, b: ReportedSummary, tolerance: Tolerance) -> SummaryVerdict:
    rtol = max(tolerance.rtol, SUMMARY_RTOL_FLOOR)
    checks = tuple(_check(name, a.stats.get(name), b.stats.get(name), rtol, tolerance.atol) for name in STATISTICS)
    shapes_equal = a.shape == b.shape
    passed = shapes_equal and all(c.ok is not False for c in checks)
    return SummaryVerdict(passed, shapes_equal, checks, rtol, tolerance.atol)


def _check(name: str, a: float | None, b: float | None, rtol: float, atol: float) -> StatisticCheck:
    if a is None or b is None:
        return StatisticCheck(name, a, b, None, None)
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        same = a == b or (math.isnan(a) and math.isnan(b))
        return StatisticCheck(name, a, b, 0.0 if same else math.inf, same)
    diff = abs(b - a)
    return StatisticCheck(name, a, b, diff, diff <= atol + rtol * abs(a))


def _number(value: float | None) -> float | str | None:
    return None if value is None else json_number(value)
