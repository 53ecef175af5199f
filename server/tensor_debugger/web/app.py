"""create_app(settings): the Litestar application. Nothing is built at import time."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from litestar import Litestar, MediaType, Request, Response
from litestar.connection import ASGIConnection
from litestar.contrib.jinja import JinjaTemplateEngine
from litestar.di import Provide
from litestar.exceptions import HTTPException, NotFoundException, ValidationException
from litestar.handlers import BaseRouteHandler, HTTPRouteHandler
from litestar.response import Template
from litestar.routes import HTTPRoute
from litestar.static_files import create_static_files_router
from litestar.template import TemplateConfig

from tensor_debugger import __version__
from tensor_debugger.compare.formatting import register_filters
from tensor_debugger.compare.plan import sessions_needing_plan
from tensor_debugger.demo.session import ensure_demo_session
from tensor_debugger.errors import (
    ConflictError,
    FileProblem,
    InvalidInputError,
    NotFoundError,
    NothingUsableError,
    TensorDebuggerError,
    TooLargeError,
)
from tensor_debugger.resources import resource_dir
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.reports import problem_reports
from tensor_debugger.web.controllers.pages import PageController
from tensor_debugger.web.controllers.pairing import SessionPairingController
from tensor_debugger.web.controllers.pairs import PairController, SessionOrderController, SessionPairsController
from tensor_debugger.web.controllers.runs import RunController
from tensor_debugger.web.controllers.sessions import SessionController
from tensor_debugger.web.controllers.tensors import TensorController
from tensor_debugger.web.error_responses import MAX_INT64, ErrorReport
from tensor_debugger.web.json_bodies import BoundedRequest
from tensor_debugger.web.openapi_viewer import REDOC_BUNDLE, openapi_config
from tensor_debugger.web.security import SecurityPolicy, install

_STATUS = {
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


def _error_response(request: Request[Any, Any, Any], exc: TensorDebuggerError) -> Response[Any]:
    status = status_for(exc)
    problems = problem_reports(exc.problems) if isinstance(exc, NothingUsableError) else None
    return _refusal(request, ErrorReport(status, str(exc), problems))


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
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
    """The methods of the route that `path` matches (its parameters' types aside), for a 405's `Allow`."""
    path = path.rstrip("/") or "/"
    for route in app.routes:
        pattern = re.sub(r"\\{[^}]*\\}", "[^/]+", re.escape(route.path.rstrip("/") or "/"))
        if isinstance(route, HTTPRoute) and re.fullmatch(pattern, path):
            return sorted(route.methods)
    return []


def _reason(exc: HTTPException) -> str:
    if not isinstance(exc, ValidationException) or not isinstance(exc.extra, list) or not exc.extra:
        return exc.detail
    failures = "; ".join(
        f"{e.get('source', 'body')} {e['key']!r}: {e.get('message')}" if e.get("key") else str(e.get("message"))
        for e in exc.extra
        if isinstance(e, dict)
    )
    return f"{exc.detail}: {failures}" if failures else exc.detail


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


def static_hashes() -> dict[str, str]:
    """Content hash of every static file, so its URL changes whenever it does (no stale cache, no bundler)."""
    folder = resource_dir("web") / "static"
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()[:12]
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def create_app(settings: Settings, services: Services | None = None) -> Litestar:
    """The app for `settings`. On start-up it migrates the database, recovers from killed ingests and, on a
    new data directory, creates the demo session."""
    holder: dict[str, Services] = {}
    hashes = static_hashes()
    policy = SecurityPolicy.from_settings(settings)

    def static_url(name: str) -> str:
        return f"/static/{name}?h={hashes.get(name, '0')}"

    def startup(app: Litestar) -> None:
        opened = holder["services"] = services or open_services(settings)
        worker = app.state.worker = opened.worker
        with opened.sessions() as db:
            unplanned = sessions_needing_plan(db)
        for session_id in unplanned:  # runs ingested from the command line while no server ran
            opened.comparisons.plan(session_id)
        if settings.demo:
            ensure_demo_session(opened)
        worker.start()  # picks up pending pairs, those of a computation killed last time included

    def shutdown(app: Litestar) -> None:
        worker = getattr(app.state, "worker", None)
        if worker is not None:
            worker.stop()
        if services is None and "services" in holder:
            holder["services"].close()

    def provide_services() -> Services:
        return holder["services"]

    def configure_jinja(engine: JinjaTemplateEngine) -> None:
        env = engine.engine
        env.globals["static"] = static_url
        env.globals["version"] = __version__
        env.globals["csrf_token"] = policy.form_token  # every POST form's first field (web/security.py)
        register_filters(env)

    app = Litestar(
        route_handlers=[
            SessionController,
            SessionPairsController,
            SessionOrderController,
            PairController,
            RunController,
            TensorController,
            SessionPairingController,
            PageController,
            create_static_files_router(path="/static", directories=[resource_dir("web") / "static"]),
        ],
        dependencies={"services": Provide(provide_services, sync_to_thread=False)},
        on_startup=[startup],
        on_shutdown=[shutdown],
        exception_handlers={TensorDebuggerError: _error_response, HTTPException: _http_error},
        guards=[known_ids],
        request_class=BoundedRequest,
        template_config=TemplateConfig(
            directory=resource_dir("web") / "templates", engine=JinjaTemplateEngine, engine_callback=configure_jinja
        ),
        openapi_config=openapi_config("Tensor Debugger", __version__, redoc_url=static_url(REDOC_BUNDLE)),
        request_max_body_size=settings.max_upload_bytes,
        debug=False,
    )
    install(app, policy)  # Host, same-origin and form-token checks; security headers on every response
    return app
