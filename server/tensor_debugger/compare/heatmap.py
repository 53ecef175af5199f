"""A heatmap of |difference| over a 2-D slice of a pair, max-pooled down to at most ROWS x COLS cells, so no
single spike can hide in an average. The slice is read block by block through the lazy views."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tensor_debugger.engine.views import View

ROWS, COLS = 64, 96
BLOCK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class Heatmap:
    dims: tuple[int, int]  # the two aligned dimensions shown
    fixed: tuple[int | None, ...]  # the index of every other dimension (None on the two shown)
    shape: tuple[int, int]  # of the slice
    cells: np.ndarray  # max |diff| per cell; NaN where any element was NaN
    row_edges: list[int]  # slice rows each cell row starts at (len = cells rows + 1)
    col_edges: list[int]


def _edges(size: int, cells: int) -> list[int]:
    n = min(size, cells)
    return [round(i * size / n) for i in range(n + 1)]


def build_heatmap(a: View, b: View, fixed: tuple[int | None, ...]) -> Heatmap:
    """`fixed` holds an index for every dimension but two (None there): those two are the slice."""
    dims = tuple(d for d, v in enumerate(fixed) if v is None)
    if len(dims) != 2:
        raise ValueError("a heatmap needs exactly two free dimensions")
    rows_dim, cols_dim = dims
    height, width = a.shape[rows_dim], a.shape[cols_dim]
    row_edges, col_edges = _edges(height, ROWS), _edges(width, COLS)
    cells = np.zeros((len(row_edges) - 1, len(col_edges) - 1))
    nan_cells = np.zeros(cells.shape, dtype=bool)
    col_starts = np.asarray(col_edges[:-1])
    step = max(1, BLOCK_ELEMENTS // max(width, 1))
    for start in range(0, height, step):
        stop = min(start + step, height)
        region = tuple(
            slice(start, stop) if d == rows_dim else slice(0, width) if d == cols_dim else slice(v or 0, (v or 0) + 1)
            for d, v in enumerate(fixed)
        )
        block_a = a.read(region).reshape(stop - start, width)
        block_b = b.read(region).reshape(stop - start, width)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(
                block_b.astype(np.complex128 if block_b.dtype.kind == "c" else np.float64)
                - block_a.astype(np.complex128 if block_a.dtype.kind == "c" else np.float64)
            )
        nan = np.isnan(diff)
        diff = np.where(nan, 0.0, diff)
        for r in range(len(row_edges) - 1):
            lo, hi = max(row_edges[r], start), min(row_edges[r + 1], stop)
            if lo >= hi:
                continue
            part = diff[lo - start : hi - start]
            cells[r] = np.maximum(cells[r], np.maximum.reduceat(part.max(axis=0), col_starts))
            nan_cells[r] |= np.logical_or.reduceat(nan[lo - start : hi - start].any(axis=0), col_starts)
    cells[nan_cells] = math.nan
    return Heatmap((rows_dim, cols_dim), fixed, (height, width), cells, row_edges, col_edges)


def colour(value: float, low: float, high: float) -> str:
    """White for zero, then light orange to dark red on a log scale between `low` and `high`; NaN black."""
    if math.isnan(value):
        return "#111"
    if value <= 0 or high <= 0:
        return "#fff"
    span = max(math.log10(high) - math.log10(low), 1e-9)
    t = min(1.0, max(0.0, (math.log10(value) - math.log10(low)) / span))
    start, end = (253, 232, 200), (160, 20, 10)
    r, g, b = (round(s + (e - s) * t) for s, e in zip(start, end, strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap_svg(heatmap: Heatmap, cell: int = 8) -> str:
    """The heatmap as SVG; each cell's title says its slice range and max |diff|."""
    values = heatmap.cells[np.isfinite(heatmap.cells) & (heatmap.cells > 0)]
    high = float(values.max()) if values.size else 0.0
    low = max(float(values.min()) if values.size else 0.0, high * 1e-6)
    rows, cols = heatmap.cells.shape
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {cols * cell} {rows * cell}" '
        f'width="{cols * cell}" height="{rows * cell}" role="img" aria-label="max |difference| per cell">'
    ]
    for r in range(rows):
        for c in range(cols):
            v = float(heatmap.cells[r, c])
            title = (
                f"rows {heatmap.row_edges[r]}-{heatmap.row_edges[r + 1] - 1}, cols {heatmap.col_edges[c]}-"
                f"{heatmap.col_edges[c + 1] - 1}: max |diff| {'NaN' if math.isnan(v) else f'{v:.4g}'}"
            )
            parts.append(
                f'<rect x="{c * cell}" y="{r * cell}" width="{cell}" height="{cell}" '
                f'fill="{colour(v, low, high)}"><title>{title}</title></rect>'
            )
    parts.append("</svg>")
    return "".join(parts)
