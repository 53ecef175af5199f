"""How the app refuses a request: the project's errors and Litestar's own (validation, no such route, a method
the route does not take, a body too large) as one `ErrorReport` (an error page for a browser outside /api), and
the guard that keeps ids too large for the database from reaching it."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from litestar import Litestar, MediaType, Request, Response
from litestar.connection import ASGIConnection
from litestar.exceptions import HTTPException, NotFoundException, ValidationException
from litestar.handlers import BaseRouteHandler, HTTPRouteHandler
from litestar.response import Template
from litestar.routes import HTTPRoute
from sqlalchemy.exc import DBAPIError

from tensor_debugger.errors import (
    ConflictError,
    DatabaseUnavailableError,
    DiskFullError,
    FileProblem,
    InvalidInputError,
    NotFoundError,
    NothingUsableError,
    StoreUnavailableError,
    StoreWriteError,
    TensorDebuggerError,
    TooLargeError,
    TooManyWrongTokens,
    is_disk_full,
)
from tensor_debugger.store.database import database_outage
from tensor_debugger.store.layout import MissingChunkError
from tensor_debugger.store.reports import problem_reports
from tensor_debugger.web.error_responses import MAX_INT64, ErrorReport

_log = logging.getLogger(__name__)
_STATUS = {
    DiskFullError: 507,
    DatabaseUnavailableError: 503,
    StoreUnavailableError: 503,
    StoreWriteError: 503,
    TooManyWrongTokens: 429,
    TooLargeError: 413,
    NotFoundError: 404,
    InvalidInputError: 400,
    ConflictError: 409,
    NothingUsableError: 422,
    FileProblem: 422,
}


def status_for(exc: TensorDebuggerError) -> int:
    for kind, status in _STATUS.items():
        if isinstance(exc, kind):
            return status
    return 400


# how long a client is asked to wait before trying again a request refused while the database or store is down
RETRY_AFTER_SECONDS = 5


def error_response(request: Request[Any, Any, Any], exc: TensorDebuggerError) -> Response[Any]:
    status = status_for(exc)
    problems = problem_reports(exc.problems) if isinstance(exc, NothingUsableError) else None
    headers = {"retry-after": str(RETRY_AFTER_SECONDS)} if status == 503 else None
    return _refusal(request, ErrorReport(status, str(exc), problems), headers)


def database_error(database_url: str) -> Callable[[Request[Any, Any, Any], DBAPIError], Response[Any]]:
    """The handler of SQLAlchemy's errors: a database that did not answer is 503 with `Retry-After` and a detail
    naming it (its password hidden), a full disk 507; anything else an internal error, as Litestar answers it."""

    def handle(request: Request[Any, Any, Any], exc: DBAPIError) -> Response[Any]:
        outage = database_outage(exc, database_url)
        if outage is not None:
            return error_response(request, outage)
        if is_disk_full(exc):
            return error_response(request, DiskFullError("the metadata database"))
        _log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return _refusal(request, ErrorReport(500, "Internal Server Error"))

    return handle


def damaged_store(request: Request[Any, Any, Any], exc: MissingChunkError) -> Response[Any]:
    """A chunk missing from an array written whole (a slice, a heatmap, an inspector's read): the server's data dir
    is damaged, which a 500 says with the chunk named, never the fill value's zeros as values."""
    _log.error("%s %s: %s", request.method, request.url.path, exc)
    return _refusal(request, ErrorReport(500, str(exc)))


def http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    """Litestar's own refusals (validation, no such route, a method the route does not take, a body too large),
    with their headers (a 405's `Allow`) and, for a validation error, what failed where."""
    detail = _reason(exc)
    if exc.status_code == 413 and isinstance(handler := request.scope.get("route_handler"), HTTPRouteHandler):
        detail = f"the body is larger than the {handler.resolve_request_max_body_size()} bytes this operation takes"
    headers = dict(exc.headers or {})
    if exc.status_code == 405 and not any(k.lower() == "allow" for k in headers):  # Litestar before 2.18 sends none
        headers["allow"] = ", ".join(allowed_methods(request.app, request.url.path))
    return _refusal(request, ErrorReport(exc.status_code, detail), headers)


def allowed_methods(app: Litestar, path: str) -> list[str]:
    """Every method of the routes that `path` matches (an int parameter matching digits only, others anything
    but a slash), for a 405's `Allow` and an OPTIONS answer."""
    path = path.rstrip("/") or "/"
    methods: set[str] = set()
    for route in app.routes:
        pattern = re.escape(route.path.rstrip("/") or "/")
        pattern = re.sub(r"\\{[^}:]*:int\\}", r"[+-]?\\d+", pattern)  # /api/sessions/compare is no session's
        pattern = re.sub(r"\\{[^}]*\\}", "[^/]+", pattern)
        if isinstance(route, HTTPRoute) and re.fullmatch(pattern, path):
            methods.update(route.methods)
    return sorted(methods)


def options_answer(request: Request[Any, Any, Any]) -> Response[None] | None:
    """The answer to OPTIONS (a `before_request` hook): 204 with `Allow` naming every method of the path. Litestar's
    own OPTIONS handler names only those of one handler of a path that has several (DELETE and OPTIONS only, for
    a session, which also takes GET and PATCH)."""
    if request.method != "OPTIONS":
        return None
    return Response(None, status_code=204, headers={"allow": ", ".join(allowed_methods(request.app, request.url.path))})


def _reason(exc: HTTPException) -> str:
    """The detail, and for a validation error what failed where (Litestar keeps that in `extra`)."""
    if not isinstance(exc, ValidationException) or not isinstance(exc.extra, list):
        return exc.detail
    failures = "; ".join(_failure(e) for e in exc.extra if isinstance(e, dict))
    return f"{exc.detail}: {failures}" if failures else exc.detail


def _failure(error: dict[str, Any]) -> str:
    """One of a ValidationException's errors (Litestar's free-form dict): "body 'name': Expected `str`, got
    `int`"."""
    if not error.get("key"):
        return str(error.get("message"))
    source = error.get("source", "body")
    return f"{getattr(source, 'value', source)} {error['key']!r}: {error.get('message')}"


def _refusal(
    request: Request[Any, Any, Any], report: ErrorReport, headers: dict[str, str] | None = None
) -> Response[Any]:
    """The error page for a browser outside /api; the report as JSON otherwise."""
    if not request.url.path.startswith("/api") and "text/html" in request.headers.get("accept", ""):
        return Template(
            "error.html",
            status_code=report.status_code,
            context={"status": report.status_code, "detail": report.detail},
            headers=headers,
        )
    return Response(report, status_code=report.status_code, media_type=MediaType.JSON, headers=headers)


def known_ids(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Every route's guard: an id in the path outside 0 to 2^63-1 names nothing (404), rather than reaching the
    database, whose integers it does not fit."""
    for name, value in connection.path_params.items():
        if isinstance(value, int) and not 0 <= value <= MAX_INT64:
            raise NotFoundException(f"no {name.removesuffix('_id')} with id {value}")
