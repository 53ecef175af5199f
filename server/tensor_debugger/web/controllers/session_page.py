"""The session page: its pairs grouped, sorted and filtered as the URL says, one group's rows for the page's
script, the CSV export, and the forms that change the table (tolerances, the order of pairs)."""

from __future__ import annotations

from typing import Annotated

from litestar import Controller, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, QueryParameter
from litestar.response import Redirect, Template
from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.planning.hand_pairing import hand_pair_choices
from tensor_debugger.compare.reports.contract import next_capture_of
from tensor_debugger.compare.reports.exports import pairs_to_csv
from tensor_debugger.compare.reports.pair_reports import SessionPairs, apply_order, session_modules, session_pairs
from tensor_debugger.compare.reports.progress import session_progress
from tensor_debugger.compare.reports.session_profiles import parse_dim, session_profiles
from tensor_debugger.engine.dimension_names import dimension_names
from tensor_debugger.errors import InvalidInputError, NotFoundError
from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.models import PairRecord, SessionRecord
from tensor_debugger.web.controllers.forms import Form, optional_float
from tensor_debugger.web.views.module_graph import build_graph, graph_html
from tensor_debugger.web.views.pairing_form import PairingForm
from tensor_debugger.web.views.profile_heatmap import heatmap
from tensor_debugger.web.views.session_chart import build_chart
from tensor_debugger.web.views.session_view import (
    PAGE_SIZE,
    ViewParams,
    build_candidates,
    build_groups,
    changed_by_noise,
    full_values,
    has_noise_floor,
    statistics_before_sentence,
    worst_view,
)


