"""The session page's table: the pairs grouped, sorted and filtered as the URL asks, with each group's worst
values, which groups start open, and the page of each open group's rows that is rendered. Everything is computed
here so the template only loops.

A 2,000-pair session must load in well under a second with a DOM a browser handles easily, so the page never
renders every row: a collapsed group is one header row, an open group shows at most PAGE_SIZE rows at a time, and
once ROW_BUDGET rows are rendered, further open groups are rendered empty (the page's script fetches their rows
when they scroll into view; without scripts, a link opens them)."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlencode

from tensor_debugger.compare.reports.compare_report import nothing_whole_words
from tensor_debugger.compare.reports.pair_report import PairReport
from tensor_debugger.compare.reports.pair_reports import CandidateReport, SessionPairs, UnmatchedReport, apply_order
from tensor_debugger.compare.reports.pass_words import (
    PassBasis,
    no_divergence_words,
    on_printed_statistics,
    statistics_before_words,
)
from tensor_debugger.compare.reports.worst_pairs import RankedPair, by_largest_diff, by_lowest_cosine, stat_value
from tensor_debugger.engine.names import natural_key
from tensor_debugger.store.reports import PairStatus
from tensor_debugger.web.views.session_chart import svg_path

GROUPS = ("layer", "name", "band", "none")
SORTS = ("order", "diff", "cosine", "name", "numel")
SUMMARY_PASS = "No difference found in the summary"  # a pass on summaries: its elements were never compared
BANDS = ("Identical", "Within tolerance", SUMMARY_PASS, "Failing", "Incomparable", "Error", "Not compared yet")
VERDICTS = ("all", "fail", "pass", "incomparable", "unmatched")
PAGE_SIZE = 100  # rows of one group shown at a time
ROW_BUDGET = 300  # rows rendered with the page; at ~25 elements a row, about 7,500 elements
OPENING = ("fail", "error")  # a group holding a pair with one of these verdicts starts open


@dataclass(frozen=True)
class ViewParams:
    group: str = "layer"
    sort: str = "order"
    verdict: str = "all"
    q: str = ""
    open: str = ""  # a group opened by the user (its key), shown first and at `page`
    page: int = 0
    lo: int | None = None  # a range of execution positions picked on the chart (inclusive)
    hi: int | None = None

    @classmethod
    def parse(
        cls,
        group: str | None,
        sort: str | None,
        verdict: str | None,
        q: str | None,
        open_group: str | None = None,
        page: str | None = None,
        lo: str | None = None,
        hi: str | None = None,
    ) -> ViewParams:
        """Unknown values fall back to the defaults rather than failing the page."""
        return cls(
            group if group in GROUPS else "layer",
            sort if sort in SORTS else "order",
            verdict if verdict in VERDICTS else "all",
            (q or "").strip(),
            (open_group or "").strip(),
            _count(page) or 0,
            _count(lo),
            _count(hi),
        )

    @property
    def reorderable(self) -> bool:
        """Rows can be moved only where the table shows the user's order itself, unfiltered."""
        return (
            self.group == "none" and self.sort == "order" and self.verdict == "all" and not self.q and self.lo is None
        )

    def query(self, **changes: str | int | None) -> dict[str, str]:
        """The URL query of this view with `changes`, leaving out what is at its default."""
        values = {
            "group": self.group,
            "sort": self.sort,
            "verdict": self.verdict,
            "q": self.q,
            "open": self.open,
            "page": self.page,
            "lo": self.lo,
            "hi": self.hi,
        }
        values.update(changes)
        defaults = {"group": "layer", "sort": "order", "verdict": "all", "q": "", "open": "", "page": 0}
        return {k: str(v) for k, v in values.items() if v is not None and defaults.get(k) != v}


