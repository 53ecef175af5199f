"""The compiled statistics kernels give what the numpy paths give, value for value, on every kind of block: a
pair's statistics (comparisons) and one tensor's summary (ingest). Every test runs once per vector family of the
kernels (avx512, avx2, baseline), each family this CPU runs; the others are skipped, saying why."""

from __future__ import annotations

import ctypes
import logging
import math
import platform
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from tensor_debugger.engine.fused import (
    FAMILIES,
    FAMILY_VARIABLE,
    Kernel,
    _library,
    configure,
    empty_partial,
    families,
    fused_partial,
    fused_summary,
    kernel_family,
    kernel_name,
    partial_type,
    use_family,
)
from tensor_debugger.engine.metrics import HIST_HIGH, HIST_LOW, PairStats, edges
from tensor_debugger.engine.pair_accumulator import PairAccumulator
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.ingest.summary import SummaryAccumulator, TensorSummary
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.dtypes import parse_dtype

from tests.support.kernel_reference import check_partial, pair_case

EXACT_FIELDS = (
    "numel",
    "max_abs_diff",
    "argmax",
    "max_rel_diff",
    "mismatched",
    "nan_a",
    "nan_b",
    "inf_a",
    "inf_b",
    "nan_one_side",
    "histogram",
    "worst",
)


@pytest.fixture(params=FAMILIES, autouse=True)
def family(request: pytest.FixtureRequest) -> Iterator[str]:
    """The kernels run the family `request.param` for the test."""
    name: str = request.param
    if name not in families():
        library = _library()
        if library is None or not hasattr(library, f"td_stats_ff_{name}"):
            pytest.skip(
                f"the kernel library here has no {name} family (built for {platform.machine()}: "
                f"{', '.join(families()) or 'no kernel'})"
            )
        pytest.skip(f"this CPU does not run the {name} family (it runs {', '.join(families())})")
    use_family(name)
    yield name
    use_family(None)


def stats_with(
    kernel: str,
    monkeypatch: pytest.MonkeyPatch,
    a: NDArray[Any],
    b: NDArray[Any],
    tol: Tolerance,
    exact: bool = False,
    block: int = 0,
) -> PairStats:
    """Fold `a` and `b` in blocks of `block` rows (all at once for 0) with the named kernel."""
    configure(kernel=kernel)
    assert kernel_name().split()[0] == kernel, kernel_name()
    accumulator = PairAccumulator(tol, exact)
    rows = block or max(1, a.shape[0] if a.ndim else 1)
    if a.ndim == 0:
        accumulator.add(a, b, (), ())
    else:
        for start in range(0, a.shape[0], rows):
            origin = (start,) + (0,) * (a.ndim - 1)
            accumulator.add(a[start : start + rows], b[start : start + rows], origin, a.shape)
    return accumulator.result()


