"""The noise floor: with a rerun of the reference in the session (a run whose role is "noise"), each candidate
pair is judged against the error the rerun itself shows at that tensor (the reference against its rerun, the
same pair's statistics) instead of against fixed tolerances.

A pair passes when the candidate's max |diff| is within `factor` times the rerun's (the "noise" rule). Where the
rerun is bit-identical at that tensor (a noise floor of zero), or its pair is missing or not computed yet, the
tolerances judge as without a rerun (the "tolerance" rule). NaN anywhere fails.

The default factor, 4: the largest difference between two runs of the same nondeterministic kernels is itself a
sample of the noise (in tests/compare/test_noise.py, 1e-4 noise, the candidate's max |diff| lies within 0.9-1.1x
the floor at every tensor); 4 leaves room for a candidate whose rounding merely differs (another reduction
order, say), while a real bug sits orders of magnitude above the floor.
"""

from __future__ import annotations

import math
from enum import StrEnum

from tensor_debugger.engine.metrics import parse_number

NOISE_FACTOR = 4.0


class Rule(StrEnum):
    TOLERANCE = "tolerance"
    NOISE = "noise"


def noise_judges(candidate_error: object, noise_error: object, factor: float) -> bool | None:
    """Whether the candidate's max |diff| is within `factor` times the noise floor's; None when the noise rule does
    not apply (no floor, or a floor of zero: the tolerances judge)."""
    if candidate_error is None or noise_error is None:
        return None
    floor = float(parse_number(noise_error))
    error = float(parse_number(candidate_error))
    if math.isnan(floor) or floor <= 0:
        return None
    return not math.isnan(error) and error <= factor * floor
