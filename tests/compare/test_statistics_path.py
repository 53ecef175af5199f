"""One statistics path: the heatmap's cells, the inspector's mismatch flags and largest difference, and an error
profile's largest and mean |difference| and mismatches are the engine's own statistics (PairAccumulator, the
pair's metrics) of the same elements, for floats with NaN and infinities, 64-bit integers past float64's precision,
and complex values."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from tensor_debugger.compare.compute.profiles import profile_views
from tensor_debugger.compare.reports.heatmap import build_heatmap
from tensor_debugger.compare.reports.inspector import build_inspector
from tensor_debugger.compare.reports.slices import SliceRequest, read_window
from tensor_debugger.engine.metrics import PairStats, parse_number
from tensor_debugger.engine.pair_accumulator import PairAccumulator
from tensor_debugger.engine.tolerances import EXACT, Tolerance
from tensor_debugger.engine.views import SourceView


def _floats() -> tuple[NDArray[Any], NDArray[Any]]:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((7, 9)).astype(np.float32)
    b = (a + rng.standard_normal(a.shape).astype(np.float32) * 1e-3).astype(np.float32)
    b[0, 0] = a[0, 0]  # equal: within any tolerance
    a[0, 1] = b[0, 1] = np.inf  # equal infinities differ by zero
    a[1, 2], b[1, 2] = np.inf, -np.inf
    a[2, 3] = np.nan
    b[3, 4] = np.nan
    a[4, 5], b[4, 5] = 1.0, np.inf
    a[5, 0] = b[5, 0] = -np.inf
    a[5, 1], b[5, 1] = -np.inf, 3.0  # an infinite reference is within a tolerance only of itself
    a[6, :] = np.nan  # a row with no valid element: its mean is NaN
    return a, b


def _integers() -> tuple[NDArray[Any], NDArray[Any]]:
    rng = np.random.default_rng(4)
    a = rng.integers(2**60, 2**61, size=(5, 6), dtype=np.int64)  # past 2**53: float64 would round the differences
    b = a + rng.integers(-3, 4, size=a.shape)
    b[0, :] = a[0, :]
    return a, b


def _small_integers() -> tuple[NDArray[Any], NDArray[Any]]:
    a = np.arange(24, dtype=np.uint8).reshape(4, 6)
    b = a.astype(np.int16) - np.array([0, 1, 0, -2, 0, 300], dtype=np.int16)  # int16 against uint8
    return a, b


def _complex() -> tuple[NDArray[Any], NDArray[Any]]:
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((4, 5)) + 1j * rng.standard_normal((4, 5))).astype(np.complex64)
    b = (a + 1e-3 * rng.standard_normal(a.shape)).astype(np.complex64)
    b[1, 1] = complex(np.nan, 0)
    return a, b


CASES = {
    "floats": (_floats, Tolerance(1e-3, 1e-5), False),
    "floats in ULPs": (_floats, Tolerance(0.0, 0.0, ulp=4, ulp_dtype="float32"), False),
    "int64 past 2**53": (_integers, EXACT, True),
    "uint8 against int16": (_small_integers, EXACT, True),
    "complex": (_complex, Tolerance(1e-3, 1e-5), False),
}


def _engine(a: NDArray[Any], b: NDArray[Any], tolerance: Tolerance, exact: bool) -> PairStats:
    """The engine's statistics of the elements `a` and `b` (one block of their own aligned tensor)."""
    accumulator = PairAccumulator(tolerance, exact)
    accumulator.add(a, b, (0,) * a.ndim, a.shape)
    return accumulator.result()


def _same(report: float, engine: float) -> bool:
    return (math.isnan(report) and math.isnan(engine)) or report == engine


@pytest.fixture(params=list(CASES))
def case(request: pytest.FixtureRequest) -> tuple[NDArray[Any], NDArray[Any], Tolerance, bool]:
    make, tolerance, exact = CASES[request.param]
    a, b = make()
    return a, b, tolerance, exact


