"""Statistics of a pair, accumulated block by block in float64 (complex128 for complex values).

Every statistic is over the aligned tensor. NaN is never folded away: NaN counts are kept per side, a NaN on
either side makes its element a mismatch, and it makes the cosine similarity and SNR NaN. Relative differences
are |b - a| / |a| over elements whose reference value is non-zero. The worst elements are the `top` largest
differences above zero, largest first (a NaN outranks all, as for the largest difference; on ties, the first in C
order), with their aligned index and both values.

Sums of squares and the dot product are kept with a separate power-of-two exponent (engine/scaled_sums.py), so
cosine and SNR hold at any magnitude. Integer pairs are compared exactly: the largest difference, its index and the
worst elements are exact integers (64-bit values past float64's 2**53 included), the means and sums float64.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.error_spans import ErrorSpan

HIST_LOW, HIST_HIGH = -12, 4  # log10 of |difference|: one bin per decade, plus zero and overflow counts
EDGES = [float(e) for e in 10.0 ** np.arange(HIST_LOW + 1, HIST_HIGH + 1)]  # the float64 decade edges
DEFAULT_TOP = 8  # worst elements kept per pair (Settings.top, `compare --top`)


# JSON has no NaN or Infinity: those travel as "nan", "inf" and "-inf" (json_number); an integer pair's differences and
# values are exact integers (int64 and uint64 past float64's 2**53 included): `int` here keeps them so where msgspec
# decodes stored statistics (compare/reports/pair_rows.py). The OpenAPI document says number or string
# (web/openapi_viewer.py), not oneOf number or integer, which JSON Schema refuses for every whole number.
Number = float | int | str


@dataclass(frozen=True)
class WorstElement:
    """One of a pair's largest differences: where (in aligned coordinates), both values and |a - b| (JSON-ready
    numbers: `json_number`'s, exact integers for an integer pair, a complex value as text)."""

    index: list[int]
    a: Number
    b: Number
    abs_diff: Number


@dataclass(frozen=True)
class PairStats:
    numel: int
    max_abs_diff: float  # an int for a pair of integers (exact; worst elements' values and differences too)
    argmax: tuple[int, ...] | None  # aligned coordinates of the largest difference (NaN outranks all)
    mean_abs_diff: float
    max_rel_diff: float
    mean_rel_diff: float
    mse: float
    rmse: float
    cosine: float
    snr_db: float
    mismatched: int
    mismatched_fraction: float
    nan_a: int
    nan_b: int
    inf_a: int
    inf_b: int
    nan_one_side: int  # positions where exactly one side is NaN
    histogram: list[int]  # [zero, decades HIST_LOW..HIST_HIGH-1 ..., >= 10**HIST_HIGH or inf]
    rtol: float
    atol: float
    worst: list[WorstElement] = field(default_factory=list)  # the largest differences, largest first
    ulp: int = 0  # above 0: the tolerance was this many ULPs of ulp_dtype (rtol and atol unused)
    ulp_dtype: str = ""
    # failing pairs: the aligned dimensions that confine the error (engine/where.py, [] where it is everywhere); None
    # for a passing pair, and for results stored before this was computed
    where: list[ErrorSpan] | None = None

    @property
    def passed(self) -> bool:
        return self.mismatched == 0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["argmax"] = list(self.argmax) if self.argmax is not None else None
        data["where"] = None if self.where is None else [s.to_json() for s in self.where]
        if self.numel == 0:  # nothing compared: no mean, no angle (not NaN, nor the 1 of two zero norms): null
            data.update(dict.fromkeys(OF_ELEMENTS, None))
        return {k: json_number(v) if isinstance(v, float) else v for k, v in data.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PairStats:
        values = {
            k: parse_number(v) if k not in ("argmax", "histogram", "worst", "ulp_dtype", "where") else v
            for k, v in data.items()
        }
        values.update({k: math.nan for k in OF_ELEMENTS if data.get(k, 0) is None})  # a pair of 0 elements's
        values["argmax"] = tuple(data["argmax"]) if data.get("argmax") is not None else None
        values["worst"] = [WorstElement(**w) for w in data.get("worst", [])]
        where = data.get("where")
        values["where"] = None if where is None else [ErrorSpan.from_json(s) for s in where]
        return cls(**values)


# the statistics a pair of 0 elements has none of: stored as null
OF_ELEMENTS = ("mean_abs_diff", "mse", "rmse", "cosine", "snr_db")


def json_number(value: float) -> float | str:
    """JSON has no NaN or Infinity: those travel as the strings "nan", "inf" and "-inf"."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def json_value(value: Any) -> float | int | str:
    """An element's value in JSON: numbers as json_number writes them, a complex value as text ("(1+2j)")."""
    if isinstance(value, complex):
        return str(value)
    return json_number(float(value)) if isinstance(value, float) else int(value)


def parse_number(value: Any) -> Any:
    return float(value) if isinstance(value, str) else value


@functools.cache
def edges() -> NDArray[Any]:
    """The decade edges as the kernel reads them: float64, contiguous."""
    return np.array(EDGES, dtype=np.float64)
