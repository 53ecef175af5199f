"""A pair's statistics finished (`metrics.PairStats`) from what its blocks added up (`PairSums`) and where its largest
differences are (`LargestDifferences`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tensor_debugger.engine.largest_differences import LargestDifferences
from tensor_debugger.engine.metrics import PairStats, WorstElement, json_number, json_value
from tensor_debugger.engine.pair_sums import PairSums
from tensor_debugger.engine.scaled_sums import cosine, decibels
from tensor_debugger.engine.tolerances import Tolerance


def finished_stats(sums: PairSums, found: LargestDifferences, tolerance: Tolerance) -> PairStats:
    """The statistics of every block folded into `sums` and `found`, compared under `tolerance`."""
    valid = max(sums.valid, 1)
    has_nan = sums.nan_a + sums.nan_b > 0
    if has_nan or sums.unequal_inf:
        similarity = snr = math.nan
    else:
        similarity = cosine(sums.dot, sums.norm_a, sums.norm_b)
        snr = decibels(sums.norm_a, sums.sum_sq)
    mse = sums.sum_sq.divided(valid) if sums.valid else math.nan
    largest = max(found.max_abs, 0.0) if not math.isnan(found.max_abs) else math.nan
    # integers' differences and values are exact: JSON integers
    number: Callable[[Any], Any] = int if sums.integers else _same
    return PairStats(
        numel=sums.numel,
        max_abs_diff=number(largest),
        argmax=found.argmax,
        mean_abs_diff=sums.sum_abs / valid if sums.valid else math.nan,
        max_rel_diff=sums.max_rel,
        mean_rel_diff=sums.sum_rel / sums.rel_count if sums.rel_count else 0.0,
        mse=mse,
        rmse=math.sqrt(mse) if not math.isnan(mse) else math.nan,
        cosine=similarity,
        snr_db=snr,
        mismatched=sums.mismatched,
        mismatched_fraction=sums.mismatched / sums.numel if sums.numel else 0.0,
        nan_a=sums.nan_a,
        nan_b=sums.nan_b,
        inf_a=sums.inf_a,
        inf_b=sums.inf_b,
        nan_one_side=sums.nan_one,
        histogram=sums.histogram_counts(),
        rtol=tolerance.rtol,
        atol=tolerance.atol,
        ulp=tolerance.ulp,
        ulp_dtype=tolerance.ulp_dtype,
        worst=[
            WorstElement(
                list(index),
                json_value(number(x)),
                json_value(number(y)),
                json_number(d) if isinstance(d, float) and not sums.integers else int(d),
            )
            for _, _, _, index, d, x, y in found.worst
        ],
    )


def _same(value: Any) -> Any:
    return value
