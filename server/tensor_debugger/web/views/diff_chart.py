"""The compare-sessions page's chart: both sessions' error (max |diff|) through the model on one log axis, A and B
overlaid, one point per pair name in the diff's order (A's execution order, then those only in B). Drawn on the
server as SVG with its axes, ticks and legend; web/static/diff_chart.js draws a chart with a crosshair read-out and
keys from the same data (`series`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tensor_debugger.compare.reports.session_diff import PairChange, SessionDiff
from tensor_debugger.engine.metrics import Number, parse_number
from tensor_debugger.web.views.session_chart import LogAxis, Tick, chart_json, svg_path

PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 48.0, 12.0, 10.0, 36.0


@dataclass(frozen=True)
class DiffChart:
    width: int
    height: int
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    floor_y: float
    plot_bottom: float
    a_path: str
    b_path: str
    series: dict[str, list[Any]]  # for the script: key, layer, pair ids, errors, statuses and changes


def _value(number: Number | None) -> float | None:
    value = parse_number(number) if number is not None else None
    return None if value is None else float(value)


def build_diff_chart(diff: SessionDiff, width: int = 1100, height: int = 260) -> DiffChart | None:
    """The chart of every pair name of `diff`; None when neither session has an error to draw."""
    rows: list[PairChange] = diff.pairs
    a = [_value(r.error_a) for r in rows]
    b = [_value(r.error_b) for r in rows]
    if all(v is None for v in a + b):
        return None
    plot_bottom = height - PAD_BOTTOM
    axis = LogAxis.over(a + b, PAD_TOP, plot_bottom)
    y_of, floor_y, y_ticks = axis.y, axis.floor_y, axis.ticks()
    step = (width - PAD_LEFT - PAD_RIGHT) / max(len(rows) - 1, 1)
    xs = [PAD_LEFT + i * step for i in range(len(rows))]
    x_every = next(k for k in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10**9) if k * step >= 44)
    x_ticks = [Tick(round(xs[i], 1), str(i)) for i in range(0, len(rows), x_every)]
    return DiffChart(
        width,
        height,
        y_ticks,
        x_ticks,
        floor_y,
        plot_bottom,
        svg_path(zip(xs, [y_of(v) for v in a], strict=True)),
        svg_path(zip(xs, [y_of(v) for v in b], strict=True)),
        {
            "key": [r.key for r in rows],
            "layer": [r.layer for r in rows],
            "pair_a": [r.pair_a for r in rows],
            "pair_b": [r.pair_b for r in rows],
            "a": [chart_json(v) for v in a],
            "b": [chart_json(v) for v in b],
            "status_a": [r.status_a for r in rows],
            "status_b": [r.status_b for r in rows],
            "change": [str(r.change) for r in rows],
        },
    )