def _count(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() and len(text) < 10 else None


@dataclass(frozen=True)
class Worst:
    """The worst of each statistic over a group's pairs (NaN where a pair had one; None where none compared)."""

    max_abs_diff: float | None
    mean_abs_diff: float | None
    max_rel_diff: float | None
    mse: float | None
    cosine: float | None
    mismatched_fraction: float | None


@dataclass(frozen=True)
class Gaps:
    """Reference tensors with no partner, placed in execution order among the pairs (gap markers): those before a
    pair, and those after a candidate's last pair, by pair id."""

    before: dict[int, list[UnmatchedReport]] = field(default_factory=dict)
    after: dict[int, list[UnmatchedReport]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.before or self.after)


def gap_markers(report: SessionPairs) -> Gaps:
    """Where each reference tensor without partner falls among its candidate's pairs (its `before_position`)."""
    gaps = Gaps()
    by_position = {(p.b.run_id, p.position): p.id for p in report.pairs}
    last: dict[int, PairReport] = {}
    for p in report.pairs:
        if p.b.run_id not in last or p.position > last[p.b.run_id].position:
            last[p.b.run_id] = p
    side_a = {p.b.run_id: p.a.run_id for p in report.pairs}  # the run each candidate is compared against
    for u in report.unmatched:
        if u.run_id != side_a.get(u.against_run_id) or u.before_position is None:
            continue
        anchor = by_position.get((u.against_run_id, u.before_position))
        if anchor is not None:
            gaps.before.setdefault(anchor, []).append(u)
        elif u.against_run_id in last:
            gaps.after.setdefault(last[u.against_run_id].id, []).append(u)
    return gaps


@dataclass
class Group:
    key: str
    label: str
    rows: list[PairReport] = field(default_factory=list)
    open: bool = False
    loaded: bool = False  # its rows are rendered with the page (else the script fetches them)
    page: int = 0
    gaps: Gaps = field(default_factory=Gaps)  # shown among its rows when they are in execution order

    @property
    def not_compared(self) -> int:
        """Reference tensors without partner (not allowed by the user) among its rows."""
        ids = {r.id for r in self.rows}
        return sum(
            1
            for where in (self.gaps.before, self.gaps.after)
            for k, us in where.items()
            if k in ids
            for u in us
            if not u.allowed
        )

    @property
    def anchor(self) -> str:
        return "group-" + (re.sub(r"[^A-Za-z0-9_-]+", "-", self.key).strip("-") or "all")

    @property
    def failing(self) -> int:
        return sum(1 for r in self.rows if r.status == "fail")

    @property
    def pages(self) -> int:
        return max(1, math.ceil(len(self.rows) / PAGE_SIZE))

    @property
    def shown(self) -> list[PairReport]:
        """The rows of the group's current page, when they are rendered."""
        if not (self.open and self.loaded):
            return []
        return self.rows[self.page * PAGE_SIZE : (self.page + 1) * PAGE_SIZE]

    @property
    def first_shown(self) -> int:
        return self.page * PAGE_SIZE + 1

    @property
    def worst(self) -> Worst:
        def values(key: str) -> list[float]:
            return [stat_value(r.stats, key) for r in self.rows if r.stats]

        def highest(key: str) -> float | None:
            found = values(key)
            return max(found, key=_rank_value) if found else None

        cosines = values("cosine")
        return Worst(
            highest("max_abs_diff"),
            highest("mean_abs_diff"),
            highest("max_rel_diff"),
            highest("mse"),
            min(cosines, key=lambda c: -_rank_value(-c)) if cosines else None,
            highest("mismatched_fraction"),
        )


def filtered_pairs(report: SessionPairs, params: ViewParams, order: list[str] | None) -> list[PairReport]:
    """The pairs the view shows, in the user's order, filtered and sorted as it asks: the whole list, before it is
    grouped and cut into pages (by a statistic: the worst first, pairs without statistics last)."""
    pairs = apply_order(report.pairs, order)
    if params.verdict not in ("all", "unmatched"):
        pairs = [p for p in pairs if p.status == params.verdict]
    if params.verdict == "unmatched":
        pairs = []
    if params.q:
        needle = params.q.lower()
        pairs = [p for p in pairs if needle in p.name.lower() or needle in p.b.name.lower()]
    if params.lo is not None or params.hi is not None:
        lo, hi = params.lo or 0, params.hi if params.hi is not None else math.inf
        pairs = [p for p in pairs if lo <= p.position <= hi]
    if params.sort == "diff":
        pairs = sorted(pairs, key=by_largest_diff)
    elif params.sort == "cosine":
        pairs = sorted(pairs, key=by_lowest_cosine)
    elif params.sort == "name":
        pairs = sorted(pairs, key=lambda p: natural_key(p.name))
    elif params.sort == "numel":
        pairs = sorted(pairs, key=lambda p: -numel(p))
    return pairs


def build_groups(
    report: SessionPairs, params: ViewParams, order: list[str] | None, budget: int = ROW_BUDGET
) -> list[Group]:
    """The groups of the view, which are open and which of those have their rows rendered with the page: the
    group the user opened first, then the first divergence's, then the failing ones, until `budget` rows. Groups
    start collapsed unless they hold a failing pair, the first divergence or a reference tensor without partner (or
    are the only group). In execution order, a group opens at the page that holds the first divergence; sorted by
    a column, at its first page, which holds the largest (or smallest) values."""
    pairs = filtered_pairs(report, params, order)
    if params.group == "none":
        groups = [Group("all", "All pairs", pairs, open=True)] if pairs else []
    else:
        by_label: dict[str, Group] = {}
        if params.group == "band":
            by_label = {label: Group(label, label) for label in BANDS}
        for p in pairs:
            label = _label(p, params.group)
            by_label.setdefault(label, Group(label, label)).rows.append(p)
        groups = [g for g in by_label.values() if g.rows]
    first = report.first_divergence.pair_id if report.first_divergence else None
    gaps = gap_markers(report) if params.sort == "order" else Gaps()
    for g in groups:
        g.gaps = gaps
        g.open = (
            g.open
            or len(groups) == 1
            or g.key == params.open
            or any(r.status in OPENING or r.id == first for r in g.rows)
            or g.not_compared > 0  # a reference tensor without partner among its rows: shown, not folded away
        )
        if g.key == params.open:
            g.page = min(params.page, g.pages - 1)
        elif first is not None and params.sort == "order":
            at = next((i for i, r in enumerate(g.rows) if r.id == first), None)
            g.page = at // PAGE_SIZE if at is not None else 0

    def priority(g: Group) -> int:
        return 0 if g.key == params.open else 1 if any(r.id == first for r in g.rows) else 2

    left = budget
    for g in sorted((g for g in groups if g.open), key=priority):
        size = len(g.rows[g.page * PAGE_SIZE : (g.page + 1) * PAGE_SIZE])
        if size <= left or priority(g) < 2:
            g.loaded = True
            left -= size
    return groups


@dataclass(frozen=True)
class WorstEntry:
    """A pair of the worst-pairs lists, with the address of its row in the table."""

    pair: RankedPair
    row: str  # the session page's query and anchor that show its row: its group opened at the page holding it
    candidate: str  # its candidate run's label, with several candidates; else ""


@dataclass(frozen=True)
class WorstView:
    """The worst-pairs lists the session page shows above its table, whatever the table's view."""

    by_max_abs_diff: list[WorstEntry]
    by_cosine: list[WorstEntry]


def worst_view(report: SessionPairs, params: ViewParams, order: list[str] | None) -> WorstView | None:
    """The session's worst pairs (report.worst_pairs), each linked to its row in the table as the view groups and
    sorts it; a pair the view filters out is linked to its row in the same view unfiltered. None while no pair is
    compared."""
    worst = report.worst_pairs
    if not worst.by_max_abs_diff:
        return None
    places = {params: _places(report, params, order)}
    several = {c.run_id: c.label for c in report.candidates} if len(report.candidates) > 1 else {}

    def entry(pair: RankedPair) -> WorstEntry:
        view = params
        if pair.pair_id not in places[view]:
            view = ViewParams(group=params.group, sort=params.sort)
            places.setdefault(view, _places(report, view, order))
        key, page = places[view][pair.pair_id]
        return WorstEntry(
            pair, f"?{urlencode(view.query(open=key, page=page))}#pair-{pair.pair_id}", several.get(pair.run_id, "")
        )

    return WorstView([entry(p) for p in worst.by_max_abs_diff], [entry(p) for p in worst.by_cosine])


def _places(report: SessionPairs, params: ViewParams, order: list[str] | None) -> dict[int, tuple[str, int]]:
    """Where each pair of the view is: its group's key, and the page of the group that holds it."""
    seen: Counter[str] = Counter()
    places = {}
    for pair in filtered_pairs(report, params, order):
        key = "all" if params.group == "none" else _label(pair, params.group)
        places[pair.id] = (key, seen[key] // PAGE_SIZE)
        seen[key] += 1
    return places


def _label(pair: PairReport, group: str) -> str:
    if group == "band":
        return band(pair)
    if group == "layer":
        return f"Layer {pair.layer}" if pair.layer is not None else "No layer"
    # by name: what the tensor is, whichever layer it belongs to (its stage, else its name with numbers as N)
    return pair.stage or re.sub(r"\d+", "N", pair.name)


def numel(pair: PairReport) -> int:
    """The pair's size: elements compared, else the reference's element count."""
    return pair.stats.numel if pair.stats else math.prod(pair.a.shape)


def band(pair: PairReport) -> str:
    """The pair's similarity band: identical (no difference at all), within tolerance, failing; or why it has
    none yet. A pass on summaries is identical only where their hashes are equal, and otherwise no difference found
    in the summary, not "within tolerance": its elements were never compared."""
    if pair.status == "pass" and pair.summary is not None and pair.summary.on_summary:
        return "Identical" if pair.summary.identical is True else SUMMARY_PASS
    if pair.status == "pass":
        identical = (
            pair.stats is not None
            and stat_value(pair.stats, "max_abs_diff") == 0
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
    """A point of the candidates' chart (server-rendered SVG)."""

    x: float
    y_diff: float | None
    y_cos: float | None
    failing: bool
    href: str
    title: str


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


@dataclass(frozen=True)
class CandidateSeries:
    label: str
    path: str  # max |diff| of its pairs along the rows
    points: list[ChartPoint]
    first_divergence: str | None  # the tensor's name
    # False where no execution order is known (pair_reports.FirstDivergence.in_execution_order): not "first"
    in_execution_order: bool = True
    # where it has no first divergence, its verdict in the CLI's words ("nothing was compared: ...", "no divergence
    # among the pairs compared: ...": compare/reports/pass_words.py)
    verdict_words: str = ""


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
            diff = stat_value(pair.stats, "max_abs_diff")
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
                candidate.label,
                svg_path((p.x, p.y_diff) for p in points),
                points,
                first.name if first else None,
                first.in_execution_order if first else True,
                "" if first else candidate_verdict_words(report, candidate),
            )
        )
    ticks = [
        (pad + (high - k) / (high - low) * (height - 2 * pad), f"1e{k}") for k in range(int(low), int(high) + 1, 4)
    ]
    return Candidates([c.label for c in report.candidates], list(rows.values()), series, width, height, ticks)


def candidate_verdict_words(report: SessionPairs, candidate: CandidateReport) -> str:
    """Candidate `candidate`'s verdict where it has no first divergence, in the words the CLI's `compare` says it
    with: on its own pairs and its run's coverage, never another candidate's."""
    mine = [p for p in report.pairs if p.b.run_id == candidate.run_id]
    run = next((r for r in report.coverage.runs if r.run == candidate.label), None)
    if mine and not any(p.status in (PairStatus.PASS, PairStatus.FAIL) for p in mine):
        # no pair has a verdict: nothing was compared, or only the rows of pairs whose reference was cut
        in_part = [(p.reference_rows.kept, p.reference_rows.rows) for p in mine if p.reference_rows and p.stats]
        return nothing_whole_words(len(mine), in_part)
    return no_divergence_words(
        [
            PassBasis(
                str(p.status),
                sketched=p.summary is not None and p.summary.on_summary,
                identical=bool(p.summary is not None and p.summary.identical),
                printed=on_printed_statistics(p.summary),
                hashes_differ=p.summary is not None and p.summary.hashes_differ is True,
            )
            for p in mine
        ],
        None if run is None else run.compared,
        None if run is None else run.tensors,
    )


def statistics_before_sentence(report: SessionPairs) -> str:
    """Under the first divergence: that the pairs before it passed on printed statistics only, as a sentence ("" where
    none did)."""
    words = statistics_before_words(report.statistics_before(report.first_divergence))
    return f"{words[0].upper()}{words[1:]}" if words else ""


def has_noise_floor(report: SessionPairs) -> bool:
    """Whether the session has a rerun of the reference, so its table shows each pair's noise floor."""
    return any(p.noise_max_abs_diff is not None for p in report.pairs)


@dataclass(frozen=True)
class FullValues:
    """A candidate's first divergence compared element by element, shown beside a session's first divergence that
    rests on summaries (find_divergence's "candidate (full)" against "reference (full)"): `same` where it is that
    tensor. The figures are its pair's: max |diff|, where it is, and the elements outside tolerance."""

    label: str  # the candidate run's
    against: str  # the run it was compared against
    pair: PairReport
    same: bool


def changed_by_noise(report: SessionPairs) -> bool:
    """Whether the first divergence's first pair whose values differ (`first_changed`: its name, then its line)
    passed by the noise rule, not within tolerance."""
    first = report.first_divergence
    changed = first.first_changed if first is not None else None
    if not changed or first is None:
        return False
    pairs = {p.id: p for p in report.pairs}
    theirs = pairs.get(first.pair_id)
    return any(
        p.rule == "noise" and (changed == p.name or changed.startswith(p.name + " "))
        for p in report.pairs
        if theirs is None or p.b.run_id == theirs.b.run_id
    )


def full_values(report: SessionPairs) -> list[FullValues]:
    """Where the session's first divergence rests on summaries: each other candidate's first divergence that was
    compared element by element (its pair has statistics), the same tensor's first."""
    first = report.first_divergence
    if first is None or first.basis != "summary":
        return []
    pairs = {p.id: p for p in report.pairs}
    found = []
    for candidate in report.candidates:
        theirs = candidate.first_divergence
        pair = pairs.get(theirs.pair_id) if theirs is not None and theirs.basis != "summary" else None
        if pair is None or pair.stats is None:
            continue
        found.append(FullValues(candidate.label, candidate.against or "the reference", pair, pair.name == first.name))
    return sorted(found, key=lambda f: not f.same)
