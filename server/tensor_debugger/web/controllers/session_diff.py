"""Two sessions side by side: the API's `/api/sessions/compare?a=&b=` and the page `/sessions/compare?a=&b=` (a
form to pick both when they are not given)."""

from __future__ import annotations

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import FromQuery
from litestar.response import Template

from tensor_debugger.compare.reports.session_diff import Change, SessionDiff, diff_sessions
from tensor_debugger.errors import NotFoundError
from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.web.error_responses import MAX_INT64, error_responses
from tensor_debugger.web.views.diff_chart import build_diff_chart


def checked_diff(services: Services, a: int, b: int) -> SessionDiff:
    """The diff of sessions `a` and `b`; an id outside 0 to 2^63-1 names no session (404), as in a path."""
    for session_id in (a, b):
        if not 0 <= session_id <= MAX_INT64:
            raise NotFoundError(f"no session with id {session_id}")
    with services.sessions() as db:
        return diff_sessions(db, a, b)


class SessionDiffController(Controller):
    tags = ["sessions"]

    @get("/api/sessions/compare", sync_to_thread=True, responses=error_responses(404))
    def compare_sessions(
        self, services: NamedDependency[Services], a: FromQuery[int], b: FromQuery[int]
    ) -> SessionDiff:
        """Pairs of session `a` and session `b` matched by name (by candidate label too where a session has
        several candidates): each one's verdict and max |diff| in both, B / A, and the change ("fixed",
        "broken", "better", "worse", "same", "only in A", "only in B", "not compared", "pending": not compared yet),
        with how many of each."""
        return checked_diff(services, a, b)

    @get("/sessions/compare", sync_to_thread=True, include_in_schema=False)  # a page, like the page controllers'
    def compare_sessions_page(
        self,
        services: NamedDependency[Services],
        a: FromQuery[int | None] = None,
        b: FromQuery[int | None] = None,
        changed: FromQuery[bool] = False,
    ) -> Template:
        """Did my fix help, and did it break anything else: session `a` (before) against `b` (after); `changed`:
        the table lists only the pairs whose change is not "same" (the chart and the counts keep every pair)."""
        diff = checked_diff(services, a, b) if a is not None and b is not None else None
        with services.sessions() as db:
            sessions = catalog.list_sessions(db)
        rows = [] if diff is None else [p for p in diff.pairs if not changed or p.change != Change.SAME]
        chart = None if diff is None else build_diff_chart(diff)
        return Template(
            "session_diff.html",
            context={
                "sessions": sessions,
                "diff": diff,
                "rows": rows,
                "chart": chart,
                "a": a,
                "b": b,
                "changed": changed,
            },
        )
