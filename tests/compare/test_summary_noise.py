"""The noise rule on pairs known by their summaries (compare/reports/noise.py `summary_noise_verdict`), from real
summaries (`ingest/sketches`' as a capture keeps them, compared by `engine/summary_compare`): the candidate's
sampled max |diff| and relative norm difference against 4 times the rerun's, both ways, the words saying that the
verdict rests on summaries; a rerun identical at the sampled elements leaves the tolerances to judge."""

from __future__ import annotations

import msgspec
import numpy as np
import torch
from tensor_debugger.compare.reports.noise import NOISE_FACTOR, noise_judges, summary_noise_verdict
from tensor_debugger.compare.reports.summary_reports import SummaryReport, summary_report
from tensor_debugger.engine.summary_compare import compare_sketches, sample_positions
from tensor_debugger.engine.tolerances import default_tolerance
from tensor_debugger.ingest.sketches import sketch

N = 4096
REFERENCE = torch.from_numpy(np.random.default_rng(0).standard_normal(N).astype(np.float32))


def _verdict(other: torch.Tensor) -> SummaryReport:
    a, b = sketch(REFERENCE), sketch(other)
    found = summary_report(compare_sketches(a, b, default_tolerance("float32", "float32")).to_json())
    assert found is not None
    return found


def _noisy(scale: float, seed: int) -> torch.Tensor:
    noise = np.random.default_rng(seed).uniform(-1, 1, N).astype(np.float32)
    return REFERENCE + scale * torch.from_numpy(noise)


def test_a_candidate_within_4_times_the_reruns_noise_passes_and_beyond_it_fails_even_within_tolerance() -> None:
    floor = _verdict(_noisy(1e-7, 1))
    near = summary_noise_verdict(_verdict(_noisy(3e-7, 2)), floor, N, NOISE_FACTOR)
    far = _verdict(_noisy(1e-6, 2))
    assert far.passed  # within float32's tolerance (rtol 1.3e-6, atol 1e-5)
    beyond = summary_noise_verdict(far, floor, N, NOISE_FACTOR)
    assert near is not None and near.passed
    assert beyond is not None and not beyond.passed
    assert str(beyond.reason).startswith("from summaries, against the noise floor (4 times the rerun's error")
    assert "sampled max |diff|" in str(beyond.reason) and "more than 4 times the rerun's" in str(beyond.reason)
    assert "not every element was compared" in str(near.reason)


def test_a_norm_beyond_the_reruns_bound_fails_though_the_samples_pass() -> None:
    """A scale of every element outside the sample would pass the samples; the norms catch a large one: half again on
    every element whose index is not sampled (the positions are the same for every tensor of N elements)."""
    floor = _verdict(_noisy(1e-7, 1))
    sampled = set(sample_positions(N))
    scaled = REFERENCE.clone()
    rest = torch.tensor([i for i in range(N) if i not in sampled])
    scaled[rest] *= 1.5
    judged = summary_noise_verdict(_verdict(scaled), floor, N, NOISE_FACTOR)
    assert judged is not None and not judged.passed
    assert "norms" in str(judged.reason) and "more than 4 times the rerun's relative L2 error" in str(judged.reason)


def test_a_rerun_identical_at_the_samples_leaves_the_tolerances_to_judge_and_a_nan_fails() -> None:
    same = _verdict(REFERENCE.clone())
    assert summary_noise_verdict(_verdict(_noisy(1e-6, 2)), same, N, NOISE_FACTOR) is None
    with_nan = REFERENCE.clone()
    with_nan[0] = float("nan")
    judged = summary_noise_verdict(_verdict(with_nan), _verdict(_noisy(1e-7, 1)), N, NOISE_FACTOR)
    assert judged is not None and not judged.passed


def test_a_rerun_that_overflowed_bounds_nothing_and_leaves_the_tolerances_to_judge() -> None:
    """A rerun with an infinity where the reference has none (a float16 copy that overflowed there) has an infinite
    error: 4 times it bounded nothing, so every candidate passed at that tensor, however far. The tolerances judge
    it, as at a floor of zero; on full values too."""
    overflowed = _noisy(1e-7, 1)
    overflowed[sample_positions(N)[0]] = float("inf")
    floor = _verdict(overflowed)
    far = _verdict(_noisy(1e-2, 2))
    assert not far.passed
    assert summary_noise_verdict(far, floor, N, NOISE_FACTOR) is None
    assert noise_judges(1.0, float("inf"), NOISE_FACTOR) is None
    assert noise_judges(1.0, "inf", NOISE_FACTOR) is None
    assert noise_judges(1e-7, 1e-7, NOISE_FACTOR) is True


def test_a_candidate_whose_sampled_diff_is_unknown_is_left_to_the_tolerances() -> None:
    """No sampled max |diff| of the candidate's (a summary that kept none): the rule has nothing to hold against the
    floor, so it does not pass the pair on the norms alone as if that |diff| were zero."""
    floor = _verdict(_noisy(1e-7, 1))
    unknown = msgspec.structs.replace(_verdict(_noisy(1e-2, 2)), sampled_max_abs_diff=None)
    assert summary_noise_verdict(unknown, floor, N, NOISE_FACTOR) is None
