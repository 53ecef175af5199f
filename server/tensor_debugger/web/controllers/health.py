"""`GET /healthz`, for orchestrators: 200 when the database and the array store both answer, 503 when either does
not. Open without a token (it changes nothing, and says only "ok" or "did not answer" of each: the cause goes to
the server's log, not to whoever asks)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from litestar import Controller, Response, get
from litestar.di import NamedDependency
from litestar.openapi import ResponseSpec
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from tensor_debugger.errors import StoreUnavailableError
from tensor_debugger.services import Services
from tensor_debugger.store.database import shown_url
from tensor_debugger.web.auth import HEALTH_PATH
from tensor_debugger.web.refusals import RETRY_AFTER_SECONDS

OK, DOWN = "ok", "did not answer"
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HealthReport:
    """Each part the server needs: "ok", or "did not answer"."""

    database: str
    store: str

    @property
    def healthy(self) -> bool:
        return self.database == OK and self.store == OK


def check_health(services: Services) -> HealthReport:
    """Ask the database for one row and the store for one listing, now."""
    database = store = OK
    try:
        with services.sessions() as db:
            db.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        shown = shown_url(services.settings.database_url)
        _log.warning("health check: the database (%s) did not answer: %s", shown, exc)
        database = DOWN
    try:
        services.store.check()
    except StoreUnavailableError as exc:
        _log.warning("health check: %s", exc)
        store = DOWN
    return HealthReport(database, store)


class HealthController(Controller):
    path = HEALTH_PATH
    tags = ["health"]

    @get(
        "/",
        sync_to_thread=True,
        responses={503: ResponseSpec(HealthReport, description="the database or the array store did not answer")},
    )
    def health(self, services: NamedDependency[Services]) -> Response[HealthReport]:
        """Whether this server can work: the database and the array store each "ok" or "did not answer"."""
        report = check_health(services)
        if report.healthy:
            return Response(report)
        return Response(report, status_code=503, headers={"retry-after": str(RETRY_AFTER_SECONDS)})
