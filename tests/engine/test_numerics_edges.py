"""Numerics at the edges, against exact arithmetic and torch.testing: infinities of one sign at one index are equal
under every tolerance rule, sums of squares and dot products hold at any magnitude, integers differ exactly; in
the numpy and compiled paths, blocks merged in one process or pickled to another (as Dask workers send them)."""

from __future__ import annotations

import math
import pickle
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
from numpy.typing import NDArray
from tensor_debugger.engine import streaming
from tensor_debugger.engine.fused import configure
from tensor_debugger.engine.metrics import PairStats
from tensor_debugger.engine.pair_accumulator import PairAccumulator
from tensor_debugger.engine.profiles import ProfileAccumulator
from tensor_debugger.engine.scaled_sums import Scaled, cosine, sum_squares
from tensor_debugger.engine.streaming import compare_views
from tensor_debugger.engine.tolerances import Tolerance, default_tolerance
from tensor_debugger.engine.views import SourceView

INF = math.inf
RULES = [
    ("default", None),
    ("rtol 0, atol 0", Tolerance(0.0, 0.0)),
    ("rtol 0, atol 1e-5", Tolerance(0.0, 1e-5)),
    ("1 ULP", "ulp"),
]


def tolerance_of(rule: Tolerance | str | None, dtype: str) -> Tolerance:
    if rule is None:
        return default_tolerance(dtype, dtype)
    if rule == "ulp":
        return Tolerance(0.0, 0.0, ulp=1, ulp_dtype=dtype)
    assert isinstance(rule, Tolerance)
    return rule


def stats(
    kernel: str, a: NDArray[Any], b: NDArray[Any], tol: Tolerance, exact: bool = False, rows: int = 3
) -> PairStats:
    configure(kernel=kernel)
    accumulator = PairAccumulator(tol, exact)
    for start in range(0, a.shape[0], rows):
        origin = (start,) + (0,) * (a.ndim - 1)
        accumulator.add(a[start : start + rows], b[start : start + rows], origin, a.shape)
    return accumulator.result()


