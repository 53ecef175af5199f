"""What the pair page shows: the pair's detail, and the inspector's window taken from the URL."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlencode

import msgspec
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.compute.profiles import ErrorProfile, error_profile
from tensor_debugger.compare.planning.sides import tensors_of, tolerance, views_of
from tensor_debugger.compare.reports.formatting import format_number
from tensor_debugger.compare.reports.inspector import Grid, InspectorView, build_inspector, build_raw_grid
from tensor_debugger.compare.reports.op_lists import OpLists, op_lists
from tensor_debugger.compare.reports.pair_report import PairDetail
from tensor_debugger.compare.reports.pair_reports import pair_detail
from tensor_debugger.compare.reports.slices import SliceRequest, parse_slice_request, read_window
from tensor_debugger.engine.alignment import Shape
from tensor_debugger.engine.metrics import HIST_HIGH, HIST_LOW, Number
from tensor_debugger.engine.views import SourceView
from tensor_debugger.errors import InvalidInputError, NotFoundError
from tensor_debugger.services import Services
from tensor_debugger.store.dtypes import parse_dtype, storage_to_compute
from tensor_debugger.store.models import PairRecord, RunRecord, SessionRecord
from tensor_debugger.web.views.axis_ticks import AxisTick, IndexTick
from tensor_debugger.web.views.heatmap_image import HeatmapFrame, heatmap_frame

DEFAULT_COUNT = 64  # values in the default window (1-D, the last dimension): 16 rows of 4 side by side at 1,440 px


def default_window(shape: Shape) -> dict[str, str]:
    if not shape:
        return {"index": "", "start": "", "count": ""}
    return {
        "index": ",".join(["0"] * (len(shape) - 1) + [":"]),
        "start": "0",
        "count": str(min(DEFAULT_COUNT, max(shape[-1], 1))),
    }


def centred_window(shape: Shape, target: tuple[int, ...], current: SliceRequest) -> dict[str, str]:
    """The current window moved so that it holds `target`, centred where it can be."""
    if not shape:
        return default_window(shape)
    free = [d for d, v in enumerate(current.index) if v is None]
    index, starts = [], []
    for dim, size in enumerate(shape):
        if dim in free:
            count = current.count[free.index(dim)]
            starts.append(max(0, min(target[dim] - count // 2, size - count)))
            index.append(":")
        else:
            index.append(str(target[dim]))
    return {"index": ",".join(index), "start": ",".join(map(str, starts)), "count": ",".join(map(str, current.count))}


def parse_fixed(shape: Shape, text: str) -> tuple[int | None, ...]:
    """`3,:,0,:` -> (3, None, 0, None) for the heatmap: exactly two ':' and valid indices elsewhere."""
    parts = [p.strip() for p in text.split(",")] if text else []
    if len(parts) != len(shape) or parts.count(":") != 2:
        raise InvalidInputError(f"give an index per dimension of {list(shape)} with ':' on exactly two")
    fixed: list[int | None] = []
    for dim, (part, size) in enumerate(zip(parts, shape, strict=True)):
        if part == ":":
            fixed.append(None)
            continue
        if not part.isdigit() or int(part) >= size:
            raise InvalidInputError(f"index {part!r} does not fit dimension {dim} of size {size}")
        fixed.append(int(part))
    return tuple(fixed)


def heatmap_spec(shape: Shape, request: SliceRequest) -> str | None:
    """The heatmap beside the window: its last two dimensions, the others where the window is."""
    if len(shape) < 2:
        return None
    free = [d for d, v in enumerate(request.index) if v is None]
    parts = []
    for dim in range(len(shape)):
        if dim >= len(shape) - 2:
            parts.append(":")
        elif request.index[dim] is not None:
            parts.append(str(request.index[dim]))
        else:
            parts.append(str(request.start[free.index(dim)]))
    return ",".join(parts)


PROFILE_WIDTH, PROFILE_HEIGHT = 600.0, 160.0


class ProfileChart(msgspec.Struct, frozen=True):
    """An error profile as the pair page draws it (see `profile_chart`)."""

    profile: ErrorProfile
    y_ticks: list[AxisTick]  # the decades, from the top
    x_ticks: list[IndexTick]
    series: dict[str, list[str] | list[bool]]  # each index's values as text and whether it mismatched, for the script
    top_points: str  # SVG polyline points of the largest |difference| per index
    mean_points: str  # and of the mean
    low: int  # the decades the chart spans: 1e{low} to 1e{high}
    high: int
    nan: list[int]  # the indices whose largest |difference| is NaN
    worst_index: int | None
    mismatched_indices: int
    width: float
    height: float


class HistogramBar(msgspec.Struct, frozen=True):
    """A decade of |difference| in the pair page's histogram (see `histogram_bars`)."""

    label: str
    count: int
    percent: float  # its length, in percent of the longest possible
    readout: str