class SessionPageController(Controller):
    path = "/"
    include_in_schema = False

    @get("/sessions/{session_id:int}", sync_to_thread=True)
    def session_page(
        self,
        services: NamedDependency[Services],
        session_id: FromPath[int],
        group: FromQuery[str | None] = None,
        sort: FromQuery[str | None] = None,
        verdict: FromQuery[str | None] = None,
        q: FromQuery[str | None] = None,
        pair_a: FromQuery[str | None] = None,
        pair_b: FromQuery[str | None] = None,
        open_group: Annotated[str | None, QueryParameter(name="open")] = None,
        page: FromQuery[str | None] = None,
        lo: FromQuery[str | None] = None,
        hi: FromQuery[str | None] = None,
    ) -> Template:
        """The session: its runs' ingest while it goes on (or why it failed), first divergence, the chart of error
        through the model, and every pair, grouped, sorted and filtered as the URL says (so the page works, and
        links, without any script). While anything is in progress the page refreshes itself (a script polls
        the progress and swaps the page in place; without scripts, a meta refresh). `pair_a` and `pair_b`: two
        tensors being paired by hand, whose alignments the page offers. `open` and `page`: a group the user
        opened and the page of its rows shown; `lo` and `hi`: a range of execution positions (from the chart)."""
        return session_template(
            services,
            session_id,
            ViewParams.parse(group, sort, verdict, q, open_group, page, lo, hi),
            hand=(pair_a, pair_b) if pair_a and pair_b else None,
        )

    @get("/sessions/{session_id:int}/group", sync_to_thread=True)
    def session_group(
        self,
        services: NamedDependency[Services],
        session_id: FromPath[int],
        group: FromQuery[str | None] = None,
        sort: FromQuery[str | None] = None,
        verdict: FromQuery[str | None] = None,
        q: FromQuery[str | None] = None,
        open_group: Annotated[str | None, QueryParameter(name="open")] = None,
        page: FromQuery[str | None] = None,
        lo: FromQuery[str | None] = None,
        hi: FromQuery[str | None] = None,
    ) -> Template:
        """One group of the session page's table (`open`: its key) at `page`, as the page renders it: what the
        page's script swaps in when a group is opened or paged without a reload."""
        params = ViewParams.parse(group, sort, verdict, q, open_group, page, lo, hi)
        with services.sessions() as db:
            session, report = read_session(db, services, session_id)
            groups = build_groups(report, params, session.pair_order, budget=0)
            found = next((g for g in groups if g.key == params.open), None)
            if found is None:
                raise NotFoundError(f"no group {params.open!r} in this view of session {session_id}")
            found.open = found.loaded = True
            return Template(
                "_group.html",
                context={
                    "session": session,
                    "params": params,
                    "group": found,
                    "reorderable": params.reorderable,
                    "first_id": report.first_divergence.pair_id if report.first_divergence else None,
                    "page_size": PAGE_SIZE,
                    "noise_floor": has_noise_floor(report),
                },
            )

    @get("/sessions/{session_id:int}/profiles", sync_to_thread=True)
    def session_profiles_page(
        self, services: NamedDependency[Services], session_id: FromPath[int], dim: FromQuery[str] = ""
    ) -> Template:
        """Every pair's error profile along the aligned dimension `dim` (a number, or a name the session's dims
        give: each pair's own dimension of that name), as heatmaps (pairs × index) grouped by dimension name and
        size; without `dim`, the named dimension most pairs have (else the numbered one), and the form to pick
        another."""
        with services.sessions() as db:
            session, report = read_session(db, services, session_id)
            shapes = [p for p in report.pairs if p.aligned_shape is not None]
            ranks = [len(p.aligned_shape or []) for p in shapes]
            named: dict[str, int] = {}  # a dimension's name -> the pairs with a dimension so named
            at: dict[int, set[str]] = {}  # an aligned dimension -> the names pairs give it
            named_wide: dict[str, int] = {}  # a dimension's name -> the pairs where it is wider than 1
            for pair in shapes:
                rank = len(pair.aligned_shape or [])
                for d, label in enumerate(
                    dimension_names(session.dims, (pair.name, pair.a.name, pair.b.name), rank) or []
                ):
                    named[label] = named.get(label, 0) + 1
                    named_wide[label] = named_wide.get(label, 0) + ((pair.aligned_shape or [])[d] > 1)
                    at.setdefault(d, set()).add(label)
            dims = [
                (d, sum(1 for r in ranks if r > d), ", ".join(sorted(at.get(d, ()))))
                for d in range(max(ranks, default=0))
            ]
            wide = [
                sum(1 for p in shapes if len(p.aligned_shape or []) > d and (p.aligned_shape or [])[d] > 1)
                for d, _, _ in dims
            ]
            chosen = parse_dim(dim) if dim.strip() else default_dim(named_wide, wide)
            profiles = session_profiles(db, services.context, session_id, chosen) if chosen is not None else None
            context = {"session": session, "dims": dims, "named": named, "dim": chosen, "profiles": profiles}
            context["heatmap"] = heatmap(profiles) if profiles is not None else None
            return Template("session_profiles.html", context=context)

    @get("/sessions/{session_id:int}/graph", sync_to_thread=True)
    def module_graph_page(
        self, services: NamedDependency[Services], session_id: FromPath[int], q: FromQuery[str] = ""
    ) -> Template:
        """A traced or captured session's modules as a graph: folded but for the paths to the first divergence and
        the culprits; `q`: modules whose path holds it (any case), shown with the modules above them open. 404
        where the session's runs have no module structure."""
        with services.sessions() as db:
            session = catalog.get_session(db, session_id)
            report = session_modules(db, session_id, cache=services.stats)
        if report.modules is None or not report.modules.tree:
            raise NotFoundError(f"session {session_id} has no module structure (a trace or a capture has)")
        graph = build_graph(report.modules, report.first_divergence, q)
        context = {"session": session, "graph": graph, "tree": graph_html(graph)}
        return Template("module_graph.html", context=context)

    @get("/sessions/{session_id:int}/pairs.csv", sync_to_thread=True)
    def pairs_csv(self, services: NamedDependency[Services], session_id: FromPath[int]) -> Response[str]:
        with services.sessions() as db:
            session, report = read_session(db, services, session_id)
            rows = apply_order(report.pairs, session.pair_order)
        several = {c.run_id: c.label for c in report.candidates} if len(report.candidates) > 1 else None
        return Response(
            pairs_to_csv(rows, several),
            media_type="text/csv",  # Litestar adds "; charset=utf-8" to a text type
            headers={"content-disposition": f'attachment; filename="session-{session_id}-pairs.csv"'},
        )

    @post("/sessions/{session_id:int}/tolerances", sync_to_thread=True)
    def set_tolerances(self, services: NamedDependency[Services], session_id: FromPath[int], data: Form) -> Redirect:
        if data.get("action") == "reset":
            services.actions.set_tolerances(session_id, None, None)
        else:
            ulp = optional_float(data.get("ulp"), "ulp")
            if ulp is not None and not ulp.is_integer():
                raise InvalidInputError(f"ulp must be a whole number, got {ulp}")
            services.actions.set_tolerances(
                session_id,
                optional_float(data.get("rtol"), "rtol"),
                optional_float(data.get("atol"), "atol"),
                None if ulp is None else int(ulp),
            )
        return Redirect(f"/sessions/{session_id}", status_code=303)

    @post("/sessions/{session_id:int}/order", sync_to_thread=True)
    def move_pair(self, services: NamedDependency[Services], session_id: FromPath[int], data: Form) -> Redirect:
        """Move one pair up or down (the keyboard's way of reordering; dragging rows does the same). Without
        scripts the page comes back on the table's page that holds the pair, at its row."""
        key = data.get("pair", "")
        services.actions.move_pair(session_id, key, up=data.get("direction") == "up")
        with services.sessions() as db:
            order = catalog.get_session(db, session_id).pair_order or []
            a_name, _, b_name = key.partition("|")
            pair_id = db.scalar(
                select(PairRecord.id).where(
                    PairRecord.session_id == session_id, PairRecord.a_name == a_name, PairRecord.b_name == b_name
                )
            )
        page = order.index(key) // PAGE_SIZE if key in order else 0
        anchor = f"#pair-{pair_id}" if pair_id is not None else ""
        return Redirect(f"/sessions/{session_id}?group=none&open=all&page={page}{anchor}", status_code=303)


