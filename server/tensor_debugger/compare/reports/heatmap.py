"""A heatmap of the difference over a 2-D slice of a pair, max-pooled down to at most ROWS x COLS cells, so no
single spike can hide in an average: each cell holds the largest |difference| of the elements it covers, with
the sign of that difference (candidate - reference). Drawn in diverging colours (blue where the candidate is
lower, red where higher, white where equal, black for NaN) on a log scale of |difference|, with the slice's row
and column indices on its axes and a colour scale. The slice is read block by block through the lazy views; the
differences are the statistics' own (engine/elementwise.py: equal infinities differ by zero, integers exactly)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.compare.reports.formatting import format_number
from tensor_debugger.engine.elementwise import CellMaxima
from tensor_debugger.engine.views import View

ROWS, COLS = 64, 96
BLOCK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class Heatmap:
    dims: tuple[int, int]  # the two aligned dimensions shown
    fixed: tuple[int | None, ...]  # the index of every other dimension (None on the two shown)
    shape: tuple[int, int]  # of the slice
    cells: NDArray[Any]  # max |diff| per cell; NaN where any element was NaN
    signs: NDArray[Any]  # the sign (-1, 0, 1) of the difference whose |diff| is the cell's
    row_edges: list[int]  # slice rows each cell row starts at (len = cells rows + 1)
    col_edges: list[int]


def cell_edges(size: int, cells: int) -> list[int]:
    """Where each of at most `cells` cells along an axis of `size` starts (and, last, `size`): nearly equal cells."""
    n = min(size, cells)
    return [round(i * size / n) for i in range(n + 1)]


def build_heatmap(a: View, b: View, fixed: tuple[int | None, ...]) -> Heatmap:
    """`fixed` holds an index for every dimension but two (None there): those two are the slice."""
    dims = tuple(d for d, v in enumerate(fixed) if v is None)
    if len(dims) != 2:
        raise ValueError("a heatmap needs exactly two free dimensions")
    rows_dim, cols_dim = dims
    height, width = a.shape[rows_dim], a.shape[cols_dim]
    row_edges, col_edges = cell_edges(height, ROWS), cell_edges(width, COLS)
    maxima = CellMaxima(row_edges, col_edges)
    step = max(1, BLOCK_ELEMENTS // max(width, 1))
    for start in range(0, height, step):
        stop = min(start + step, height)
        region = tuple(
            slice(start, stop) if d == rows_dim else slice(0, width) if d == cols_dim else slice(v or 0, (v or 0) + 1)
            for d, v in enumerate(fixed)
        )
        maxima.add(a.read(region).reshape(stop - start, width), b.read(region).reshape(stop - start, width), start)
    cells, signs = maxima.result()
    return Heatmap((rows_dim, cols_dim), fixed, (height, width), cells, signs, row_edges, col_edges)


NEGATIVE, POSITIVE = ((222, 235, 247), (8, 69, 148)), ((254, 224, 210), (165, 15, 21))  # light to dark
MARGIN_LEFT, MARGIN_TOP, LEGEND = 40, 28, 70  # px: row indices, column indices, the colour scale on the right


def colour(value: float, low: float, high: float, sign: float = 1.0) -> str:
    """White for zero; light to dark on a log scale of |value| between `low` and `high`, red where the candidate
    is higher, blue where lower; NaN black."""
    if math.isnan(value):
        return "#111"
    if value <= 0 or high <= 0:
        return "#fff"
    span = math.log10(high) - math.log10(low) if low > 0 else 0.0
    t = min(1.0, max(0.0, (math.log10(value) - math.log10(low)) / span)) if span > 0 else 1.0
    start, end = NEGATIVE if sign < 0 else POSITIVE
    r, g, b = (round(s + (e - s) * t) for s, e in zip(start, end, strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def _ticks(edges: list[int], every_px: int, cell: int) -> list[tuple[int, int]]:
    """(cell, slice index) of the cells to label: about one every `every_px`."""
    step = max(1, math.ceil(every_px / cell))
    return [(i, edges[i]) for i in range(0, len(edges) - 1, step)]


def heatmap_svg(heatmap: Heatmap, cell: int = 8) -> str:
    """The heatmap as SVG, with the slice's indices on both axes and a colour scale. Each cell's title says its
    slice range and its largest difference; `data-index` is the aligned index of the cell's first element (a
    click on the page opens the inspector there)."""
    values = heatmap.cells[np.isfinite(heatmap.cells) & (heatmap.cells > 0)]
    high = float(values.max()) if values.size else 0.0
    low = max(float(values.min()) if values.size else 0.0, high * 1e-6)
    rows, cols = heatmap.cells.shape
    cell = max(cell, min(24, 640 // max(cols, 1)))  # small slices get bigger cells
    width, height = MARGIN_LEFT + cols * cell + LEGEND, MARGIN_TOP + rows * cell + 4
    row_dim, col_dim = heatmap.dims
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {max(height, 150)}" '
        f'width="{width}" height="{max(height, 150)}" role="img" font-family="sans-serif" font-size="10" '
        f'aria-label="largest difference per cell, dimension {row_dim} down, dimension {col_dim} across">',
        f'<text x="{MARGIN_LEFT}" y="10" fill="#444">dim {col_dim} →</text>',
        f'<text x="2" y="{MARGIN_TOP - 4}" fill="#444">dim {row_dim} ↓</text>',
    ]
    for c, index in _ticks(heatmap.col_edges, 40, cell):
        parts.append(f'<text x="{MARGIN_LEFT + c * cell}" y="{MARGIN_TOP - 4}" fill="#444">{index}</text>')
    for r, index in _ticks(heatmap.row_edges, 16, cell):
        y = MARGIN_TOP + r * cell + min(cell, 10)
        parts.append(f'<text x="{MARGIN_LEFT - 4}" y="{y}" fill="#444" text-anchor="end">{index}</text>')
    for r in range(rows):
        for c in range(cols):
            v = float(heatmap.cells[r, c])
            sign = float(heatmap.signs[r, c])
            shown = "NaN" if math.isnan(v) else format_number(v * (sign or 1))
            title = (
                f"rows {heatmap.row_edges[r]}-{heatmap.row_edges[r + 1] - 1}, cols {heatmap.col_edges[c]}-"
                f"{heatmap.col_edges[c + 1] - 1}: largest difference (candidate − reference) {shown}"
            )
            spot = [
                heatmap.row_edges[r] if d == row_dim else heatmap.col_edges[c] if d == col_dim else v0 or 0
                for d, v0 in enumerate(heatmap.fixed)
            ]
            parts.append(
                f'<rect x="{MARGIN_LEFT + c * cell}" y="{MARGIN_TOP + r * cell}" width="{cell}" height="{cell}" '
                f'fill="{colour(v, low, high, sign)}" data-index="{",".join(map(str, spot))}">'
                f"<title>{title}</title></rect>"
            )
    parts.append(_legend(MARGIN_LEFT + cols * cell + 14, MARGIN_TOP, low, high))
    parts.append("</svg>")
    return "".join(parts)


def _legend(x: int, y: int, low: float, high: float) -> str:
    """The colour scale: + high at the top through 0 to - high at the bottom, in 10 steps a side."""
    steps, h = 10, 5
    parts = []
    for i in range(steps):  # from the largest positive down to the smallest
        t = low * (high / low) ** ((steps - 1 - i) / (steps - 1)) if high > 0 and low > 0 else 0.0
        parts.append(f'<rect x="{x}" y="{y + i * h}" width="12" height="{h}" fill="{colour(t, low, high, 1)}"/>')
    parts.append(f'<rect x="{x}" y="{y + steps * h}" width="12" height="{h}" fill="#fff" stroke="#ccc"/>')
    for i in range(steps):
        t = low * (high / low) ** (i / (steps - 1)) if high > 0 and low > 0 else 0.0
        yy = y + (steps + 1 + i) * h
        parts.append(f'<rect x="{x}" y="{yy}" width="12" height="{h}" fill="{colour(t, low, high, -1)}"/>')
    bottom = y + (2 * steps + 1) * h
    return "".join(parts) + (
        f'<text x="{x + 15}" y="{y + 8}" fill="#444">+{format_number(high)}</text>'
        f'<text x="{x + 15}" y="{y + steps * h + 5}" fill="#444">0</text>'
        f'<text x="{x + 15}" y="{bottom}" fill="#444">−{format_number(high)}</text>'
    )