class WorstRow(msgspec.Struct, frozen=True):
    """One of the pair's largest differences, with the address of the page whose inspector is centred on it (None
    where the pair has no aligned values to inspect)."""

    index: list[int]
    a: Number
    b: Number
    abs_diff: Number
    url: str | None


class ManualGrid(msgspec.Struct, frozen=True):
    """Manual mode, one run: its own values in its own layout, and the window that shows them."""

    side: str  # "a" or "b"
    grid: Grid
    shards: list[str]  # the run's tensors of the pair
    shard: int
    index: str
    start: str
    count: str


class InspectorWindow(msgspec.Struct, frozen=True):
    """The inspector's window as its form shows it, and the aligned shape it is in."""

    index: str
    start: str
    count: str
    shape: list[int]


class PairPage(msgspec.Struct, frozen=True, kw_only=True):
    """What pair.html (and _inspector.html, its inspector alone) shows: each field is a name of the templates.
    The inspector's parts are None where the pair has no aligned values (a summary verdict, no alignment)."""

    pair: PairDetail
    session: SessionRecord
    run_a: RunRecord | None
    run_b: RunRecord | None
    histogram: list[HistogramBar]
    histogram_ticks: list[AxisTick]
    worst: list[WorstRow]
    ops: OpLists | None  # a capture with level="op": its module's ops, side by side
    manual: list[ManualGrid] | None = None
    inspector: InspectorView | None = None
    window: InspectorWindow | None = None
    window_error: str | None = None  # the window the URL asked for, refused: said next to the form
    heatmap_url: str | None = None
    heatmap_svg_url: str | None = None
    heatmap_values_url: str | None = None
    heatmap_spec: str | None = None
    heatmap: HeatmapFrame | None = None
    profile_dims: list[tuple[int, int]] | None = None
    profile: ProfileChart | None = None
    jump_url: str | None = None

    def template_context(self) -> dict[str, object]:
        """The fields by name, as the templates read them."""
        return {name: getattr(self, name) for name in self.__struct_fields__}


def profile_chart(profile: ErrorProfile) -> ProfileChart:
    """An error profile as SVG polylines (log10 of the largest and the mean |difference| per index) in a
    PROFILE_WIDTH x PROFILE_HEIGHT box, with the decades it spans and its worst index."""

    def numbers(values: list[Any]) -> list[float | None]:
        return [v if isinstance(v, int | float) and v > 0 else None for v in values]

    top, mean = numbers(profile.max_abs_diff), numbers(profile.mean_abs_diff)
    present = [math.log10(v) for v in (*top, *mean) if v is not None]
    low, high = (math.floor(min(present)), math.ceil(max(present))) if present else (0, 1)
    high = max(high, low + 1)
    step = PROFILE_WIDTH / max(profile.size - 1, 1)

    def points(values: list[float | None]) -> str:
        return " ".join(
            f"{i * step:.1f},{PROFILE_HEIGHT - (math.log10(v) - low) / (high - low) * PROFILE_HEIGHT:.1f}"
            for i, v in enumerate(values)
            if v is not None
        )

    nan = [i for i, v in enumerate(profile.max_abs_diff) if v == "nan"]
    ranked = [(v, i) for i, v in enumerate(top) if v is not None]
    decades = range(low, high + 1, max(1, math.ceil((high - low) / 6)))
    return ProfileChart(
        profile=profile,
        y_ticks=[AxisTick(at=100 * (1 - (k - low) / (high - low)), label=f"1e{k}") for k in decades],
        x_ticks=index_ticks(profile.size),
        series={
            "max": [_text_of(v) for v in profile.max_abs_diff],
            "mean": [_text_of(v) for v in profile.mean_abs_diff],
            "mismatched": [bool(m) for m in profile.mismatched],
        },
        top_points=points(top),
        mean_points=points(mean),
        low=low,
        high=high,
        nan=nan,
        worst_index=max(ranked)[1] if ranked else None,
        mismatched_indices=sum(1 for m in profile.mismatched if m),
        width=PROFILE_WIDTH,
        height=PROFILE_HEIGHT,
    )


def _text_of(value: Any) -> str:
    """A profile's value as the page reads it out: 4 significant digits, NaN and Inf by name."""
    if value == "nan" or (isinstance(value, float) and math.isnan(value)):
        return "NaN"
    if isinstance(value, str):
        return "Inf"
    return format_number(float(value)) if value is not None else "—"