def read_session(
    db: DbSession, services: Services, session_id: int, modules: bool = False, closest: bool = True
) -> tuple[SessionRecord, SessionPairs]:
    """The session (NotFoundError when there is none) and its pairs' report (with `modules`, the module view; with
    `closest`, the unmatched tensors' closest candidates for a hand pairing), read with the process's decoded
    statistics."""
    session = catalog.get_session(db, session_id)
    return session, session_pairs(db, session_id, modules=modules, cache=services.stats, closest=closest)


def session_template(
    services: Services,
    session_id: int,
    params: ViewParams,
    hand: tuple[str, str] | None = None,
    pairing: PairingForm | None = None,
    upload_error: str | None = None,
    hand_error: str | None = None,
    status_code: int = 200,
) -> Template:
    """The session page; a form's refusal is shown next to that form (`pairing`: the rules as typed, with the
    error; `upload_error`: the pairing file's; `hand_error`: pairing by hand's)."""
    live = services.ingests.snapshot()  # before the database: see session_progress
    with services.sessions() as db:
        session, report = read_session(db, services, session_id, modules=True)
        ordered = apply_order(report.pairs, session.pair_order)
        early = services.early.figures(session_id)
        progress = session_progress(session, live, report.progress, early, services.compute.waiting_for)
        first_id = report.first_divergence.pair_id if report.first_divergence else None
        choices = None
        if hand is not None:
            try:
                choices = hand_pair_choices(db, session_id, *hand)
            except InvalidInputError as exc:
                hand_error = str(exc)
        return Template(
            "session.html",
            status_code=status_code,
            context={
                "session": session,
                "report": report,
                "params": params,
                "progress": progress,
                "changed_by_noise": changed_by_noise(report),
                "statistics_before": statistics_before_sentence(report),
                "groups": build_groups(report, params, session.pair_order),
                "worst": worst_view(report, params, session.pair_order),
                "chart": build_chart(report.pairs, first_id, unmatched=report.unmatched_reference),
                "first_id": first_id,
                "page_size": PAGE_SIZE,
                "reorderable": params.reorderable,
                "candidates": build_candidates(report),
                "full_values": full_values(report),
                # the capture that settles a divergence found from summaries, into this session on this server
                "next_capture": next_capture_of(session.name, report, f", server={services.settings.base_url!r}"),
                "noise_floor": has_noise_floor(report),
                "order_keys": [p.key for p in ordered],
                "pairing": pairing or PairingForm.of(session.strategies, session.name_pattern),
                "upload_error": upload_error,
                "hand_error": hand_error,
                "choices": choices,
            },
        )


def default_dim(named: dict[str, int], wide: list[int]) -> int | str | None:
    """The dimension the profiles page opens on: the name most pairs give a dimension wider than 1 (`named`: how
    many, by name), else the aligned dimension most pairs have wider than 1 (`wide`: how many, by dimension); the
    first of equals; None where no pair has an aligned shape."""
    if named:
        return max(named, key=lambda label: named[label])
    return max(range(len(wide)), key=lambda d: wide[d]) if wide else None
