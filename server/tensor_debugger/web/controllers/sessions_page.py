"""The sessions page (the home page) and its forms: a new session from uploaded files, one run explored, a
session renamed or deleted."""

from __future__ import annotations

from functools import partial
from typing import Any

import anyio
from litestar import Controller, Request, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template

from tensor_debugger.compare.reports.session_summaries import judged_summaries
from tensor_debugger.errors import InvalidInputError, TensorDebuggerError
from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.web.controllers.forms import Form
from tensor_debugger.web.multipart import MultipartLimits, receive_multipart
from tensor_debugger.web.uploads import RunOutcome, client_of, explore_session, start_session


class SessionsPageController(Controller):
    path = "/"
    include_in_schema = False

    @get("/", sync_to_thread=True)
    def sessions_page(self, services: NamedDependency[Services], q: FromQuery[str | None] = None) -> Template:
        with services.sessions() as db:
            sessions = catalog.list_sessions(db, q)
            summaries = judged_summaries(
                db, catalog.summarize_sessions(db, [s.id for s in sessions]), services.stats, services.sessions
            )
            return Template("sessions.html", context={"sessions": sessions, "q": q or "", "summaries": summaries})

    @get("/sessions", sync_to_thread=False)
    def sessions_list(self) -> Redirect:
        """The address a user guesses for the list of sessions (POSTing there makes one): the home page lists them."""
        return Redirect("/", status_code=301)

    @get("/favicon.ico", sync_to_thread=False)
    def favicon(self) -> Redirect:
        """For pages without the icon link (the API viewer) and browsers that ask anyway."""
        return Redirect("/static/favicon.svg", status_code=301)

    @post("/sessions/{session_id:int}/rename", sync_to_thread=True)
    def rename(self, services: NamedDependency[Services], session_id: FromPath[int], data: Form) -> Redirect:
        services.actions.rename(session_id, data.get("name", ""))
        return Redirect("/", status_code=303)

    @post("/sessions/{session_id:int}/delete", sync_to_thread=True)
    def delete(self, services: NamedDependency[Services], session_id: FromPath[int], data: Form) -> Redirect:
        """Deleting takes a second, explicit step: the form's `confirm` field must name the session."""
        with services.sessions() as db:
            session = catalog.get_session(db, session_id)
            if data.get("confirm") != "yes":
                raise InvalidInputError(f"tick the confirmation to delete {session.name!r}")
            catalog.refuse_while_ingesting(db, session_id)
            catalog.delete_session(db, services.store, session_id)
        return Redirect("/", status_code=303)

    @post("/sessions", request_max_body_size=None)
    async def create_from_form(
        self, services: NamedDependency[Services], request: Request[Any, Any, Any]
    ) -> Template | Redirect:
        """The no-script form on the sessions page: a name and files for the reference and candidate runs. Once
        the files are on disk it goes to the session page, which shows their ingest (and why one failed)."""
        batch = await receive_multipart(
            request.headers.get("content-type", ""),
            request.stream(),
            services.settings.staging_dir,
            MultipartLimits.of(services.settings),
        )
        name = batch.fields.get("name", "").strip()
        try:
            if not batch.files:
                raise InvalidInputError("choose at least one file for a run")
            session_id, _ = await anyio.to_thread.run_sync(
                partial(
                    start_session,
                    services,
                    name or batch.files[0].filename,
                    "",
                    batch,
                    True,
                    client=client_of(request),
                )
            )
        except TensorDebuggerError as exc:
            batch.discard()
            return _form_error(services, name, str(exc))
        except BaseException:
            batch.discard()
            raise
        return Redirect(f"/sessions/{session_id}", status_code=303)

    @post("/sessions/explore", request_max_body_size=None)
    async def explore_from_form(
        self, services: NamedDependency[Services], request: Request[Any, Any, Any]
    ) -> Template | Redirect:
        """The sessions page's explore form: one run's files (`run`), a name and a name filter (`match`, a glob).
        Waits for the ingest, then pairs every tensor with every other; past 5,000 pairs, or when nothing usable
        was found, the form says why (and no session is kept)."""
        batch = await receive_multipart(
            request.headers.get("content-type", ""),
            request.stream(),
            services.settings.staging_dir,
            MultipartLimits.of(services.settings),
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
                client_of(request),
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
                "summaries": judged_summaries(
                    db, catalog.summarize_sessions(db, [s.id for s in sessions]), services.stats, services.sessions
                ),
            },
        )
