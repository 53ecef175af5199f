"""A compared pair's statistics as reports show them, decoded from the persistent comparison cache's JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tensor_debugger.engine.metrics import Number, WorstElement


@dataclass(frozen=True)
class PairStatsSummary:
    """A compared pair's statistics over the aligned tensors (see engine.metrics.PairStats)."""

    max_abs_diff: Number
    mean_abs_diff: Number | None  # None (with mse, rmse, cosine, snr_db): a pair of 0 elements has no such figure
    max_rel_diff: Number
    mean_rel_diff: Number
    mse: Number | None
    rmse: Number | None
    cosine: Number | None
    snr_db: Number | None
    mismatched: int
    mismatched_fraction: Number
    numel: int
    argmax: list[int] | None
    nan_a: int
    nan_b: int
    inf_a: int
    inf_b: int
    nan_one_side: int
    rtol: Number
    atol: Number
    # Results stored before worst elements and ULP tolerances existed have none: these fields have defaults.
    worst: list[WorstElement] = field(default_factory=list)  # the largest differences, largest first
    ulp: int = 0  # above 0: elements passed within this many ULPs of ulp_dtype (rtol and atol unused)
    ulp_dtype: str = ""

    @classmethod
    def from_json(cls, stats: dict[str, Any]) -> PairStatsSummary:
        """From the stored statistics (PairStats.to_json)."""
        return cls(**_summary_values(stats))


@dataclass(frozen=True)
class PairStatsFull(PairStatsSummary):
    """The statistics with the histogram of |difference|: [zero, one decade each from 1e-12 to 1e4, the rest]."""

    histogram: list[int] = field(kw_only=True)

    @classmethod
    def from_json(cls, stats: dict[str, Any]) -> PairStatsFull:
        return cls(**_summary_values(stats), histogram=list(stats["histogram"]))


SUMMARY_STATS = tuple(PairStatsSummary.__dataclass_fields__)


def _summary_values(stats: dict[str, Any]) -> dict[str, Any]:  # `from_json`'s: the stored JSON -> keyword arguments
    values = {k: stats[k] for k in SUMMARY_STATS if k in stats}
    values["worst"] = [WorstElement(**w) for w in stats.get("worst", [])]
    return values
