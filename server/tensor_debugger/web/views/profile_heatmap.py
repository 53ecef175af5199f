"""The session's error profiles as heatmaps (pairs × index of a chosen aligned dimension), drawn as SVG on the
server: a heatmap per group of rows profiling the same named dimension of the same size (the session's `dims`
name it; "dimension d" where they do not), a row per pair in execution order, a cell per index. A group wider than
MAX_COLUMNS pools its own indices, each column the largest of `step` of them, and says so in its header and in each
cell's label: a 1,000-wide logits row pools 8 indices a column without making a 64-wide row beside it do the same.
Coloured by log10 of the largest |difference| on one scale for every group, with a legend; each cell opens its
pair's page with the inspector on that index and the pair's profile along the dimension."""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlencode

import msgspec

from tensor_debugger.compare.reports.session_profiles import ProfileRow, SessionProfiles
from tensor_debugger.compare.reports.slices import parse_slice_request
from tensor_debugger.web.views.pair_page import centred_window, default_window

MAX_COLUMNS = 128
CELL_W, CELL_H, LABEL_W = 6.0, 14.0, 150.0
# viridis, sampled: dark for the smallest decade, yellow for the largest
STOPS = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))
ZERO, NAN = "#eeeeee", "#d62728"


class ProfileCell(msgspec.Struct, frozen=True):
    """A cell of a group's SVG: its place, colour, the pair page it opens and what it says."""

    x: float
    y: float
    fill: str
    url: str
    label: str


class RowLabel(msgspec.Struct, frozen=True):
    """A row's pair, by name: shortened from the left to fit beside the cells, and in full."""

    y: float
    text: str
    full: str


class ColumnTick(msgspec.Struct, frozen=True):
    """An index on a group's axis, at the middle of its column."""

    x: float
    text: int


class ProfileGroup(msgspec.Struct, frozen=True):
    """One heatmap: the rows that profile the same named dimension of the same size (see `_group`)."""

    name: str
    size: int  # indices along the dimension
    rows: int
    header: str
    ticks: list[ColumnTick]
    axis_y: float
    cells: list[ProfileCell]
    labels: list[RowLabel]
    step: int  # indices a column
    width: float
    height: float
    cell_w: float
    cell_h: float


class LegendEntry(msgspec.Struct, frozen=True):
    """A decade of the colour scale."""

    decade: int
    fill: str


class ProfileHeatmap(msgspec.Struct, frozen=True):
    """The session profiles page's heatmaps and the legend of their common scale (1e{low} to 1e{high})."""

    groups: list[ProfileGroup]
    step: int  # the most indices a column of any group
    low: int
    high: int
    legend: list[LegendEntry]
    zero: str  # the colours of 0 and NaN
    nan: str