def test_heatmap_cells_are_the_engines_largest_differences(
    case: tuple[NDArray[Any], NDArray[Any], Tolerance, bool],
) -> None:
    a, b, tolerance, exact = case
    heatmap = build_heatmap(SourceView(a, lambda v: v), SourceView(b, lambda v: v), (None, None))
    assert heatmap.cells.shape == a.shape  # small slices: one element a cell
    for i, j in np.ndindex(*a.shape):
        stats = _engine(a[i : i + 1, j : j + 1], b[i : i + 1, j : j + 1], tolerance, exact)
        assert _same(float(heatmap.cells[i, j]), float(stats.max_abs_diff)), (i, j, heatmap.cells[i, j], stats)
        if a.dtype.kind != "c" and not math.isnan(stats.max_abs_diff) and stats.max_abs_diff:
            expected = 1 if b[i, j] > a[i, j] else -1
            assert heatmap.signs[i, j] == expected, (i, j)
        elif not math.isnan(stats.max_abs_diff) and not stats.max_abs_diff:
            assert heatmap.signs[i, j] == 0, (i, j)
    whole = _engine(a, b, tolerance, exact)
    assert _same(float(np.max(heatmap.cells)), float(whole.max_abs_diff))


def test_pooled_heatmap_cells_are_the_engines_statistics_of_their_elements() -> None:
    a, b = _floats()
    a, b = np.tile(a, (20, 30)), np.tile(b, (20, 30))  # 140 x 270: several elements a cell
    heatmap = build_heatmap(SourceView(a, lambda v: v), SourceView(b, lambda v: v), (None, None))
    rows, cols = heatmap.cells.shape
    assert (rows, cols) == (64, 96)
    for r, c in [(0, 0), (1, 2), (17, 33), (rows - 1, cols - 1), (40, 50)]:
        box = (
            slice(heatmap.row_edges[r], heatmap.row_edges[r + 1]),
            slice(heatmap.col_edges[c], heatmap.col_edges[c + 1]),
        )
        stats = _engine(a[box], b[box], Tolerance(1e-3, 1e-5), False)
        assert _same(float(heatmap.cells[r, c]), float(stats.max_abs_diff)), (r, c)


def test_inspector_flags_are_the_engines_mismatches(case: tuple[NDArray[Any], NDArray[Any], Tolerance, bool]) -> None:
    a, b, tolerance, exact = case
    view_a, view_b = SourceView(a, lambda v: v), SourceView(b, lambda v: v)
    window = read_window(view_a, view_b, SliceRequest((None, None), (0, 0), a.shape))
    inspector = build_inspector(window, tolerance, exact)
    difference = inspector.grids[2].rows
    for i, j in np.ndindex(*a.shape):
        stats = _engine(a[i : i + 1, j : j + 1], b[i : i + 1, j : j + 1], tolerance, exact)
        assert difference[i][j].outside == (stats.mismatched == 1), (i, j, a[i, j], b[i, j])
        assert inspector.grids[0].rows[i][j].outside == difference[i][j].outside
        magnitude = abs(complex(window.diff[i, j]))
        assert _same(magnitude, float(stats.max_abs_diff)), (i, j)
    whole = _engine(a, b, tolerance, exact)
    assert inspector.max_index == whole.argmax
    assert sum(cell.outside for row in difference for cell in row) == whole.mismatched


@pytest.mark.parametrize("dim", [0, 1])
def test_profiles_are_the_engines_statistics_per_index(
    case: tuple[NDArray[Any], NDArray[Any], Tolerance, bool], dim: int
) -> None:
    a, b, tolerance, exact = case
    profile = profile_views(SourceView(a, lambda v: v), SourceView(b, lambda v: v), dim, tolerance, exact)
    for k in range(a.shape[dim]):
        part_a, part_b = np.take(a, [k], axis=dim), np.take(b, [k], axis=dim)
        stats = _engine(part_a, part_b, tolerance, exact)
        assert _same(parse_number(profile.max_abs_diff[k]), float(stats.max_abs_diff)), (k, profile, stats)
        mean, expected = parse_number(profile.mean_abs_diff[k]), stats.mean_abs_diff
        assert _same(mean, expected) or mean == pytest.approx(expected, rel=1e-12), (k, mean, expected)
        assert profile.mismatched[k] == stats.mismatched, (k, profile, stats)


def test_inspector_scales_int8_by_their_magnitude() -> None:
    """|int8(-128)| is 128, not -128: the value of largest magnitude gets the strongest colour."""
    a = np.array([[-128, 1], [64, 0]], dtype=np.int8)
    b = np.array([[-128, 1], [64, 2]], dtype=np.int8)
    window = read_window(
        SourceView(a, lambda v: v), SourceView(b, lambda v: v), SliceRequest((None, None), (0, 0), (2, 2))
    )
    reference = build_inspector(window, EXACT, True).grids[0].rows
    assert reference[0][0].classes.startswith("bg-n10 ")
    assert reference[1][0].classes.startswith("bg-p5 ")
    assert [cell.outside for row in reference for cell in row] == [False, False, False, True]
