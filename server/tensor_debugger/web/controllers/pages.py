"""Server-rendered pages; each shows what an /api route serves as JSON."""

from __future__ import annotations

from functools import partial
from typing import Any
from urllib.parse import urlencode

import anyio
from litestar import Controller, Request, Response, get, post
from litestar.enums import RequestEncodingType
from litestar.params import Body, Parameter
from litestar.response import Redirect, Template
from sqlalchemy import select

from tensor_debugger.compare.exports import pairs_to_csv
from tensor_debugger.compare.hand_pairing import hand_pair_choices
from tensor_debugger.compare.heatmap import build_heatmap, heatmap_svg
from tensor_debugger.compare.pair_reports import apply_order, session_pairs
from tensor_debugger.compare.pairing_files import export_pairing
from tensor_debugger.compare.progress import session_progress
from tensor_debugger.compare.session_profiles import session_profiles
from tensor_debugger.errors import InvalidInputError, NotFoundError, TensorDebuggerError
from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.models import PairRecord
from tensor_debugger.web.json_bodies import PAIRING_FILE_LIMIT, parse_json
from tensor_debugger.web.multipart import receive_multipart
from tensor_debugger.web.uploads import RunOutcome, explore_session, start_session
from tensor_debugger.web.views.pair_page import ManualSide, pair_page_context, parse_fixed
from tensor_debugger.web.views.pairing_form import PairingForm, rules_from_form
from tensor_debugger.web.views.profile_heatmap import heatmap
from tensor_debugger.web.views.run_view import run_rows
from tensor_debugger.web.views.session_chart import build_chart
from tensor_debugger.web.views.session_view import (
    PAGE_SIZE,
    ViewParams,
    build_candidates,
    build_groups,
    has_noise_floor,
)

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

    @get("/favicon.ico", sync_to_thread=False)
    def favicon(self) -> Redirect:
        """For pages without the icon link (the API viewer) and browsers that ask anyway."""
        return Redirect("/static/favicon.svg", status_code=301)

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
        self,
        services: Services,
        session_id: int,
        group: str | None = None,
        sort: str | None = None,
        verdict: str | None = None,
        q: str | None = None,
        pair_a: str | None = None,
        pair_b: str | None = None,
        open_group: str | None = Parameter(query="open", default=None),
        page: str | None = None,
        lo: str | None = None,
        hi: str | None = None,
    ) -> Template:
        """The session: its runs' ingest while it goes on (or why it failed), first divergence, the chart of error
        through the model, and every pair, grouped, sorted and filtered as the URL says (so the page works, and
        links, without any script). While anything is in progress the page refreshes itself (a script polls
        the progress and swaps the page in place; without scripts, a meta refresh). `pair_a` and `pair_b`: two
        tensors being paired by hand, whose alignments the page offers. `open` and `page`: a group the user
        opened and the page of its rows shown; `lo` and `hi`: a range of execution positions (from the chart)."""
        return _session_template(
            services,
            session_id,
            ViewParams.parse(group, sort, verdict, q, open_group, page, lo, hi),
            hand=(pair_a, pair_b) if pair_a and pair_b else None,
        )

    @get("/sessions/{session_id:int}/group", sync_to_thread=True)
    def session_group(
        self,
        services: Services,
        session_id: int,
        group: str | None = None,
        sort: str | None = None,
        verdict: str | None = None,
        q: str | None = None,
        open_group: str | None = Parameter(query="open", default=None),
        page: str | None = None,
        lo: str | None = None,
        hi: str | None = None,
    ) -> Template:
        """One group of the session page's table (`open`: its key) at `page`, as the page renders it: what the
        page's script swaps in when a group is opened or paged without a reload."""
        params = ViewParams.parse(group, sort, verdict, q, open_group, page, lo, hi)
        with services.sessions() as db:
            session = catalog.get_session(db, session_id)
            report = session_pairs(db, session_id)
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

    @get("/runs/{run_id:int}", sync_to_thread=True)
    def run_page(self, services: Services, run_id: int, q: str | None = None) -> Template:
        """One run's tensors in execution order with their summary statistics, each linked to its pair; `q`
        keeps the names containing it."""
        with services.sessions() as db:
            run = catalog.get_run(db, run_id)
            return Template(
                "run.html",
                context={
                    "run": run,
                    "session": catalog.get_session(db, run.session_id),
                    "rows": run_rows(db, run, q or ""),
                    "q": (q or "").strip(),
                },
            )

    @post("/runs/{run_id:int}/label", sync_to_thread=True)
    def relabel_run(self, services: Services, run_id: int, data: FormData = FORM) -> Redirect:
        """Rename a run (its label is unique in its session)."""
        with services.sessions.begin() as db:
            run = catalog.relabel_run(db, run_id, data.get("label", ""))
            session_id = run.session_id
        return Redirect(f"/sessions/{session_id}#runs", status_code=303)

    @get("/sessions/{session_id:int}/profiles", sync_to_thread=True)
    def session_profiles_page(self, services: Services, session_id: int, dim: str = "") -> Template:
        """Every pair's error profile along the aligned dimension `dim`, as one heatmap (pairs × index); without
        `dim`, the form to pick it."""
        with services.sessions() as db:
            session = catalog.get_session(db, session_id)
            ranks = [len(p.aligned_shape) for p in session_pairs(db, session_id).pairs if p.aligned_shape is not None]
            dims = [(d, sum(1 for r in ranks if r > d)) for d in range(max(ranks, default=0))]
            chosen, profiles = None, None
            if dim.strip():
                try:
                    chosen = int(dim)
                except ValueError:
                    raise InvalidInputError(f"dim must be an aligned dimension (a whole number), got {dim!r}") from None
                profiles = session_profiles(db, services.comparisons, session_id, chosen)
            context = {"session": session, "dims": dims, "dim": chosen, "profiles": profiles}
            context["heatmap"] = heatmap(profiles) if profiles is not None else None
            return Template("session_profiles.html", context=context)

    @get("/sessions/{session_id:int}/pairs.csv", sync_to_thread=True)
    def pairs_csv(self, services: Services, session_id: int) -> Response[str]:
        with services.sessions() as db:
            session = catalog.get_session(db, session_id)
            report = session_pairs(db, session_id)
            rows = apply_order(report.pairs, session.pair_order)
        several = {c.run_id: c.label for c in report.candidates} if len(report.candidates) > 1 else None
        return Response(
            pairs_to_csv(rows, several),
            media_type="text/csv; charset=utf-8",
            headers={"content-disposition": f'attachment; filename="session-{session_id}-pairs.csv"'},
        )

    @post("/sessions/{session_id:int}/tolerances", sync_to_thread=True)
    def set_tolerances(self, services: Services, session_id: int, data: FormData = FORM) -> Redirect:
        if data.get("action") == "reset":
            services.actions.set_tolerances(session_id, None, None)
        else:
            ulp = _optional_float(data.get("ulp"), "ulp")
            if ulp is not None and not ulp.is_integer():
                raise InvalidInputError(f"ulp must be a whole number, got {ulp}")
            services.actions.set_tolerances(
                session_id,
                _optional_float(data.get("rtol"), "rtol"),
                _optional_float(data.get("atol"), "atol"),
                None if ulp is None else int(ulp),
            )
        return Redirect(f"/sessions/{session_id}", status_code=303)

    @post("/sessions/{session_id:int}/pairs", sync_to_thread=True)
    def pair_by_hand(self, services: Services, session_id: int, data: FormData = FORM) -> Template | Redirect:
        """Pair two tensors by hand. Where their shapes differ, the page first offers the alignments that fit
        (`alignment`: the number of the one chosen, or "auto"); pairs at once where they agree."""
        a_name, b_name = data.get("a_name", ""), data.get("b_name", "")
        if not a_name or not b_name:
            raise InvalidInputError("choose a tensor of each run to pair")
        chosen = data.get("alignment")
        try:
            with services.sessions() as db:
                offered = hand_pair_choices(db, session_id, a_name, b_name)
            steps = None
            if chosen is None and not offered.same_shape and offered.choices:
                query = urlencode({"pair_a": a_name, "pair_b": b_name})
                return Redirect(f"/sessions/{session_id}?{query}#hand-pair", status_code=303)
            if chosen not in (None, "auto"):
                if not chosen.isdigit() or int(chosen) >= len(offered.choices):
                    raise InvalidInputError(f"no alignment numbered {chosen!r} fits these tensors")
                steps = offered.choices[int(chosen)].steps
            services.actions.pair_by_hand(session_id, a_name, b_name, alignment=steps)
        except InvalidInputError as exc:
            return _session_template(services, session_id, ViewParams(), hand_error=str(exc), status_code=400)
        return Redirect(f"/sessions/{session_id}", status_code=303)

    @post("/sessions/{session_id:int}/pairing-rules", sync_to_thread=True)
    def set_pairing_rules(self, services: Services, session_id: int, data: FormData = FORM) -> Template | Redirect:
        """The chain of strategies (a comma list, the fuzzy threshold apart) and the name pattern; pairs the
        session again. Refused rules are shown on the page, next to the form, as typed."""
        try:
            strategies, pattern = rules_from_form(data)
            services.actions.set_pairing_rules(session_id, strategies, pattern)
        except InvalidInputError as exc:
            return _session_template(
                services, session_id, ViewParams(), pairing=PairingForm.typed(data, str(exc)), status_code=400
            )
        return Redirect(f"/sessions/{session_id}#pairing", status_code=303)

    @get("/sessions/{session_id:int}/pairing.json", sync_to_thread=True)
    def pairing_file(self, services: Services, session_id: int) -> Response[dict[str, Any]]:
        """The session's pairing file (what GET /api/sessions/{id}/pairing answers) as a download."""
        with services.sessions() as db:
            data = export_pairing(db, session_id)
        return Response(
            data,
            media_type="application/json",
            headers={"content-disposition": f'attachment; filename="session-{session_id}-pairing.json"'},
        )

    @post("/sessions/{session_id:int}/pairing", request_max_body_size=PAIRING_FILE_LIMIT)
    async def upload_pairing_file(
        self, services: Services, session_id: int, request: Request[Any, Any, Any]
    ) -> Template | Redirect:
        """A pairing file posted from the page (`file`), applied as PUT /api/sessions/{id}/pairing applies it."""
        batch = await receive_multipart(
            request.headers.get("content-type", ""), request.stream(), services.settings.staging_dir
        )
        try:
            if not batch.files:
                raise InvalidInputError("choose a pairing file (JSON) to upload")
            upload = batch.files[0]
            data = parse_json(upload.path.read_bytes(), Any, what=upload.filename)
            await anyio.to_thread.run_sync(services.actions.import_pairing, session_id, data)
        except InvalidInputError as exc:
            return await anyio.to_thread.run_sync(
                partial(_session_template, services, session_id, ViewParams(), upload_error=str(exc), status_code=400)
            )
        finally:
            batch.discard()
        return Redirect(f"/sessions/{session_id}#pairing", status_code=303)

    @post("/sessions/{session_id:int}/order", sync_to_thread=True)
    def move_pair(self, services: Services, session_id: int, data: FormData = FORM) -> Redirect:
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

    @get("/pairs/{pair_id:int}", sync_to_thread=True)
    def pair_page(
        self,
        services: Services,
        pair_id: int,
        index: str = "",
        start: str = "",
        count: str = "",
        mode: str = "",
        a_shard: int = 0,
        a_index: str = "",
        a_start: str = "",
        a_count: str = "",
        b_shard: int = 0,
        b_index: str = "",
        b_start: str = "",
        b_count: str = "",
        profile: str = "",
    ) -> Template:
        """A pair's statistics, alignment and the value inspector; the window lives in the URL. `mode=manual`
        adds each run's own values with its own dimension controls (a_* and b_* parameters); `profile=D` plots the
        error profile along aligned dimension D."""
        manual = (
            {"a": ManualSide(a_shard, a_index, a_start, a_count), "b": ManualSide(b_shard, b_index, b_start, b_count)}
            if mode == "manual"
            else None
        )
        with services.sessions() as db:
            context = pair_page_context(db, services, pair_id, index, start, count, manual, profile)
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
    def pair_grid(
        self, services: Services, pair_id: int, index: str = "", start: str = "", count: str = ""
    ) -> Template:
        """Just the inspector's grids, for the page's script to swap in without a reload."""
        with services.sessions() as db:
            context = pair_page_context(db, services, pair_id, index, start, count)
            return Template("_inspector.html", context=context)

    @post("/sessions", request_max_body_size=None)
    async def create_from_form(self, services: Services, request: Request[Any, Any, Any]) -> Template | Redirect:
        """The no-script form on the sessions page: a name and files for the reference and candidate runs. Once
        the files are on disk it goes to the session page, which shows their ingest (and why one failed)."""
        batch = await receive_multipart(
            request.headers.get("content-type", ""), request.stream(), services.settings.staging_dir
        )
        name = batch.fields.get("name", "").strip()
        try:
            if not batch.files:
                raise InvalidInputError("choose at least one file for a run")
            session_id, _ = await anyio.to_thread.run_sync(
                start_session, services, name or batch.files[0].filename, "", batch, True
            )
        except TensorDebuggerError as exc:
            batch.discard()
            return _form_error(services, name, str(exc))
        except BaseException:
            batch.discard()
            raise
        return Redirect(f"/sessions/{session_id}", status_code=303)

    @post("/sessions/explore", request_max_body_size=None)
    async def explore_from_form(self, services: Services, request: Request[Any, Any, Any]) -> Template | Redirect:
        """The sessions page's explore form: one run's files (`run`), a name and a name filter (`match`, a glob).
        Waits for the ingest, then pairs every tensor with every other; past 5,000 pairs, or when nothing usable
        was found, the form says why (and no session is kept)."""
        batch = await receive_multipart(
            request.headers.get("content-type", ""), request.stream(), services.settings.staging_dir
        )
        fields = {"name": batch.fields.get("name", "").strip(), "match": batch.fields.get("match", "").strip()}
        try:
            if not batch.files:
                raise InvalidInputError("choose the files of the run to explore")
            session_id, outcomes = await anyio.to_thread.run_sync(
                explore_session,
                services,
                fields["name"] or f"explore {batch.files[0].filename}",
                "",
                batch,
                fields["match"] or None,
                "a name filter (e.g. *attn*)",
            )
        except TensorDebuggerError as exc:
            batch.discard()
            return await anyio.to_thread.run_sync(partial(_form_error, services, "", str(exc), explore=fields))
        except BaseException:
            batch.discard()
            raise
        refused = await anyio.to_thread.run_sync(_explore_error, services, fields, outcomes)
        return refused or Redirect(f"/sessions/{session_id}", status_code=303)


