"""The run page: one run's tensors in execution order, and its label changed."""

from __future__ import annotations

from litestar import Controller, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template

from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.web.controllers.forms import Form
from tensor_debugger.web.views.run_view import run_rows


class RunPageController(Controller):
    path = "/"
    include_in_schema = False

    @get("/runs/{run_id:int}", sync_to_thread=True)
    def run_page(
        self, services: NamedDependency[Services], run_id: FromPath[int], q: FromQuery[str | None] = None
    ) -> Template:
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
    def relabel_run(self, services: NamedDependency[Services], run_id: FromPath[int], data: Form) -> Redirect:
        """Rename a run (its label is unique in its session)."""
        with services.sessions.begin() as db:
            run = catalog.relabel_run(db, run_id, data.get("label", ""))
            session_id = run.session_id
        return Redirect(f"/sessions/{session_id}#runs", status_code=303)
