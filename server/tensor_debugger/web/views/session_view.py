"""The session page's table: the pairs grouped, sorted and filtered as the URL asks, and the chart of error
through the model. Everything is computed here so the template only loops."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tensor_debugger.compare.pair_reports import PairReport, PairStatsSummary, SessionPairs, apply_order
from tensor_debugger.engine.metrics import parse_number
from tensor_debugger.engine.names import natural_key

GROUPS = ("layer", "name", "band", "none")
SORTS = ("order", "diff", "cosine", "name", "numel")
BANDS = ("Identical", "Within tolerance", "Failing", "Incomparable", "Error", "Not compared yet")
VERDICTS = ("all", "fail", "pass", "incomparable", "unmatched")


@dataclass(frozen=True)
class ViewParams:
    group: str = "layer"
    sort: str = "order"
    verdict: str = "all"
    q: str = ""

    @classmethod
    def parse(cls, group: str | None, sort: str | None, verdict: str | None, q: str | None) -> ViewParams:
        """Unknown values fall back to the defaults rather than failing the page."""
        return cls(
            group if group in GROUPS else "layer",
            sort if sort in SORTS else "order",
            verdict if verdict in VERDICTS else "all",
            (q or "").strip(),
        )


@dataclass
class Group:
    label: str
    rows: list[PairReport] = field(default_factory=list)

    @property
    def failing(self) -> int:
        return sum(1 for r in self.rows if r.status == "fail")


def _number(stats: PairStatsSummary | None, key: str) -> float:
    if not stats:
        return math.nan
    value = parse_number(getattr(stats, key))
    return float(value) if value is not None else math.nan


def build_groups(report: SessionPairs, params: ViewParams, order: list[str] | None) -> list[Group]:
    pairs = apply_order(report.pairs, order)
    if params.verdict not in ("all", "unmatched"):
        pairs = [p for p in pairs if p.status == params.verdict]
    if params.verdict == "unmatched":
        pairs = []
    if params.q:
        needle = params.q.lower()
        pairs = [p for p in pairs if needle in p.name.lower() or needle in p.b.name.lower()]
    if params.sort == "diff":
        pairs = sorted(pairs, key=lambda p: -_rank_value(_number(p.stats, "max_abs_diff")))
    elif params.sort == "cosine":
        pairs = sorted(pairs, key=lambda p: _rank_value(-_number(p.stats, "cosine")), reverse=True)
    elif params.sort == "name":
        pairs = sorted(pairs, key=lambda p: natural_key(p.name))
    elif params.sort == "numel":
        pairs = sorted(pairs, key=lambda p: -numel(p))
    if params.group == "none":
        return [Group("All pairs", pairs)] if pairs else []
    groups: dict[str, Group] = {}
    if params.group == "band":
        groups = {label: Group(label) for label in BANDS}
    for p in pairs:
        if params.group == "band":
            label = band(p)
        elif params.group == "layer":
            label = f"Layer {p.layer}" if p.layer is not None else "No layer"
        else:
            label = p.name.split(".")[0].split("/")[0].rsplit("_", 1)[0] or p.name
        groups.setdefault(label, Group(label)).rows.append(p)
    return [g for g in groups.values() if g.rows]


def numel(pair: PairReport) -> int:
    """The pair's size: elements compared, else the reference's element count."""
    return pair.stats.numel if pair.stats else math.prod(pair.a.shape)


def band(pair: PairReport) -> str:
    """The pair's similarity band: identical (no difference at all), within tolerance, failing; or why it has
    none yet."""
    if pair.status == "pass":
        identical = (
            pair.stats is not None
            and _number(pair.stats, "max_abs_diff") == 0
            and not pair.stats.nan_a
            and not pair.stats.nan_b
        )
        return "Identical" if identical else "Within tolerance"
    return {"fail": "Failing", "incomparable": "Incomparable", "error": "Error"}.get(pair.status, "Not compared yet")


def _rank_value(value: float) -> float:
    """NaN sorts as the worst value there is."""
    return math.inf if math.isnan(value) else value


@dataclass(frozen=True)
class ChartPoint:
    x: float
    y_diff: float | None
    y_cos: float | None
    failing: bool
    href: str
    title: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    points: list[ChartPoint]
    ticks: list[tuple[float, str]]  # (y, label) for powers of ten
    diff_path: str
    cos_path: str


def build_chart(pairs: list[PairReport], width: int = 1100, height: int = 220) -> Chart | None:
    """Max |diff| and 1 - cosine of every pair in execution order, on one log scale (1e-12 to 1e4)."""
    if not pairs:
        return None
    low, high, pad = -12.0, 4.0, 30.0

    def y_of(value: float) -> float | None:
        if math.isnan(value):
            return pad  # NaN is drawn at the top: as bad as it gets
        if value <= 0:
            return None
        clipped = min(max(math.log10(value), low), high)
        return pad + (high - clipped) / (high - low) * (height - 2 * pad)

    step = (width - 2 * pad) / max(len(pairs) - 1, 1)
    points = []
    for i, p in enumerate(pairs):
        diff = _number(p.stats, "max_abs_diff")
        cosine = _number(p.stats, "cosine")
        one_minus = 1 - cosine if not math.isnan(cosine) else math.nan
        points.append(
            ChartPoint(
                round(pad + i * step, 1),
                _round(y_of(diff)) if p.stats else None,
                _round(y_of(one_minus)) if p.stats else None,
                p.status == "fail",
                f"/pairs/{p.id}",
                f"{p.name}: {p.status}, max |diff| {p.stats.max_abs_diff if p.stats else '—'}",
            )
        )
    ticks = [
        (pad + (high - k) / (high - low) * (height - 2 * pad), f"1e{k}") for k in range(int(low), int(high) + 1, 4)
    ]
    return Chart(
        width,
        height,
        points,
        ticks,
        _path([(pt.x, pt.y_diff) for pt in points]),
        _path([(pt.x, pt.y_cos) for pt in points]),
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _path(points: list[tuple[float, float | None]]) -> str:
    parts: list[str] = []
    pen_down = False
    for x, y in points:
        if y is None:
            pen_down = False
            continue
        parts.append(f"{'L' if pen_down else 'M'}{x:.1f},{y:.1f}")
        pen_down = True
    return " ".join(parts)


@dataclass(frozen=True)
class CandidateSeries:
    label: str
    path: str  # max |diff| of its pairs along the rows
    points: list[ChartPoint]
    first_divergence: str | None  # the tensor's name


@dataclass(frozen=True)
class CandidateRow:
    name: str  # the reference tensor's
    layer: int | None
    cells: list[PairReport | None]  # one per candidate, None where it has no partner


@dataclass(frozen=True)
class Candidates:
    """Several candidates side by side: a row per reference tensor, a column per candidate, and the chart of
    max |diff| through the model with a series per candidate."""

    labels: list[str]
    rows: list[CandidateRow]
    series: list[CandidateSeries]
    width: int
    height: int
    ticks: list[tuple[float, str]]


def build_candidates(report: SessionPairs, width: int = 1100, height: int = 220) -> Candidates | None:
    """None unless the session has two candidates or more."""
    if len(report.candidates) < 2:
        return None
    column = {c.run_id: n for n, c in enumerate(report.candidates)}
    rows: dict[str, CandidateRow] = {}
    for p in report.pairs:
        row = rows.setdefault(p.a.name, CandidateRow(p.a.name, p.layer, [None] * len(column)))
        if p.b.run_id in column:
            row.cells[column[p.b.run_id]] = p
    low, high, pad = -12.0, 4.0, 30.0
    step = (width - 2 * pad) / max(len(rows) - 1, 1)
    series = []
    for n, candidate in enumerate(report.candidates):
        points = []
        for i, row in enumerate(rows.values()):
            pair = row.cells[n]
            if pair is None or pair.stats is None:
                continue
            diff = _number(pair.stats, "max_abs_diff")
            if diff <= 0:
                y = float(height - pad)  # no difference: drawn on the floor of the scale
            elif math.isnan(diff):
                y = pad
            else:
                y = pad + (high - min(max(math.log10(diff), low), high)) / (high - low) * (height - 2 * pad)
            points.append(
                ChartPoint(
                    round(pad + i * step, 1),
                    round(y, 1),
                    None,
                    pair.status == "fail",
                    f"/pairs/{pair.id}",
                    f"{candidate.label} · {pair.name}: {pair.status}, max |diff| {pair.stats.max_abs_diff}",
                )
            )
        first = candidate.first_divergence
        series.append(
            CandidateSeries(
                candidate.label, _path([(p.x, p.y_diff) for p in points]), points, first.name if first else None
            )
        )
    ticks = [
        (pad + (high - k) / (high - low) * (height - 2 * pad), f"1e{k}") for k in range(int(low), int(high) + 1, 4)
    ]
    return Candidates([c.label for c in report.candidates], list(rows.values()), series, width, height, ticks)