def index_ticks(size: int, most: int = 8) -> list[IndexTick]:
    """Every index that fits, else round ones (steps of 1, 2 or 5 times a power of ten, from 0) and the last, at
    their place in percent of an axis whose ends are index 0 and index size - 1: no label is skipped unevenly."""
    if size <= 1:
        return [IndexTick(at=0.0, index=0)]
    raw = (size - 1) / most
    power = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    step = max(1, int(next(m * power for m in (1, 2, 5, 10) if m * power >= raw)))
    indices = list(range(0, size, step))
    if size - 1 - indices[-1] >= step / 2:
        indices.append(size - 1)
    return [IndexTick(at=100 * i / (size - 1), index=i) for i in indices]


def histogram_bars(counts: list[int]) -> list[HistogramBar]:
    """One bar per decade of |difference|, its length on a log scale of counts (log10(1 + count)): 816 elements
    at 1e-2 stay visible beside 129,792 exact zeros, where a linear scale left them a hairline. Each bar's
    `readout` says its exact range, its count and its share of the elements counted."""
    labels = ["0", f"< 1e{HIST_LOW + 1}"] + [f"1e{k}" for k in range(HIST_LOW + 1, HIST_HIGH)] + [f"≥ 1e{HIST_HIGH}"]
    ranges = (
        ["exactly 0", f"above 0, below 1e{HIST_LOW + 1}"]
        + [f"1e{k} up to 1e{k + 1}" for k in range(HIST_LOW + 1, HIST_HIGH)]
        + [f"1e{HIST_HIGH} or more (Inf included)"]
    )
    top = math.log10(1 + max(counts)) if counts else 0.0
    total = sum(counts)
    bars = []
    for label, where, c in zip(labels, ranges, counts, strict=False):
        share = f"{100 * c / total:.3g}%" if total else "—"
        readout = f"|diff| {where}: {c:,} element{'' if c == 1 else 's'} ({share} of {total:,})"
        bars.append(
            HistogramBar(label=label, count=c, percent=100 * math.log10(1 + c) / top if top else 0, readout=readout)
        )
    return bars


def histogram_ticks(counts: list[int]) -> list[AxisTick]:
    """The bars' axis: 0, 1, 10, 100... up to the largest count, at their place on the bars' log scale."""
    top = math.log10(1 + max(counts)) if counts else 0.0
    if not top:
        return []
    ticks = [AxisTick(at=0.0, label="0")]
    k = 0
    while 10**k <= max(counts):
        ticks.append(AxisTick(at=100 * math.log10(1 + 10**k) / top, label=f"{10**k:,}" if k < 4 else f"1e{k}"))
        k += 1
    return ticks


@dataclass(frozen=True)
class ManualSide:
    """Manual mode, one run: which of its tensors (shard) and which window of its own layout."""

    shard: int = 0
    index: str = ""
    start: str = ""
    count: str = ""


def manual_grids(db: DbSession, services: Services, pair: PairRecord, sides: dict[str, ManualSide]) -> list[ManualGrid]:
    """Each run's own values, read straight from its stored tensor with its own dimensions: for when the
    automatic alignment is in doubt."""
    side_a, side_b = tensors_of(db, pair)
    groups = {"a": side_a, "b": side_b}
    out = []
    for side, label in (("a", "Reference"), ("b", "Candidate")):
        wanted = sides[side]
        shards = groups[side]
        if not 0 <= wanted.shard < len(shards):
            raise InvalidInputError(f"{label.lower()} has {len(shards)} tensor(s); shard {wanted.shard} is not one")
        tensor = shards[wanted.shard]
        shape = tuple(tensor.shape)
        params = (
            {"index": wanted.index, "start": wanted.start, "count": wanted.count}
            if wanted.index or not shape
            else default_window(shape)
        )
        request = parse_slice_request(shape, params["index"], params["start"], params["count"])
        view = SourceView(
            services.store.open(tensor.store_key, tensor.digest),
            partial(storage_to_compute, logical=parse_dtype(tensor.dtype)),
        )
        region, free = [], []
        starts = iter(zip(request.start, request.count, strict=True))
        for dim, fixed in enumerate(request.index):
            if fixed is None:
                s, c = next(starts)
                region.append(slice(s, min(s + c, shape[dim])))
                free.append(dim)
            else:
                region.append(slice(fixed, fixed + 1))
        values = view.read(tuple(region)).reshape(
            tuple(r.stop - r.start for r, d in zip(region, range(len(shape)), strict=True) if d in free)
        )
        grid = build_raw_grid(
            f"{label}: {tensor.name} {list(shape)} {tensor.dtype}", values, tuple(r.start for r in region), free
        )
        out.append(
            ManualGrid(
                side=side,
                grid=grid,
                shards=[t.name for t in shards],
                shard=wanted.shard,
                index=params["index"],
                start=params["start"],
                count=params["count"],
            )
        )
    return out


