"""The session page's chart of error through the model, drawn on the server as SVG: max |diff| and 1 - cosine
of every pair in execution order on a log scale, exact pairs on a floor line below it, the first divergence
marked and the layers along the x axis. The page's script draws a zoomable chart from the same data (`series`);
this one is what a browser without scripts shows."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tensor_debugger.compare.reports.pair_report import PairReport
from tensor_debugger.compare.reports.pair_reports import UnmatchedReport
from tensor_debugger.engine.metrics import parse_number

PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 44.0, 12.0, 10.0, 34.0
FLOOR_GAP = 14.0  # px between the lowest decade and the floor line where exact (zero) values are drawn


@dataclass(frozen=True)
class Tick:
    at: float
    label: str


@dataclass(frozen=True)
class LogAxis:
    """A chart's log-scale y axis over the values it draws: decades `low` to `high` from `top` down to `FLOOR_GAP`
    above the floor line (where exact, zero values are drawn); NaN and Inf at the top, as bad as it gets."""

    low: int
    high: int
    top: float
    floor_y: float

    @classmethod
    def over(cls, values: Iterable[float | None], top: float, plot_bottom: float) -> LogAxis:
        positive = [v for v in values if v is not None and math.isfinite(v) and v > 0]
        low = math.floor(math.log10(min(positive))) if positive else -8
        high = max(math.ceil(math.log10(max(positive))) if positive else 0, low + 1)
        return cls(low, high, top, plot_bottom - 2)

    def y(self, value: float | None) -> float | None:
        if value is None:
            return None
        if math.isnan(value) or math.isinf(value):
            return self.top
        if value <= 0:
            return self.floor_y
        span_bottom = self.floor_y - FLOOR_GAP
        return self.top + (self.high - math.log10(value)) / (self.high - self.low) * (span_bottom - self.top)

    def ticks(self) -> list[Tick]:
        """A tick per decade (every few where there are many) and "0" on the floor line."""
        every = max(1, math.ceil((self.high - self.low) / 6))
        ticks = [Tick(round(self.y(10.0**k) or 0, 1), f"1e{k}") for k in range(self.low, self.high + 1, every)]
        return [*ticks, Tick(self.floor_y, "0")]


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    floor_y: float
    plot_bottom: float
    diff_path: str
    cos_path: str
    failing_path: str  # a short tick under each failing pair, along the x axis
    first_x: float | None  # the first divergence
    first_label: str
    series: dict[str, list[Any]]  # for the script: position, layer, name, id, diff, 1-cos, status; gaps
    gaps: list[GapMark] = field(default_factory=list)  # reference tensors never compared, where they fall


@dataclass(frozen=True)
class GapMark:
    """A reference tensor with no partner on the chart: between the pairs it falls between (`at`: a pair's index
    less a half), a dashed line."""

    x: float
    at: float
    name: str


def _value(pair: PairReport, key: str) -> float | None:
    if pair.stats is None:
        return None
    value = parse_number(getattr(pair.stats, key))
    return None if value is None else float(value)


def build_chart(
    pairs: list[PairReport],
    first_pair: int | None,
    width: int = 1100,
    height: int = 240,
    unmatched: Sequence[UnmatchedReport] = (),
) -> Chart | None:
    """The chart of `pairs` (in execution order); `first_pair`: the first divergence's pair id; `unmatched`: reference
    tensors with no partner (the user did not allow), each marked where it falls (its `before_position`)."""
    if not pairs:
        return None
    diffs = [_value(p, "max_abs_diff") for p in pairs]
    coss = [_value(p, "cosine") for p in pairs]
    ones = [None if c is None else (math.nan if math.isnan(c) else max(1 - c, 0.0)) for c in coss]
    plot_bottom = height - PAD_BOTTOM
    axis = LogAxis.over(diffs + ones, PAD_TOP, plot_bottom)
    y_of, floor_y, y_ticks = axis.y, axis.floor_y, axis.ticks()

    step = (width - PAD_LEFT - PAD_RIGHT) / max(len(pairs) - 1, 1)
    xs = [PAD_LEFT + i * step for i in range(len(pairs))]
    first_x = next((x for x, p in zip(xs, pairs, strict=True) if p.id == first_pair), None)
    first = next((p for p in pairs if p.id == first_pair), None)
    index = {(p.b.run_id, p.position): i for i, p in enumerate(pairs)}
    last: dict[int, int] = {}
    for i, p in enumerate(pairs):
        last[p.b.run_id] = max(last.get(p.b.run_id, i), i)
    gaps = []
    for u in unmatched:
        if u.before_position is None or u.allowed:
            continue
        at_pair = index.get((u.against_run_id, u.before_position))
        at = (
            at_pair - 0.5 if at_pair is not None else last[u.against_run_id] + 0.5 if u.against_run_id in last else None
        )
        if at is not None:
            gaps.append(GapMark(round(PAD_LEFT + max(at, 0) * step, 1), at, u.name))
    return Chart(
        width,
        height,
        y_ticks,
        _layer_ticks(pairs, xs),
        floor_y,
        plot_bottom,
        svg_path(zip(xs, [y_of(v) for v in diffs], strict=True)),
        svg_path(zip(xs, [y_of(v) for v in ones], strict=True)),
        " ".join(
            f"M{x:.1f},{plot_bottom:.1f}v5" for x, p in zip(xs, pairs, strict=True) if p.status in ("fail", "error")
        ),
        None if first_x is None else round(first_x, 1),
        f"first divergence: {first.name}" if first else "",
        {
            "position": [p.position for p in pairs],
            "layer": [p.layer for p in pairs],
            "name": [p.name for p in pairs],
            "id": [p.id for p in pairs],
            "diff": [chart_json(v) for v in diffs],
            "one_minus_cos": [chart_json(v) for v in ones],
            "status": [str(p.status) for p in pairs],
            "gaps": [{"at": g.at, "name": g.name} for g in gaps],
        },
        gaps,
    )


def chart_json(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value if value is None else float(f"{value:.4g}")  # what the chart's labels show: smaller JSON
    return "nan" if math.isnan(value) else "inf"


def _layer_ticks(pairs: list[PairReport], xs: list[float]) -> list[Tick]:
    """A tick where each layer starts, thinned to keep them apart; numbered positions where no pair has a layer."""
    starts: list[tuple[float, str]] = []
    last: int | None = None
    for x, p in zip(xs, pairs, strict=True):
        if p.layer is not None and p.layer != last:
            starts.append((x, str(p.layer)))
            last = p.layer
    if not starts:
        starts = [(x, str(p.position)) for x, p in zip(xs, pairs, strict=True)]
    kept: list[Tick] = []
    for x, label in starts:  # at least 44 px apart, so labels never overlap
        if not kept or x - kept[-1].at >= 44:
            kept.append(Tick(round(x, 1), label))
    return kept


def svg_path(points: Iterable[tuple[float, float | None]]) -> str:
    """An SVG path through (x, y) points, lifting the pen over those without a y (a gap in the line)."""
    parts: list[str] = []
    pen_down = False
    for x, y in points:
        if y is None:
            pen_down = False
            continue
        parts.append(f"{'L' if pen_down else 'M'}{x:.1f},{y:.1f}")
        pen_down = True
    return " ".join(parts)