def colour(t: float) -> str:
    """The scale's colour at t in [0, 1]."""
    t = min(max(t, 0.0), 1.0) * (len(STOPS) - 1)
    k = min(int(t), len(STOPS) - 2)
    f = t - k
    r, g, b = (round(x + (y - x) * f) for x, y in zip(STOPS[k], STOPS[k + 1], strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def _cell_value(values: list[Any]) -> float | None:
    """The largest |difference| of a column's indices: NaN when a NaN met one, None when there is none."""
    if any(v == "nan" for v in values):
        return math.nan
    numbers = [float(v) for v in values if isinstance(v, int | float)]
    return max(numbers) if numbers else None


def _cell_url(row: ProfileRow, dim: int, index: int) -> str:
    shape = tuple(row.aligned_shape)
    first = default_window(shape)
    request = parse_slice_request(shape, first["index"], first["start"], first["count"])
    point = tuple(index if d == dim else 0 for d in range(len(shape)))
    return f"/pairs/{row.pair_id}?{urlencode({**centred_window(shape, point, request), 'profile': dim})}#inspector"


def _name(row: ProfileRow) -> str:
    names = row.dim_names or []
    return names[row.dim] if row.dim < len(names) else f"dimension {row.dim}"


def heatmap(profiles: SessionProfiles) -> ProfileHeatmap:
    """The groups' SVGs (cells: x, y, fill, link, label; row labels; ticks; size; step), and the legend's decades."""
    present = [
        math.log10(float(v))
        for row in profiles.rows
        for v in row.max_abs_diff
        if isinstance(v, int | float) and math.isfinite(v) and v > 0
    ]
    # decades with a little slack, so that float32's 0.0100002 does not open a decade of its own
    low, high = (math.floor(min(present) + 0.01), math.ceil(max(present) - 0.01)) if present else (0, 1)
    high = max(high, low + 1)
    several = len({p.candidate for p in profiles.rows}) > 1
    grouped: dict[tuple[str, int], list[ProfileRow]] = {}
    for row in profiles.rows:  # in execution order, groups in the order they first come
        grouped.setdefault((_name(row), len(row.max_abs_diff)), []).append(row)
    groups = [_group(name, size, rows, low, high, several) for (name, size), rows in grouped.items()]
    return ProfileHeatmap(
        groups=groups,
        step=max((g.step for g in groups), default=1),
        low=low,
        high=high,
        legend=[LegendEntry(decade=d, fill=colour((d - low) / (high - low))) for d in range(low, high + 1)],
        zero=ZERO,
        nan=NAN,
    )


def _group(name: str, size: int, rows: list[ProfileRow], low: int, high: int, several: bool) -> ProfileGroup:
    step = max(1, math.ceil(size / MAX_COLUMNS))
    cells: list[ProfileCell] = []
    labels: list[RowLabel] = []
    top = 0.0
    for r, row in enumerate(rows):
        y = top + r * CELL_H
        who = f"{row.name} ({row.candidate})" if several else row.name
        labels.append(RowLabel(y=y + CELL_H * 0.75, text=who if len(who) <= 24 else "…" + who[-23:], full=who))
        for c, start in enumerate(range(0, len(row.max_abs_diff), step)):
            part = row.max_abs_diff[start : start + step]
            value = _cell_value(part)
            if value is None:
                continue
            if math.isnan(value):
                fill, said = NAN, "NaN"
            elif value <= 0:
                fill, said = ZERO, "0"
            else:
                fill, said = colour((math.log10(value) - low) / (high - low)), f"{value:.3g}"
            worst = start + max(range(len(part)), key=lambda i: float(part[i]) if part[i] != "nan" else math.inf)
            span = f"indices {start}-{start + len(part) - 1}: max of {len(part)}" if len(part) > 1 else f"index {start}"
            cells.append(
                ProfileCell(
                    x=LABEL_W + c * CELL_W,
                    y=y,
                    fill=fill,
                    url=_cell_url(row, row.dim, worst),
                    label=f"{who}, {span}: max |diff| {said}",
                )
            )
    columns = math.ceil(size / step) if size else 0
    every = next(n * 10**k for k in range(12) for n in (1, 2, 5) if n * 10**k * 8 >= size)
    ticks = [ColumnTick(x=LABEL_W + (i // step + 0.5) * CELL_W, text=i) for i in range(0, size, every)]
    return ProfileGroup(
        name=name,
        size=size,
        rows=len(rows),
        header=(
            f"{name}, {size} indices: each column the max of {step} (indices 0-{step - 1}, {step}-{2 * step - 1}, …)"
            if step > 1
            else f"{name}, {size} indices: a column each"
        ),
        ticks=ticks,
        axis_y=top + len(rows) * CELL_H + 11,
        cells=cells,
        labels=labels,
        step=step,
        width=LABEL_W + max(columns, 1) * CELL_W,
        height=top + max(len(rows), 1) * CELL_H + 14,  # and the index axis
        cell_w=CELL_W,
        cell_h=CELL_H,
    )