def pair_page_view(
    db: DbSession,
    services: Services,
    pair_id: int,
    index: str,
    start: str,
    count: str,
    manual: dict[str, ManualSide] | None = None,
    profile: str = "",
) -> PairPage:
    pair = db.get(PairRecord, pair_id)
    if pair is None:
        raise NotFoundError(f"no pair with id {pair_id}")
    # held here, so that the session (whose identity map holds what nobody references only weakly) answers the
    # reads of pair_detail and of the views below from memory: the pair and its tensors are read once
    sides = tensors_of(db, pair)
    detail = pair_detail(db, services.context, pair_id)
    session = db.get_one(SessionRecord, pair.session_id)
    runs = {r.id: r for r in session.runs}
    worst = detail.stats.worst if detail.stats else []
    page = PairPage(
        pair=detail,
        session=session,
        run_a=runs.get(pair.run_a_id),
        run_b=runs.get(pair.run_b_id),
        histogram=histogram_bars(detail.stats.histogram if detail.stats else []),
        histogram_ticks=histogram_ticks(detail.stats.histogram if detail.stats else []),
        worst=[WorstRow(index=w.index, a=w.a, b=w.b, abs_diff=w.abs_diff, url=None) for w in worst],
        ops=op_lists(db, pair, *sides),
    )
    if pair.summary is not None:  # no element values on one side: the summary verdict is all there is
        return page
    if manual is not None:
        page = msgspec.structs.replace(page, manual=manual_grids(db, services, pair, manual))
    if pair.alignment is None:
        return page
    side_a, side_b = sides
    view_a, view_b, alignment = views_of(services.store, pair, side_a, side_b)
    shape = alignment.shape
    opening = opening_window(shape, detail.argmax.aligned if detail.argmax else None)
    params = {"index": index, "start": start, "count": count} if index or not shape else opening
    window_error = None
    try:
        request = parse_slice_request(shape, params["index"], params["start"], params["count"])
    except InvalidInputError as exc:  # said next to the form, which keeps what was typed; the grids stay usable
        window_error = str(exc)
        request = parse_slice_request(shape, opening["index"], opening["start"], opening["count"])
    window = read_window(view_a, view_b, request)
    tol, exact = tolerance(session, side_a[0].dtype, side_b[0].dtype)
    # a heatmap of no element has no cell: none is offered for an empty pair
    spec = heatmap_spec(shape, request) if math.prod(shape) else None
    if spec is not None:
        query = urlencode({"fixed": spec})
        page = msgspec.structs.replace(
            page,
            heatmap_url=f"/pairs/{pair_id}/heatmap.png?{query}",
            heatmap_svg_url=f"/pairs/{pair_id}/heatmap.svg?{query}",
            heatmap_values_url=f"/pairs/{pair_id}/heatmap.json?{query}",
            heatmap_spec=spec,
            heatmap=heatmap_frame(shape, parse_fixed(shape, spec), request),
        )
    chart = None
    if profile.strip():
        try:
            dim = int(profile)
        except ValueError:
            raise InvalidInputError(f"profile must be an aligned dimension (a whole number), got {profile!r}") from None
        chart = profile_chart(error_profile(db, services.context, pair_id, dim))
    jump_url = None
    if detail.argmax:
        jump = centred_window(shape, tuple(detail.argmax.aligned), request)
        jump_url = f"/pairs/{pair_id}?{urlencode(jump)}"
    return msgspec.structs.replace(
        page,
        inspector=build_inspector(window, tol, exact),
        window=InspectorWindow(index=params["index"], start=params["start"], count=params["count"], shape=list(shape)),
        window_error=window_error,
        profile_dims=list(enumerate(shape)),
        profile=chart,
        jump_url=jump_url,
        # each opens the inspector on its element
        worst=[
            msgspec.structs.replace(
                row, url=f"/pairs/{pair_id}?{urlencode(centred_window(shape, tuple(row.index), request))}"
            )
            for row in page.worst
        ],
    )


def opening_window(shape: Shape, argmax: list[int] | None) -> dict[str, str]:
    """Where the page opens when the URL names no window: on the largest difference (the default window's
    dimensions and count, centred on it), else at the start."""
    first = default_window(shape)
    if not shape or argmax is None or len(argmax) != len(shape):
        return first
    request = parse_slice_request(shape, first["index"], first["start"], first["count"])
    return centred_window(shape, tuple(argmax), request)