def _explore_error(services: Services, fields: dict[str, str], outcomes: list[RunOutcome]) -> Template | None:
    """The sessions page with why nothing was explored, when no tensor was found (None otherwise)."""
    if any(o.stored for o in outcomes):
        return None
    reasons = "; ".join(f"{p.file}: {p.reason}" for o in outcomes for p in o.problems)
    return _form_error(services, "", f"no tensors found{': ' + reasons if reasons else ''}", explore=fields)


def _session_template(
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
    with services.sessions() as db:
        session = catalog.get_session(db, session_id)
        report = session_pairs(db, session_id, modules=True)
        ordered = apply_order(report.pairs, session.pair_order)
        progress = session_progress(session, services.ingests, report.progress)
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
                "groups": build_groups(report, params, session.pair_order),
                "chart": build_chart(report.pairs, first_id),
                "first_id": first_id,
                "page_size": PAGE_SIZE,
                "reorderable": params.reorderable,
                "candidates": build_candidates(report),
                "noise_floor": has_noise_floor(report),
                "order_keys": [p.key for p in ordered],
                "pairing": pairing or PairingForm.of(session.strategies, session.name_pattern),
                "upload_error": upload_error,
                "hand_error": hand_error,
                "choices": choices,
            },
        )


def _optional_float(text: str | None, name: str) -> float | None:
    if text is None or not text.strip():
        return None
    try:
        return float(text)
    except ValueError:
        raise InvalidInputError(f"{name} must be a number, got {text!r}") from None


def _form_error(services: Services, name: str, message: str, explore: dict[str, str] | None = None) -> Template:
    """The sessions page with the new-session form's error, or (`explore`: the fields typed) the explore form's."""
    with services.sessions() as db:
        sessions = catalog.list_sessions(db)
        errors = (
            {"explore_error": message, "explore": explore} if explore is not None else {"error": message, "name": name}
        )
        return Template(
            "sessions.html",
            status_code=400,
            context={
                "sessions": sessions,
                "q": "",
                **errors,
                "summaries": catalog.summarize_sessions(db, [s.id for s in sessions]),
            },
        )