@pytest.mark.parametrize("kernel", ["compiled", "numpy"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize(("label", "rule"), RULES)
def test_equal_infinities_pass_every_rule_as_torch_testing_has_it(
    kernel: str, dtype: str, label: str, rule: Tolerance | str | None
) -> None:
    """Identical tensors holding +inf and -inf pass (torch.testing.assert_close passes them with the same rtol and
    atol); an infinity against the other sign, or against a finite value, fails under each rule, as torch's does."""
    values = torch.tensor([[1.0, INF, -INF, 0.5], [-INF, 2.0, INF, -3.0], [0.0, 0.25, -INF, INF]]).to(
        getattr(torch, dtype)
    )
    tol = tolerance_of(rule, dtype)
    as_numpy = values.float().numpy() if dtype == "bfloat16" else values.numpy()
    same = stats(kernel, as_numpy, as_numpy.copy(), tol, rows=1)
    torch.testing.assert_close(values.clone(), values, rtol=tol.rtol, atol=tol.atol)
    assert same.passed and same.mismatched == 0 and same.max_abs_diff == 0.0 and (same.inf_a, same.inf_b) == (6, 6)
    for row, col, other in [(0, 1, -INF), (1, 1, INF), (2, 3, 1e4)]:
        changed = values.clone()
        changed[row, col] = other
        with pytest.raises(AssertionError):
            torch.testing.assert_close(changed, values, rtol=tol.rtol, atol=tol.atol)
        b = changed.float().numpy() if dtype == "bfloat16" else changed.numpy()
        assert stats(kernel, as_numpy, b, tol, rows=1).mismatched == 1, (label, row, col)


@pytest.mark.parametrize("rule", [Tolerance(0.0, 0.0), Tolerance(0.0, 0.0, ulp=1, ulp_dtype="float32")])
def test_profiles_count_equal_infinities_as_equal(rule: Tolerance) -> None:
    a = np.array([[INF, 1.0], [-INF, 2.0], [INF, 3.0]], dtype=np.float32)
    b = a.copy()
    b[2, 0] = -INF
    profile = ProfileAccumulator(a.shape, 0, rule, exact=False)
    profile.add(a, b, 0)
    assert profile.result()[2] == [0, 0, 1]


def test_profiles_of_64_bit_integers_take_exact_differences() -> None:
    a = np.full((3, 4), 2**62, dtype=np.int64)
    b = a.copy()
    b[1, 2] += 1
    profile = ProfileAccumulator(a.shape, 0, Tolerance(0.0, 0.0), exact=True)
    profile.add(a, b, 0)
    top, _, mismatched = profile.result()
    assert top == [0.0, 1.0, 0.0] and mismatched == [0, 1, 0]


def test_scaled_sums_add_as_exact_arithmetic_rounds_them() -> None:
    """Partial sums a thousand binades apart add up to the exact sum rounded once (Fraction), where float64 would
    overflow or flush; the float value is that, or infinity past float64's range."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        parts = [float(m) for m in rng.uniform(-1, 1, 3)]
        exponents = [int(e) for e in rng.integers(-1500, 1500, 3)]
        total = Scaled()
        for m, e in zip(parts, exponents, strict=True):
            total = total + Scaled.of(m, e)
        exact = sum((Fraction(m) * Fraction(2) ** e for m, e in zip(parts, exponents, strict=True)), Fraction(0))
        if exact == 0:
            continue
        got = Fraction(total.mantissa) * Fraction(2) ** total.exponent
        assert abs(got - exact) <= abs(exact) * Fraction(1, 2**51)
        try:
            assert float(total) == float(exact)
        except OverflowError:
            assert math.isinf(float(total))


@pytest.mark.parametrize("power", [-1100, -700, -520, 0, 520, 900])
def test_sums_of_squares_at_any_magnitude_match_exact_arithmetic(power: int) -> None:
    rng = np.random.default_rng(power % 97)
    x = np.ldexp(rng.standard_normal(1000), power)
    with np.errstate(over="ignore"):
        squares = sum_squares(x, float(np.dot(x, x)))  # the plain sum, infinity past 2**512
    exact = sum((Fraction(float(v)) ** 2 for v in np.ldexp(x, -power)), Fraction(0))  # x scaled back: exact
    got = Fraction(squares.mantissa) * Fraction(2) ** (squares.exponent - 2 * power)
    assert abs(got - exact) <= exact * Fraction(1, 2**40)


@pytest.mark.parametrize("scale", [1e-300, 1e-200, 1e-160, 1.0, 1e160, 1e200, 1e300])
def test_cosine_of_opposite_and_orthogonal_vectors_is_exact(scale: float) -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal(999) * scale
    plain = stats("numpy", x, -x, Tolerance(1e-7, 1e-7))
    assert plain.cosine == -1.0 and stats("compiled", x, -x, Tolerance(1e-7, 1e-7)).cosine == -1.0
    y = np.zeros_like(x)
    y[::2], x[::2] = x[::2], 0.0
    assert stats("numpy", x, y, Tolerance(1e-7, 1e-7)).cosine == 0.0
    assert cosine(Scaled.of(0.0), Scaled.of(1.0, 2000), Scaled.of(1.0, -2000)) == 0.0


def test_blocks_merged_in_a_stream_and_pickled_as_dask_sends_them_give_the_same_statistics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Blocks of 1,000 elements, some of values ~1e200, some ~1e-200, some of zeros, some int64 past 2**62: the
    stream's merge, and partials pickled and merged in block order (dask_blocks.merged), give what one pass gives."""
    monkeypatch.setattr(streaming, "BLOCK_BYTES", 8 * 1000)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((60, 100))
    x[:15] *= 1e200
    x[15:30] *= 1e-200
    x[30:40] = 0.0
    ints = np.full((60, 100), 2**62, dtype=np.int64)
    ints_b = ints.copy()
    ints_b[44, 7] -= 1
    for a, b, exact in [(x, -x, False), (ints, ints_b, True)]:
        tol = Tolerance(0.0, 0.0) if exact else Tolerance(1e-7, 1e-7)
        whole = stats("numpy", a, b, tol, exact, rows=a.shape[0])
        with ThreadPoolExecutor(2) as pool:
            streamed = compare_views(SourceView(a, lambda v: v), SourceView(b, lambda v: v), tol, exact, pool)
        total = PairAccumulator(tol, exact)
        for start in range(0, 60, 10):
            part = PairAccumulator(tol, exact)
            part.add(a[start : start + 10], b[start : start + 10], (start, 0), a.shape)
            total.merge(pickle.loads(pickle.dumps(part)))
        for got in (streamed, total.result()):
            assert got.max_abs_diff == whole.max_abs_diff and type(got.max_abs_diff) is type(whole.max_abs_diff)
            assert (got.argmax, got.worst, got.mismatched) == (whole.argmax, whole.worst, whole.mismatched)
            assert got.cosine == whole.cosine and got.snr_db == pytest.approx(whole.snr_db, rel=1e-12)
    assert whole.max_abs_diff == 1 and whole.argmax == (44, 7)
