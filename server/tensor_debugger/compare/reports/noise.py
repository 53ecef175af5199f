"""The noise floor: with a rerun of the reference in the session (a run whose role is "noise"), each candidate
pair is judged against the error the rerun itself shows at that tensor (the reference against its rerun, the
same pair's statistics) instead of against fixed tolerances.

A pair passes when the candidate's max |diff| is within `factor` times the rerun's (the "noise" rule). Where the
rerun is bit-identical at that tensor (a noise floor of zero), or its error there is infinite (an overflow, which
bounds nothing), or its pair is missing or not computed yet, the tolerances judge as without a rerun (the
"tolerance" rule). NaN anywhere fails. A pair known by its summaries only
(a capture with values="summary", as find_divergence's precision floor stores its runs) is judged by the lower
bounds of its error the summaries hold (`summary_noise_verdict`), and its words say so.

The default factor, 4: the largest difference between two runs of the same nondeterministic kernels is itself a
sample of the noise (in tests/compare/test_noise.py, 1e-4 noise, the candidate's max |diff| lies within 0.9-1.1x
the floor at every tensor); 4 leaves room for a candidate whose rounding merely differs (another reduction
order, say), while a real bug sits orders of magnitude above the floor.
"""

from __future__ import annotations

import math
from enum import StrEnum

import msgspec
from msgspec import UNSET

from tensor_debugger.compare.reports.summary_reports import SummaryReport
from tensor_debugger.engine.metrics import parse_number

NOISE_FACTOR = 4.0


class Rule(StrEnum):
    TOLERANCE = "tolerance"
    NOISE = "noise"


def noise_judges(candidate_error: object, noise_error: object, factor: float) -> bool | None:
    """Whether the candidate's max |diff| is within `factor` times the noise floor's; None when the noise rule does
    not apply (no floor, a floor of zero, or an infinite one, an overflow that bounds nothing: the tolerances
    judge)."""
    if candidate_error is None or noise_error is None:
        return None
    floor = float(parse_number(noise_error))
    error = float(parse_number(candidate_error))
    if not math.isfinite(floor) or floor <= 0:
        return None
    return not math.isnan(error) and error <= factor * floor


def summary_noise_verdict(
    candidate: SummaryReport, floor: SummaryReport | None, numel: int, factor: float
) -> SummaryReport | None:
    """The noise rule on a pair known by its summaries (a capture with values="summary"; `candidate`, the
    reference's summary against the candidate's; `floor`, the reference's against the rerun's at the same tensor;
    `numel`, the tensor's elements): its verdict, its words saying that it rests on summaries; None where the rule
    does not apply (either is not a capture's summaries, or the rerun shows no difference at the sampled elements:
    a floor of zero, or an Inf count of the rerun's that differs from the reference's, an overflow: the tolerances
    judge, as with full values).

    Summaries hold no max |diff|: two lower bounds of the error stand for it, each against `factor` times the
    rerun's own. The sampled max |diff| (the largest |diff| among the same positions on every side) against the
    rerun's; the relative norm difference |‖b‖ - ‖a‖| / ‖a‖ (a lower bound of the relative L2 error) against the
    rerun's relative L2 error at most, its own norm difference or √n times its sampled max |diff| over ‖a‖, which
    ever is larger (‖f - a‖ <= √n·max|f - a|, the max taken as the sampled one). A shape, NaN or Inf count that
    differs, or a NaN on any side, fails (as the noise rule holds). Passing proves nothing of the elements not
    sampled, as any verdict on summaries."""
    if floor is None or not candidate.on_summary or not floor.on_summary:
        return None
    floor_sampled = _number(floor.sampled_max_abs_diff)
    floor_inf = floor.inf if isinstance(floor.inf, list) else [0, 0]
    if floor_sampled is None or not math.isfinite(floor_sampled) or floor_sampled <= 0 or floor_inf[0] != floor_inf[1]:
        return None  # no floor, one of zero, or one that overflowed (an Inf the reference has not): it bounds nothing
    words = f"from summaries, against the noise floor ({factor:g} times the rerun's error at this tensor)"
    nan = candidate.nan if isinstance(candidate.nan, list) else [0, 0]
    inf = candidate.inf if isinstance(candidate.inf, list) else [0, 0]
    floor_nan = floor.nan if isinstance(floor.nan, list) else [0, 0]
    if not candidate.shapes_equal or nan[0] != nan[1] or inf[0] != inf[1] or any(nan) or any(floor_nan):
        return msgspec.structs.replace(
            candidate, passed=False, reason=f"{words}: {str(candidate.reason).removeprefix('from summaries: ')}"
        )
    sampled = _number(candidate.sampled_max_abs_diff)
    if sampled is None:
        return None  # the candidate's sampled |diff| unknown: nothing to hold against the floor; the tolerances judge
    within_samples = not math.isnan(sampled) and sampled <= factor * floor_sampled
    checks = [
        f"sampled max |diff| {sampled:.4g}, {'within' if within_samples else 'more than'} {factor:g} times the "
        f"rerun's {floor_sampled:.4g}"
    ]
    norm = _number(floor.norm_a)
    rel = _number(candidate.rel_norm_diff)
    within_norm = True
    if norm is not None and norm > 0 and math.isfinite(norm) and rel is not None:
        bound = max(_number(floor.rel_norm_diff) or 0.0, math.sqrt(max(numel, 1)) * floor_sampled / norm)
        within_norm = not math.isnan(rel) and rel <= factor * bound
        checks.append(
            f"norms {rel:.3g} apart (relative), {'within' if within_norm else 'more than'} {factor:g} times the "
            f"rerun's relative L2 error at most, {bound:.3g}"
        )
    passed = within_samples and within_norm
    reason = f"{words}: {'; '.join(checks)}; not every element was compared"
    return msgspec.structs.replace(candidate, passed=passed, reason=reason)


def _number(value: object) -> float | None:
    """A summary's number (NaN and infinities as text), None where unknown."""
    return None if value is None or value is UNSET else float(parse_number(value))
