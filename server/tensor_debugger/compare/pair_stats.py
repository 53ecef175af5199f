"""A compared pair's statistics as reports show them, decoded from the persistent comparison cache's JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tensor_debugger.compare.module_reports import Number


@dataclass(frozen=True)
class PairStatsSummary:
    """A compared pair's statistics over the aligned tensors (see engine.metrics.PairStats)."""

    max_abs_diff: Number
    mean_abs_diff: Number
    max_rel_diff: Number
    mean_rel_diff: Number
    mse: Number
    rmse: Number
    cosine: Number
    snr_db: Number
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

    @classmethod
    def from_json(cls, stats: dict[str, Any]) -> PairStatsSummary:
        """From the stored statistics (PairStats.to_json)."""
        return cls(**{k: stats[k] for k in SUMMARY_STATS})


@dataclass(frozen=True)
class PairStatsFull(PairStatsSummary):
    """The statistics with the histogram of |difference|: [zero, one decade each from 1e-12 to 1e4, the rest]."""

    histogram: list[int]

    @classmethod
    def from_json(cls, stats: dict[str, Any]) -> PairStatsFull:
        return cls(**{k: stats[k] for k in SUMMARY_STATS}, histogram=list(stats["histogram"]))


SUMMARY_STATS = tuple(PairStatsSummary.__dataclass_fields__)
