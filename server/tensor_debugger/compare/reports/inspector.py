"""The value inspector of the pair page: a window of both runs' values and their difference, as cells ready to
render. Backgrounds go from blue (negative) to orange (positive) by magnitude within the window; borders are
green within tolerance and orange outside it, stronger the larger the difference. Colour is never the only
signal: every cell's title says its value, index, and absolute and relative difference, and cells outside the
tolerance are marked in text for screen readers.

Colours are CSS classes in steps of a tenth (`cell_css()` writes their rules, which web/static/app.css holds), not
inline styles: the pages' Content-Security-Policy allows no inline style."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.compare.reports.formatting import format_number
from tensor_debugger.compare.reports.slices import SliceRequest, Window
from tensor_debugger.engine import elementwise
from tensor_debugger.engine.tolerances import Tolerance

PER_ROW_1D = 1  # a 1-D window comes a value a row; the page's script lays it out as many a row as fit the width


@dataclass(frozen=True)
class Cell:
    text: str
    title: str
    classes: str  # background and border colour classes (cell_css)
    outside: bool  # outside the tolerance
    is_max: bool  # the largest difference in the window


@dataclass(frozen=True)
class Grid:
    label: str
    rows: list[list[Cell]]
    row_labels: list[str]
    col_labels: list[str] = field(default_factory=list)  # the index along the columns' dimension (2-D windows)


@dataclass(frozen=True)
class InspectorView:
    grids: list[Grid]
    caption: str  # what the window shows, in words
    max_index: tuple[int, ...] | None  # aligned index of the largest difference in the window


def _scalar(value: complex | float) -> float:
    return abs(value) if isinstance(value, complex) else float(value)


def _text(value: complex | float) -> str:
    if isinstance(value, complex):
        return f"{format_number(value.real)}{value.imag:+.4g}j"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return format_number(value)


STEPS = 10  # colour strengths are rounded to tenths
_NEGATIVE, _POSITIVE = ((232, 242, 250), (96, 160, 214)), ((254, 243, 226), (240, 150, 58))
_OUTSIDE = ((250, 200, 140), (230, 110, 0))
_NONFINITE, _WITHIN, _RAW_BORDER = "#d7d7d7", "#6cc070", "#cfd6df"


def _level(strength: float) -> int:
    return round(min(1.0, max(0.0, strength)) * STEPS)


def _blend(ends: tuple[tuple[int, int, int], tuple[int, int, int]], level: int) -> str:
    light, full = ends
    rgb = tuple(round(lo + (hi - lo) * level / STEPS) for lo, hi in zip(light, full, strict=True))
    return f"rgb{rgb}".replace(" ", "")


def _background(value: float, scale: float) -> str:
    if not math.isfinite(value):
        return "bg-nonfinite"
    level = _level(abs(value) / scale if scale > 0 else 0.0)
    return f"bg-n{level}" if value < 0 else f"bg-p{level}"


def _border(diff: float, outside: bool, scale: float) -> str:
    if not outside:
        return "bd-within"
    strength = 1.0 if not math.isfinite(diff) or scale <= 0 else 0.35 + 0.65 * min(1.0, abs(diff) / scale)
    return f"bd-out{_level(strength)}"


def cell_css() -> str:
    """The rules of every colour class a cell may get, as web/static/app.css holds them (a test compares)."""
    rules = [f"table.values td.bg-nonfinite {{ background: {_NONFINITE}; }}"]
    for level in range(STEPS + 1):
        rules.append(f"table.values td.bg-n{level} {{ background: {_blend(_NEGATIVE, level)}; }}")
        rules.append(f"table.values td.bg-p{level} {{ background: {_blend(_POSITIVE, level)}; }}")
    rules.append(f"table.values td.bd-within {{ border-color: {_WITHIN}; }}")
    rules.append(f"table.values td.bd-raw {{ border-color: {_RAW_BORDER}; }}")
    rules += [
        f"table.values td.bd-out{level} {{ border-color: {_blend(_OUTSIDE, level)}; }}"
        for level in range(_level(0.35), STEPS + 1)
    ]
    return "\n".join(rules) + "\n"


def build_inspector(window: Window, tolerance: Tolerance, exact: bool) -> InspectorView:
    a, b, diff = window.a, window.b, window.diff
    two_d = a.ndim == 2
    abs_diff = elementwise.abs_diff(a, b)  # the statistics' own differences and tolerance test
    outside = ~elementwise.within_tolerance(a, b, tolerance, exact, abs_diff)
    finite_diff = abs_diff[np.isfinite(abs_diff)]
    diff_scale = float(finite_diff.max()) if finite_diff.size else 0.0
    wide = elementwise.wide_dtype(a, b)  # widened first: |int8(-128)| is 128
    values = np.abs(np.concatenate([a.ravel().astype(wide), b.ravel().astype(wide)]))
    finite_values = values[np.isfinite(values)]
    value_scale = float(finite_values.max()) if finite_values.size else 0.0
    max_pos: tuple[int, ...] | None = None
    largest = elementwise.largest(abs_diff)
    if largest is not None and not abs_diff.reshape(-1)[largest] <= 0:  # an all-equal window has no largest
        max_pos = tuple(int(i) for i in np.unravel_index(largest, abs_diff.shape))
    positions = list(np.ndindex(*a.shape)) if a.ndim else [()]

    def cell(source: NDArray[Any], pos: tuple[int, ...], is_diff: bool) -> Cell:
        value = source[pos].item()
        signed = diff[pos].item()  # candidate - reference, with its sign (complex: as is)
        magnitude = float(abs_diff[pos])
        reference = _scalar(a[pos].item())
        rel = magnitude / abs(reference) if reference != 0 and math.isfinite(reference) else math.inf
        index = window.index_of(pos)
        out = bool(outside[pos])
        title = (
            f"[{', '.join(map(str, index))}] value {_text(value)}; candidate − reference {_text(signed)}; "
            f"|diff| / |reference| {_text(rel) if magnitude else '0'}; {'outside' if out else 'within'} tolerance"
        )
        background = _background(float(np.real(value)), diff_scale if is_diff else value_scale)
        return Cell(_text(value), title, f"{background} {_border(magnitude, out, diff_scale)}", out, pos == max_pos)

    grids: list[Grid] = []
    sources = (("Reference", a, False), ("Candidate", b, False), ("Difference (candidate - reference)", diff, True))
    for label, source, diff_bg in sources:
        col_labels: list[str] = []
        if two_d:
            rows = [[cell(source, (i, j), diff_bg) for j in range(a.shape[1])] for i in range(a.shape[0])]
            row_labels = [str(window.region[_free(window.request)[0]].start + i) for i in range(a.shape[0])]
            col_labels = [str(window.region[_free(window.request)[1]].start + j) for j in range(a.shape[1])]
        else:
            flat = [cell(source, pos, diff_bg) for pos in positions]
            rows = [flat[i : i + PER_ROW_1D] for i in range(0, len(flat), PER_ROW_1D)]
            start = window.region[_free(window.request)[0]].start if a.ndim else 0
            row_labels = [str(start + i) for i in range(0, len(flat), PER_ROW_1D)]
        grids.append(Grid(label, rows, row_labels, col_labels))
    return InspectorView(grids, _caption(window), window.index_of(max_pos) if max_pos is not None else None)


def _free(request: SliceRequest) -> list[int]:
    return [d for d, v in enumerate(request.index) if v is None]


def _caption(window: Window) -> str:
    parts = [
        f"{region.start}:{region.stop}" if fixed is None else str(fixed)
        for region, fixed in zip(window.region, window.request.index, strict=True)
    ]
    return f"[{', '.join(parts)}]"


def build_raw_grid(label: str, values: NDArray[Any], origin: tuple[int, ...], free: list[int]) -> Grid:
    """One run's own values (manual mode: no alignment, no difference), coloured by sign and magnitude."""
    flat_values = np.abs(values.astype(np.complex128 if values.dtype.kind == "c" else np.float64)).ravel()
    finite = flat_values[np.isfinite(flat_values)]
    scale = float(finite.max()) if finite.size else 0.0

    def cell(pos: tuple[int, ...]) -> Cell:
        value = values[pos].item()
        index = list(origin)
        for k, dim in enumerate(free):
            index[dim] += pos[k]
        title = f"[{', '.join(map(str, index))}] value {_text(value)}"
        return Cell(_text(value), title, f"{_background(float(np.real(value)), scale)} bd-raw", False, False)

    col_labels: list[str] = []
    if values.ndim == 2:
        rows = [[cell((i, j)) for j in range(values.shape[1])] for i in range(values.shape[0])]
        labels = [str(origin[free[0]] + i) for i in range(values.shape[0])]
        col_labels = [str(origin[free[1]] + j) for j in range(values.shape[1])]
    else:
        positions = list(np.ndindex(*values.shape)) if values.ndim else [()]
        flat = [cell(pos) for pos in positions]
        rows = [flat[i : i + PER_ROW_1D] for i in range(0, len(flat), PER_ROW_1D)]
        start = origin[free[0]] if free else 0
        labels = [str(start + i) for i in range(0, len(flat), PER_ROW_1D)]
    return Grid(label, rows, labels, col_labels)
