"""Server-rendered pages; each shows what an /api route serves as JSON."""

from __future__ import annotations

from typing import Any

import anyio
from litestar import Controller, Request, Response, get, post
from litestar.enums import RequestEncodingType
from litestar.params import Body, Parameter
from litestar.response import Redirect, Template

from tensor_debugger.compare.exports import pairs_to_csv
from tensor_debugger.compare.heatmap import build_heatmap, heatmap_svg
from tensor_debugger.compare.pair_reports import apply_order, session_pairs
from tensor_debugger.compare.progress import session_progress
from tensor_debugger.errors import InvalidInputError, NotFoundError, TensorDebuggerError
from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.models import PairRecord
from tensor_debugger.web.multipart import receive_multipart
from tensor_debugger.web.uploads import start_session
from tensor_debugger.web.views.pair_page import ManualSide, pair_page_context, parse_fixed
from tensor_debugger.web.views.session_view import ViewParams, build_chart, build_groups

FormData = dict[str, str]
FORM = Body(media_type=RequestEncodingType.URL_ENCODED)  # a plain HTML form's fields


class PageController(Controller):
    path = "/"
    include_in_schema = False

    @get("/", sync_to_thread=True)
    def sessions_page(self, services: Services, q: str | None = Parameter(default=None)) -> Template:
        with services.sessions() as db:
            sessions = catalog.list_sessions(db, q)
            summaries = catalog.summarize_sessions(db, [s.id for s in sessions])
            return Template("sessions.html", context={"sessions": sessions, "q": q or "", "summaries": summaries})

    @post("/sessions/{session_id:int}/rename", sync_to_thread=True)
    def rename(self, services: Services, session_id: int, data: FormData = FORM) -> Redirect:
        services.actions.rename(session_id, data.get("name", ""))
        return Redirect("/", status_code=303)

    @post("/sessions/{session_id:int}/delete", sync_to_thread=True)
    def delete(self, services: Services, session_id: int, data: FormData = FORM) -> Redirect:
        """Deleting takes a second, explicit step: the form's `confirm` field must name the session."""
        with services.sessions() as db:
            session = catalog.get_session(db, session_id)
            if data.get("confirm") != "yes":
                raise InvalidInputError(f"tick the confirmation to delete {session.name!r}")
            catalog.delete_session(db, services.store, session_id)
        return Redirect("/", status_code=303)

    @get("/sessions/{session_id:int}", sync_to_thread=True)
    def session_page(
        self, services: Services, session_id: int, group: str | None = None, sort: str | None = None,
        verdict: str | None = None, q: str | None = None,
    ) -> Template:
        """The session: its runs' ingest while it goes on (or why it failed), first divergence, the chart of error
        through the model, and every pair, grouped, sorted and filtered as the URL says (so the page works, and
        links, without any script). While anything is in progress the page refreshes itself (a script polls
        the progress and swaps the page in place; without scripts, a meta refresh)."""
        params = ViewParams.parse(group, sort, verdict, q)
        with services.sessions() as db:
            session = catalog.get_session(db, session_id)
            report = session_pairs(db, session_id, modules=True)
            ordered = apply_order(report.pairs, session.pair_order)
            progress = session_progress(session, services.ingests, report.progress)
            return Template("session.html", context={
                "session": session, "report": report, "params": params, "progress": progress,
                "groups": build_groups(report, params, session.pair_order), "chart": build_chart(ordered),
                "reorderable": params.group == "none" and params.sort == "order" and params.verdict == "all"
                and not params.q, "order_keys": [p.key for p in ordered],
            })

    @get("/runs/{run_id:int}", sync_to_thread=True)
    def run_page(self, services: Services, run_id: int) -> Template:
        """One run's tensors with their summary statistics."""
        with services.sessions() as db:
            run = catalog.get_run(db, run_id)
            return Template("run.html", context={"run": run, "session": catalog.get_session(db, run.session_id),
                                                 "tensors": catalog.list_tensors(db, run_id)})

    @get("/sessions/{session_id:int}/pairs.csv", sync_to_thread=True)
    def pairs_csv(self, services: Services, session_id: int) -> Response[str]:
        with services.sessions() as db:
            session = catalog.get_session(db, session_id)
            report = session_pairs(db, session_id)
            rows = apply_order(report.pairs, session.pair_order)
        return Response(pairs_to_csv(rows), media_type="text/csv; charset=utf-8", headers={
            "content-disposition": f'attachment; filename="session-{session_id}-pairs.csv"'})

    @post("/sessions/{session_id:int}/tolerances", sync_to_thread=True)
    def set_tolerances(self, services: Services, session_id: int,
                       data: FormData = FORM) -> Redirect:
        if data.get("action") == "reset":
            services.actions.set_tolerances(session_id, None, None)
        else:
            services.actions.set_tolerances(session_id, _optional_float(data.get("rtol"), "rtol"),
                                            _optional_float(data.get("atol"), "atol"))
        return Redirect(f"/sessions/{session_id}", status_code=303)

    @post("/sessions/{session_id:int}/pairs", sync_to_thread=True)
    def pair_by_hand(self, services: Services, session_id: int,
                     data: FormData = FORM) -> Redirect:
        a_name, b_name = data.get("a_name", ""), data.get("b_name", "")
        if not a_name or not b_name:
            raise InvalidInputError("choose a tensor of each run to pair")
        services.actions.pair_by_hand(session_id, a_name, b_name)
        return Redirect(f"/sessions/{session_id}", status_code=303)

    @post("/sessions/{session_id:int}/order", sync_to_thread=True)
    def move_pair(self, services: Services, session_id: int,
                  data: FormData = FORM) -> Redirect:
        """Move one pair up or down (the keyboard's way of reordering; dragging rows does the same)."""
        services.actions.move_pair(session_id, data.get("pair", ""), up=data.get("direction") == "up")
        return Redirect(f"/sessions/{session_id}?group=none", status_code=303)

    @get("/pairs/{pair_id:int}", sync_to_thread=True)
    def pair_page(
        self, services: Services, pair_id: int, index: str = "", start: str = "", count: str = "",
        mode: str = "", a_shard: int = 0, a_index: str = "", a_start: str = "", a_count: str = "",
        b_shard: int = 0, b_index: str = "", b_start: str = "", b_count: str = "",
    ) -> Template:
        """A pair's statistics, alignment and the value inspector; the window lives in the URL. `mode=manual`
        adds each run's own values with its own dimension controls (a_* and b_* parameters)."""
        manual = ({"a": ManualSide(a_shard, a_index, a_start, a_count), "b": ManualSide(b_shard, b_index, b_start,
                                                                                      b_count)}
                  if mode == "manual" else None)
        with services.sessions() as db:
            context = pair_page_context(db, services, pair_id, index, start, count, manual)
            return Template("pair.html", context=context)

    @get("/pairs/{pair_id:int}/heatmap.svg", sync_to_thread=True, media_type="image/svg+xml")
    def pair_heatmap(self, services: Services, pair_id: int, fixed: str = "") -> Response[str]:
        """|difference| over a 2-D slice (`fixed`: an index per aligned dim, ':' on two), max-pooled."""
        with services.sessions() as db:
            pair = db.get(PairRecord, pair_id)
            if pair is None:
                raise NotFoundError(f"no pair with id {pair_id}")
            view_a, view_b, alignment = services.comparisons.views(db, pair)
            spec = parse_fixed(alignment.shape, fixed)
            svg = heatmap_svg(build_heatmap(view_a, view_b, spec))
        return Response(svg, media_type="image/svg+xml")

    @get("/pairs/{pair_id:int}/grid", sync_to_thread=True)
    def pair_grid(self, services: Services, pair_id: int, index: str = "", start: str = "",
                  count: str = "") -> Template:
        """Just the inspector's grids, for the page's script to swap in without a reload."""
        with services.sessions() as db:
            context = pair_page_context(db, services, pair_id, index, start, count)
            return Template("_inspector.html", context=context)

    @post("/sessions", request_max_body_size=None)
    async def create_from_form(self, services: Services, request: Request[Any, Any, Any]) -> Template | Redirect:
        """The no-script form on the sessions page: a name and files for the reference and candidate runs. Once
        the files are on disk it goes to the session page, which shows their ingest (and why one failed)."""
        batch = await receive_multipart(request.headers.get("content-type", ""), request.stream(),
                                        services.settings.staging_dir)
        name = batch.fields.get("name", "").strip()
        try:
            if not batch.files:
                raise InvalidInputError("choose at least one file for a run")
            session_id, _ = await anyio.to_thread.run_sync(start_session, services, name or batch.files[0].filename,
                                                           "", batch, True)
        except TensorDebuggerError as exc:
            batch.discard()
            return _form_error(services, name, str(exc))
        except BaseException:
            batch.discard()
            raise
        return Redirect(f"/sessions/{session_id}", status_code=303)


def _optional_float(text: str | None, name: str) -> float | None:
    if text is None or not text.strip():
        return None
    try:
        return float(text)
    except ValueError:
        raise InvalidInputError(f"{name} must be a number, got {text!r}") from None


def _form_error(services: Services, name: str, message: str) -> Template:
    with services.sessions() as db:
        sessions = catalog.list_sessions(db)
        return Template("sessions.html", status_code=400, context={
            "sessions": sessions, "q": "", "error": message, "name": name,
            "summaries": catalog.summarize_sessions(db, [s.id for s in sessions])})
