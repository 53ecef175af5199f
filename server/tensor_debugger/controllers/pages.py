"""Server-rendered pages; each shows what an /api route serves as JSON."""

from __future__ import annotations

from typing import Any

import anyio
from litestar import Controller, Request, get, post
from litestar.params import Parameter
from litestar.response import Redirect, Template

from tensor_debugger import catalog
from tensor_debugger.errors import TensorDebuggerError
from tensor_debugger.pair_page import pair_page_context
from tensor_debugger.pair_reports import session_pairs
from tensor_debugger.services import Services
from tensor_debugger.session_uploads import RunOutcome, group_by_run, ingest_batch
from tensor_debugger.upload import receive_multipart


class PageController(Controller):
    path = "/"
    include_in_schema = False

    @get("/", sync_to_thread=True)
    def sessions_page(self, services: Services, q: str | None = Parameter(default=None)) -> Template:
        with services.sessions() as db:
            sessions = catalog.list_sessions(db, q)
            return Template("sessions.html", context={"sessions": sessions, "q": q or ""})

    @get("/sessions/{session_id:int}", sync_to_thread=True)
    def session_page(self, services: Services, session_id: int) -> Template:
        with services.sessions() as db:
            session = catalog.get_session(db, session_id)
            tensors = {run.id: catalog.list_tensors(db, run.id) for run in session.runs}
            report = session_pairs(db, session_id)
            return Template("session.html", context={"session": session, "tensors": tensors, "report": report})

    @get("/pairs/{pair_id:int}", sync_to_thread=True)
    def pair_page(self, services: Services, pair_id: int, index: str = "", start: str = "",
                  count: str = "") -> Template:
        """A pair's statistics, alignment and the value inspector; the window lives in the URL."""
        with services.sessions() as db:
            context = pair_page_context(db, services, pair_id, index, start, count)
            return Template("pair.html", context=context)

    @get("/pairs/{pair_id:int}/grid", sync_to_thread=True)
    def pair_grid(self, services: Services, pair_id: int, index: str = "", start: str = "",
                  count: str = "") -> Template:
        """Just the inspector's grids, for the page's script to swap in without a reload."""
        with services.sessions() as db:
            context = pair_page_context(db, services, pair_id, index, start, count)
            return Template("_inspector.html", context=context)

    @post("/sessions", request_max_body_size=None)
    async def create_from_form(self, services: Services, request: Request[Any, Any, Any]) -> Template | Redirect:
        """The no-script form on the sessions page: a name and files for the reference and candidate runs."""
        batch = await receive_multipart(request.headers.get("content-type", ""), request.stream(),
                                        services.settings.staging_dir)
        name = batch.fields.get("name", "").strip()
        try:
            if not batch.files:
                raise TensorDebuggerError("choose at least one file for a run")
            session_id, outcomes = await anyio.to_thread.run_sync(
                _create, services, name or batch.files[0].filename, group_by_run(batch))
        except TensorDebuggerError as exc:
            return _form_error(services, name, str(exc), [])
        finally:
            batch.discard()
        if session_id is None:
            return _form_error(services, name, "no tensors found in the uploads; nothing was kept", outcomes)
        return Redirect(f"/sessions/{session_id}", status_code=303)


def _create(services: Services, name: str, runs: dict[str, Any]) -> tuple[int | None, list[RunOutcome]]:
    with services.sessions.begin() as db:
        session_id = catalog.create_session(db, name).id
    outcomes = ingest_batch(services, name, runs)
    if all(o.run_id is None for o in outcomes):
        with services.sessions() as db:
            catalog.delete_session(db, services.store, session_id)
        return None, outcomes
    return session_id, outcomes


def _form_error(services: Services, name: str, message: str, outcomes: list[RunOutcome]) -> Template:
    with services.sessions() as db:
        sessions = catalog.list_sessions(db)
        return Template("sessions.html", status_code=400, context={
            "sessions": sessions, "q": "", "error": message, "outcomes": outcomes, "name": name})
