"""The pair page's heatmap as one image and a little JSON, instead of an SVG element per cell: a PNG of a pixel
per cell (the page scales it up, pixelated), the same colours as compare/heatmap.py's colour() (white for 0, light
to dark on a log scale of |difference|, red where the candidate is higher, blue where lower, black for NaN), and
each cell's value for the page's read-out. Where the inspector's window lies in the slice is worked out here too,
for the page to mark it."""

from __future__ import annotations

import bisect
import math
from typing import Any

import msgspec
import numpy as np
from numpy.typing import NDArray

from tensor_debugger.compare.reports.formatting import format_number
from tensor_debugger.compare.reports.heatmap import COLS, NEGATIVE, POSITIVE, ROWS, Heatmap, cell_edges
from tensor_debugger.compare.reports.slices import SliceRequest
from tensor_debugger.engine.alignment import Shape
from tensor_debugger.web.views.axis_ticks import IndexTick


def scale_of(heatmap: Heatmap) -> tuple[float, float]:
    """(low, high) of the colour scale: the largest |difference| and a millionth of it, or the smallest above 0."""
    values = heatmap.cells[np.isfinite(heatmap.cells) & (heatmap.cells > 0)]
    high = float(values.max()) if values.size else 0.0
    low = max(float(values.min()) if values.size else 0.0, high * 1e-6)
    return low, high


def heatmap_pixels(heatmap: Heatmap) -> NDArray[Any]:
    """rows x cols x 3 uint8: each cell's colour, computed for all cells at once."""
    cells = heatmap.cells
    low, high = scale_of(heatmap)
    nan = np.isnan(cells)
    values = np.where(nan, 0.0, cells)
    span = math.log10(high) - math.log10(low) if low > 0 and high > 0 else 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (np.log10(np.maximum(values, low if low > 0 else 1.0)) - (math.log10(low) if low > 0 else 0.0)) / span
    t = np.clip(np.nan_to_num(t, nan=1.0), 0.0, 1.0) if span > 0 else np.ones_like(values)
    negative = heatmap.signs < 0
    start = np.where(negative[..., None], np.array(NEGATIVE[0], float), np.array(POSITIVE[0], float))
    end = np.where(negative[..., None], np.array(NEGATIVE[1], float), np.array(POSITIVE[1], float))
    rgb: NDArray[Any] = np.rint(start + (end - start) * t[..., None])
    rgb[(values <= 0) | (high <= 0)] = 255.0
    rgb[nan] = 17.0  # "#111"
    return rgb.astype(np.uint8)


class HeatmapValues(msgspec.Struct, frozen=True):
    """The heatmap's cells for the page's script (GET /pairs/{id}/heatmap.json): each cell's largest signed
    difference as text (rows of strings), the cells' edges along the two dimensions, and the colour scale's ends."""

    dims: list[int]
    row_edges: list[int]
    col_edges: list[int]
    values: list[list[str]]
    low: str
    high: str


class HeatmapWindow(msgspec.Struct, frozen=True):
    """The inspector's window on the heatmap: its box in percent of the image, and the rows and columns it covers."""

    top: float
    height: float
    left: float
    width: float
    text: str


class HeatmapFrame(msgspec.Struct, frozen=True):
    """What the page draws around the heatmap's image before it loads (see `heatmap_frame`)."""

    pixels: tuple[int, int]  # the image's size on the page (rows, columns)
    dims: tuple[int, int]  # the aligned dimensions down and across
    shape: tuple[int, int]  # their sizes
    cells: tuple[int, int]  # cells down and across
    row_edges: list[int]
    col_edges: list[int]
    row_ticks: list[IndexTick]
    col_ticks: list[IndexTick]
    window: HeatmapWindow | None  # None where the window is in another slice


def heatmap_values(heatmap: Heatmap) -> HeatmapValues:
    """Each cell's largest signed difference as text (rows of strings), the edges and the scale, for the page."""
    low, high = scale_of(heatmap)
    signed = [
        [
            "NaN" if math.isnan(float(v)) else format_number(float(v) * (float(s) or 1.0))
            for v, s in zip(row, signs, strict=True)
        ]
        for row, signs in zip(heatmap.cells, heatmap.signs, strict=True)
    ]
    return HeatmapValues(
        dims=list(heatmap.dims),
        row_edges=heatmap.row_edges,
        col_edges=heatmap.col_edges,
        values=signed,
        low=format_number(low),
        high=format_number(high),
    )


def heatmap_frame(shape: Shape, spec: tuple[int | None, ...], request: SliceRequest) -> HeatmapFrame:
    """What the page draws around the image before it loads: the slice's size and cell edges (the image's pixels),
    its axes' ticks, and the inspector's window inside it as fractions of the image (None where it is elsewhere)."""
    rows_dim, cols_dim = (d for d, v in enumerate(spec) if v is None)
    height, width = shape[rows_dim], shape[cols_dim]
    row_edges, col_edges = cell_edges(height, ROWS), cell_edges(width, COLS)
    free = [d for d, v in enumerate(request.index) if v is None]
    spans: dict[int, tuple[int, int]] = {}
    inside = True
    for dim, fixed in enumerate(request.index):
        if fixed is None:
            w = free.index(dim)
            spans[dim] = (request.start[w], min(request.start[w] + request.count[w], shape[dim]))
        else:
            spans[dim] = (fixed, fixed + 1)
        wanted = spec[dim]
        if wanted is not None and not spans[dim][0] <= wanted < spans[dim][1]:
            inside = False
    window = None
    if inside:
        (r0, r1), (c0, c1) = spans[rows_dim], spans[cols_dim]
        top, bottom = _cell_of(row_edges, r0), _cell_of(row_edges, r1 - 1) + 1
        left, right = _cell_of(col_edges, c0), _cell_of(col_edges, c1 - 1) + 1
        rows_n, cols_n = len(row_edges) - 1, len(col_edges) - 1
        window = HeatmapWindow(
            top=100 * top / rows_n,
            height=100 * (bottom - top) / rows_n,
            left=100 * left / cols_n,
            width=100 * (right - left) / cols_n,
            text=f"rows {r0}–{r1 - 1}, columns {c0}–{c1 - 1}",
        )
    rows_n, cols_n = len(row_edges) - 1, len(col_edges) - 1
    cell = max(6, min(24, 720 // max(cols_n, 1)))  # px a cell: small slices get bigger cells
    return HeatmapFrame(
        pixels=(rows_n * cell, cols_n * cell),
        dims=(rows_dim, cols_dim),
        shape=(height, width),
        cells=(len(row_edges) - 1, len(col_edges) - 1),
        row_edges=row_edges,
        col_edges=col_edges,
        row_ticks=_ticks(row_edges),
        col_ticks=_ticks(col_edges),
        window=window,
    )


def _cell_of(edges: list[int], index: int) -> int:
    """The cell holding `index`."""
    return max(0, bisect.bisect_right(edges, index) - 1)


def _ticks(edges: list[int], most: int = 6) -> list[IndexTick]:
    """Round indices along an axis (0, then steps of 1, 2 or 5 times a power of ten; at most `most` + 1 of them,
    the last index too where it has room), each at the middle of its cell in percent of the image."""
    size, cells = edges[-1], len(edges) - 1
    raw = max(size - 1, 1) / most
    power = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    step = max(1, int(next(m * power for m in (1, 2, 5, 10) if m * power >= raw)))
    indices = list(range(0, size, step))
    if size - 1 - indices[-1] >= step / 2:
        indices.append(size - 1)
    return [IndexTick(at=100 * (_cell_of(edges, i) + 0.5) / cells, index=i) for i in indices]