def assert_same(
    monkeypatch: pytest.MonkeyPatch,
    a: NDArray[Any],
    b: NDArray[Any],
    tol: Tolerance,
    exact: bool = False,
    block: int = 0,
) -> PairStats:
    compiled = stats_with("compiled", monkeypatch, a, b, tol, exact, block)
    plain = stats_with("numpy", monkeypatch, a, b, tol, exact, block)
    for field in EXACT_FIELDS:
        assert getattr(compiled, field) == getattr(plain, field) or (
            isinstance(getattr(plain, field), float)
            and math.isnan(getattr(plain, field))
            and math.isnan(getattr(compiled, field))
        ), field
    for field in ("mean_abs_diff", "mean_rel_diff", "mse", "rmse", "cosine", "snr_db"):
        want, got = getattr(plain, field), getattr(compiled, field)
        assert got == pytest.approx(want, rel=1e-11, abs=1e-300, nan_ok=True), field
    return compiled


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 2047, 2048, 2049, 5000, 70001])
def test_every_length_around_vectors_and_sub_blocks(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    rng = np.random.default_rng(size)
    a = rng.standard_normal(size).astype(np.float32)
    b = (a * (1 + 10.0 ** rng.uniform(-9, 0, size))).astype(np.float32)
    if size:
        a[rng.integers(0, size, max(1, size // 10))] = 0.0  # zero references: no relative difference there
    assert_same(monkeypatch, a, b, Tolerance(1.3e-6, 1e-5))


@pytest.mark.parametrize(
    ("dtype_a", "dtype_b"),
    [
        ("float32", "float32"),
        ("float64", "float64"),
        ("float32", "float64"),
        ("float64", "float32"),
        ("float16", "float16"),
        ("float16", "float32"),
    ],
)
def test_dtypes_and_mixed_dtypes(monkeypatch: pytest.MonkeyPatch, dtype_a: str, dtype_b: str) -> None:
    rng = np.random.default_rng(5)
    base = rng.standard_normal((64, 300))
    a = base.astype(dtype_a)
    b = (base + rng.standard_normal(base.shape) * 1e-3).astype(dtype_b)
    assert_same(monkeypatch, a, b, Tolerance(1e-3, 1e-5), block=7)


def test_integers_and_bools_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(9)
    a = rng.integers(-1000, 1000, (50, 41)).astype(np.int32)
    b = a.copy()
    b[3, 4] += 1
    b[40, 0] -= 7
    stats = assert_same(monkeypatch, a, b, Tolerance(0, 0), exact=True, block=9)
    assert stats.mismatched == 2 and stats.argmax == (40, 0) and stats.max_abs_diff == 7.0
    flags = rng.integers(0, 2, 999).astype(bool)
    assert_same(monkeypatch, flags, ~flags, Tolerance(0, 0), exact=True)


def test_ties_take_the_first_position_in_c_order(monkeypatch: pytest.MonkeyPatch) -> None:
    a = np.zeros((40, 100), dtype=np.float32)
    b = a.copy()
    for row, col in [(39, 99), (2, 51), (2, 50), (17, 3)]:  # the same difference in four places
        b[row, col] = 0.5
    for block in (0, 3):
        assert assert_same(monkeypatch, a, b, Tolerance(0, 0), block=block).argmax == (2, 50)
    assert assert_same(monkeypatch, a, a.copy(), Tolerance(0, 0)).argmax == (0, 0)


def test_values_exactly_on_decade_edges_and_tolerance_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Differences of exactly 10**k (binned at float32 precision: the edges as float32 make them), and the next
    float32 either side, fall in the same bins as a direct count; a difference exactly at atol + rtol * |a| passes
    and the next one up fails."""
    edges = (10.0 ** np.arange(HIST_LOW + 1, HIST_HIGH + 1)).astype(np.float32)
    offsets = np.concatenate([edges, np.nextafter(edges, np.float32(0)), np.nextafter(edges, np.float32(np.inf))])
    offsets = offsets.astype(np.float64)
    tol = Tolerance(rtol=2.0**-10, atol=2.0**-20)  # bounds exact in binary
    bound = 1.0 + 2.0**-10 + 2.0**-20
    a = np.concatenate([np.zeros(offsets.size), [1.0, 1.0, 3.0]])
    b = np.concatenate([offsets, [bound, np.nextafter(bound, 2.0), 3.0 + 3 * 2.0**-10 + 2.0**-20]])
    stats = assert_same(monkeypatch, a, b, tol)
    d = np.abs(a - b)
    d32 = d.astype(np.float32)
    want = [int((d == 0).sum()), int(((d > 0) & (d32 < edges[0])).sum())]
    want += [int(((d32 >= lo) & (d32 < hi)).sum()) for lo, hi in zip(edges, edges[1:], strict=False)]
    want.append(int((d32 >= edges[-1]).sum()))
    assert stats.histogram == want
    assert stats.mismatched == offsets.size - int((offsets <= tol.atol).sum()) + 1  # only nextafter(bound) of the 3


def test_nan_and_inf_blocks_fall_back_and_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((30, 64)).astype(np.float32)
    b = a + np.float32(1e-3)
    a[4, 5], b[20, 1], a[25, 0], b[25, 0] = np.nan, np.inf, np.inf, np.inf
    b[29, 63] = np.float32(3e38)  # finite, but its square is not: that block falls back too
    stats = assert_same(monkeypatch, a, b, Tolerance(1e-5, 1e-8), block=5)
    assert (stats.nan_a, stats.inf_a, stats.inf_b) == (1, 1, 2) and stats.argmax == (4, 5)


def test_scalars(monkeypatch: pytest.MonkeyPatch) -> None:
    stats = assert_same(
        monkeypatch, np.array(0.125, dtype=np.float32), np.array(0.25, dtype=np.float32), Tolerance(0, 0)
    )
    assert stats.argmax == () and stats.max_abs_diff == 0.125


@pytest.mark.parametrize(
    ("dtype_a", "dtype_b"),
    [("float32", "float32"), ("float64", "float32"), ("float32", "float64"), ("float64", "float64")],
)
def test_a_family_folded_in_two_calls_gives_what_numpy_computes(family: str, dtype_a: str, dtype_b: str) -> None:
    """The family's pair kernel called directly, a block folded in two calls (the second at a base, as the chunk
    loop folds chunks): element-wise results equal numpy's, sums to the last bits."""
    library = _library()
    assert library is not None and kernel_family() == family
    code = {"float32": "f", "float64": "d"}
    function = getattr(library, f"td_stats_{code[dtype_a]}{code[dtype_b]}_{family}")
    atol, rtol = 1e-5, 1.3e-6
    bins = edges()
    for size in (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 2047, 2048, 2049, 70001):
        a, b = pair_case(size, seed=size)
        a, b = np.ascontiguousarray(a, dtype=dtype_a), np.ascontiguousarray(b, dtype=dtype_b)
        out = empty_partial(8)
        half = size // 2
        for start, stop in ((0, half), (half, size)):
            assert (
                function(
                    ctypes.c_void_p(a[start:].ctypes.data),
                    ctypes.c_void_p(b[start:].ctypes.data),
                    ctypes.c_int64(stop - start),
                    ctypes.c_int64(start),
                    ctypes.c_double(atol),
                    ctypes.c_double(rtol),
                    1,
                    ctypes.c_void_p(bins.ctypes.data),
                    ctypes.byref(out),
                )
                == 0
            )
        fields = {field[0]: getattr(out, field[0]) for field in partial_type()._fields_}
        check_partial({**fields, "at_least": list(out.at_least)}, a, b, atol, rtol, bins, size)


def test_the_family_setting_applies_and_is_overridden_explicitly(
    caplog: pytest.LogCaptureFixture, family: str, tmp_path: Path
) -> None:
    available = families()
    with pytest.raises(ValueError, match="not available here"):
        use_family("sse9")
    configure(family=available[-1])
    assert kernel_family() == available[-1]
    use_family(family)
    assert kernel_family() == family
    configure(family="sse9")
    with caplog.at_level(logging.WARNING, logger="tensor_debugger.engine.fused"):
        assert kernel_family() == available[0]
    assert f"{FAMILY_VARIABLE}=sse9: not a kernel family this CPU runs" in caplog.text
    settings = Settings.from_environ(
        {"TENSOR_DEBUGGER_KERNEL": "numpy", "TENSOR_DEBUGGER_KERNEL_FAMILY": available[-1]}, data_dir=tmp_path
    )
    configure()
    services = open_services(settings)  # the declared settings choose the services' kernel, not the process's
    try:
        kernel = services.context.kernel
        assert services.ingestor.kernel is kernel  # one kernel for the engine's comparisons and its ingests' summaries
        assert kernel.name().startswith("numpy") and kernel.family_in_use == available[-1]
    finally:
        services.close()
    assert kernel_name() == "compiled" and kernel_family() == available[0]  # the process-wide default is untouched
    with pytest.raises(ValueError, match="setting kernel must be"):
        Settings(data_dir=tmp_path, kernel="fast")


# --- one tensor's summary (ingest) ---------------------------------------------------------------------------------


def summary_with(
    kernel: str, monkeypatch: pytest.MonkeyPatch, stored: NDArray[Any], dtype: str, blocks: int = 3
) -> TensorSummary:
    accumulator = SummaryAccumulator()
    for block in np.array_split(stored, blocks):
        accumulator.add_stored(block, parse_dtype(dtype), Kernel(kernel))
    return accumulator.result()


def stored_as(values: NDArray[Any], dtype: str) -> NDArray[Any]:
    """float32 `values` stored as `dtype` (bfloat16: the top 16 bits of each float32, as ingest stores it)."""
    if dtype == "bfloat16":
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("size", [1, 7, 8, 9, 2047, 2048, 2049, 6151, 100003])
def test_summary_kernel_matches_numpy(monkeypatch: pytest.MonkeyPatch, dtype: str, size: int) -> None:
    """min and max exactly; mean and std to 1e-12 (sums in another order); a block the kernel takes must be one."""
    values = np.random.default_rng(size).standard_normal(size).astype(np.float32) * 3 + 1
    stored = stored_as(values, dtype)
    assert fused_summary(stored, dtype) is not None
    compiled, plain = (summary_with(k, monkeypatch, stored, dtype) for k in ("compiled", "numpy"))
    assert (compiled.numel, compiled.min, compiled.max) == (plain.numel, plain.min, plain.max)
    assert compiled.mean is not None and plain.mean is not None and compiled.std is not None and plain.std is not None
    assert compiled.mean == pytest.approx(plain.mean, rel=1e-12, abs=1e-15)
    assert compiled.std == pytest.approx(plain.std, rel=1e-12)
    widened = (stored.astype(np.uint32) << 16).view(np.float32) if dtype == "bfloat16" else stored
    assert compiled.std == pytest.approx(float(np.std(widened.astype(np.float64))), rel=1e-9)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_summary_blocks_with_nan_or_inf_fall_back_and_are_counted(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    values = np.random.default_rng(4).standard_normal(9000).astype(np.float32)
    values[[10, 20]], values[4000], values[8999] = np.nan, np.inf, -np.inf
    stored = stored_as(values, dtype)
    assert fused_summary(stored, dtype) is None  # the kernel refuses the block: numpy counts and skips them
    compiled, plain = (summary_with(k, monkeypatch, stored, dtype) for k in ("compiled", "numpy"))
    assert (compiled.nan_count, compiled.inf_count) == (plain.nan_count, plain.inf_count) == (2, 2)
    assert (compiled.min, compiled.max) == (plain.min, plain.max)
    assert compiled.mean == pytest.approx(plain.mean, rel=1e-12, abs=1e-15)


def test_summary_overflow_gives_no_mean_in_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    stored = np.array([1e308, 1e308, -1e308, 5.0])
    assert fused_summary(stored, "float64") is None
    compiled, plain = (summary_with(k, monkeypatch, stored, "float64", 1) for k in ("compiled", "numpy"))
    assert compiled == plain and compiled.mean is None and compiled.max == 1e308


def test_structures_are_the_declared_ones_and_match_the_library() -> None:
    """The histogram's edges are TD_EDGES (engine/layouts.py, checked against kernel_structs.h), and the
    library loads (its *_size() functions agree with the declared structures)."""
    from tensor_debugger.engine.layouts import TD_EDGES
    from tensor_debugger.engine.metrics import edges

    assert len(edges()) == TD_EDGES
    assert [field[0] for field in partial_type()._fields_][:2] == ["max_abs", "argmax"]
    assert _library() is not None


def test_worst_elements_rank_nan_first_then_the_largest_first_in_aligned_coordinates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both paths keep the same worst elements, blocks merged: a NaN, then an infinite difference, then the largest,
    ties in C order; only differences above zero."""
    a = np.zeros((3, 5000), dtype=np.float32)
    b = a.copy()
    b[2, 4999] = b[1, 10] = 5.0
    b[0, 3], b[2, 0], b[0, 1] = np.nan, np.inf, 1e-3
    stats = assert_same(monkeypatch, a, b, Tolerance(1e-5, 1e-5), block=1)
    assert [w.index for w in stats.worst] == [[0, 3], [2, 0], [1, 10], [2, 4999], [0, 1]]
    assert asdict(stats.worst[0]) == {"index": [0, 3], "a": 0.0, "b": "nan", "abs_diff": "nan"}
    assert asdict(stats.worst[2]) == {"index": [1, 10], "a": 0.0, "b": 5.0, "abs_diff": 5.0}
    finite = b.copy()
    finite[0, 3] = finite[2, 0] = 0.0
    ranked = assert_same(monkeypatch, a, finite, Tolerance(1e-5, 1e-5))
    assert [w.index for w in ranked.worst] == [[1, 10], [2, 4999], [0, 1]]
    assert PairStats.from_json(ranked.to_json()) == ranked


@pytest.mark.parametrize("top", [1, 8, 64])
def test_worst_elements_of_differences_that_grow_along_the_tensor(monkeypatch: pytest.MonkeyPatch, top: int) -> None:
    """Every sub-block raises the worst kept (the kernel's threshold search), ties among the largest, float64 too:
    the same worst elements as numpy's."""
    rng = np.random.default_rng(top)
    for dtype in (np.float32, np.float64):
        a: NDArray[Any] = rng.standard_normal(50_000).astype(dtype)
        b = (a + np.linspace(0, 1, a.size) * 1e-3 * (1 + rng.random(a.size))).astype(dtype)
        a[[100, 30_000, 49_999]], b[[100, 30_000, 49_999]] = 0.0, 10.0
        stats = assert_same(monkeypatch, a, b, Tolerance(1e-5, 1e-5))
        accumulator = PairAccumulator(Tolerance(1e-5, 1e-5), False, top)
        configure(kernel="compiled")
        accumulator.add(a, b, (0,), a.shape)
        mine = accumulator.result().worst
        configure(kernel="numpy")
        plain = PairAccumulator(Tolerance(1e-5, 1e-5), False, top)
        plain.add(a, b, (0,), a.shape)
        assert mine == plain.result().worst and len(mine) == top
        assert [w.index for w in mine[:3]] == [[100], [30_000], [49_999]][:top]
        assert stats.worst[: min(3, top)] == mine[: min(3, top)]


@pytest.mark.parametrize("scale", [1e200, 1e150, 1e-150, 1e-200, 1e-300])
def test_float64_of_any_magnitude_gives_the_cosine_of_the_same_values_at_magnitude_one(
    monkeypatch: pytest.MonkeyPatch, scale: float
) -> None:
    """Past about 1e154 the squares overflow and below about 1e-154 they underflow: the kernel declines those blocks
    and the numpy path sums them scaled by a power of two. x against -x is exactly -1, orthogonal vectors exactly 0,
    and any pair the cosine of the same values scaled to magnitude one (exactly: a power of two), in both paths,
    blocks merged; blocks of zeros between them change nothing."""
    rng = np.random.default_rng(11)
    power = 2.0 ** round(math.log2(scale))
    x = rng.standard_normal((40, 300))
    x[10:20] = 0.0  # blocks of zeros, which the kernel finishes (their sums are exact)
    a = x * power
    assert assert_same(monkeypatch, a, -a, Tolerance(1e-7, 1e-7), block=7).cosine == -1.0
    halves = np.zeros_like(a), np.zeros_like(a)
    halves[0][:, :150], halves[1][:, 150:] = a[:, :150], a[:, 150:]
    assert assert_same(monkeypatch, *halves, Tolerance(1e-7, 1e-7), block=7).cosine == 0.0
    b = a * (1 + 1e-3 * rng.standard_normal(a.shape))
    got = assert_same(monkeypatch, a, b, Tolerance(1e-7, 1e-7), block=7)
    at_one = stats_with("numpy", monkeypatch, a / power, b / power, Tolerance(1e-7, 1e-7))
    assert got.cosine == pytest.approx(at_one.cosine, rel=1e-14) and got.cosine < 1.0
    assert got.snr_db == pytest.approx(at_one.snr_db, rel=1e-12)


def test_kernel_declines_only_blocks_whose_sums_underflow_or_overflow() -> None:
    """Finite partials for ordinary values and for zeros (nothing to scale); declined (norm_a NaN) for squares past
    float64's range or under 2**-900 while a value is not zero, on either side."""
    configure(kernel="compiled")
    zeros, ones = np.zeros(5000), np.ones(5000)
    for a, b, finished in [
        (ones, ones, True),
        (zeros, zeros, True),
        (zeros, ones, True),
        (ones * 1e200, ones, False),
        (ones, ones * 1e-200, False),
        (ones * 1e-200, zeros, False),
        (ones, ones + 1e-200, True),  # differences under 2**-900 are within rounding of |a|: not the kernel's concern
    ]:
        part = fused_partial(a, b, 0.0, 0.0, True, edges())
        assert part is not None
        assert math.isfinite(part.norm_a) == finished, (a[0], b[0])


@pytest.mark.parametrize(
    ("dtype_a", "dtype_b", "base"),
    [
        ("int64", "int64", 2**62),
        ("int64", "int64", -(2**62)),
        ("uint64", "uint64", 2**63 + 12345),
        ("int64", "uint64", 2**62),
        ("int64", "int64", 2**52 + 1),  # the first magnitude float64 may round differences of
    ],
)
def test_64_bit_integers_differ_exactly(monkeypatch: pytest.MonkeyPatch, dtype_a: str, dtype_b: str, base: int) -> None:
    """Integers past float64's 2**53 differing by one: both paths report the difference 1 at its index as a Python
    int, the worst elements with the exact values (float64 rounded them: 0 and nothing before)."""
    a = np.full((30, 40), base, dtype=dtype_a)
    b = a.astype(dtype_b)
    b[17, 3] += 1
    b[29, 0] += 1
    b[2, 2] -= 1 if base > 0 else -1
    stats = assert_same(monkeypatch, a, b, Tolerance(0, 0), exact=True, block=7)
    assert stats.max_abs_diff == 1 and isinstance(stats.max_abs_diff, int)
    assert stats.argmax == (2, 2) and stats.mismatched == 3
    assert [w.index for w in stats.worst] == [[2, 2], [17, 3], [29, 0]]
    assert asdict(stats.worst[1]) == {"index": [17, 3], "a": base, "b": base + 1, "abs_diff": 1}
    assert PairStats.from_json(stats.to_json()) == stats


def test_the_widest_integer_differences_and_small_integers_are_integers(monkeypatch: pytest.MonkeyPatch) -> None:
    """int64's extremes differ by 2**64 - 1 (no 64-bit type holds it signed: taken unsigned); int64 against uint64
    past 2**63 by more than 2**64 (Python integers); int32 and int8 pairs, the kernel's, report integers too."""
    low, high = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    a = np.array([low, high, 0, 7], dtype=np.int64)
    b = np.array([high, low, 0, 7], dtype=np.int64)
    stats = assert_same(monkeypatch, a, b, Tolerance(0, 0), exact=True)
    assert (stats.max_abs_diff, stats.argmax) == (2**64 - 1, (0,))
    assert asdict(stats.worst[0]) == {"index": [0], "a": int(low), "b": int(high), "abs_diff": 2**64 - 1}
    unsigned = np.array([2**64 - 1, 5, 0, 7], dtype=np.uint64)
    mixed = assert_same(monkeypatch, a, unsigned, Tolerance(0, 0), exact=True)
    assert (mixed.max_abs_diff, mixed.argmax) == (2**64 - 1 - int(low), (0,))
    for dtype in (np.int32, np.int8):
        small = np.arange(100, dtype=dtype)
        other = small.copy()
        other[42] -= 3
        got = assert_same(monkeypatch, small, other, Tolerance(0, 0), exact=True)
        assert got.max_abs_diff == 3 and isinstance(got.max_abs_diff, int) and got.argmax == (42,)
        assert [asdict(w) for w in got.worst] == [{"index": [42], "a": 42, "b": 39, "abs_diff": 3}]
