"""create_app(settings): the Litestar application. Nothing is built at import time."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from jinja2 import pass_context
from jinja2.runtime import Context
from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import HTTPException
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.static_files import create_static_files_router
from litestar.template import TemplateConfig
from sqlalchemy.exc import DBAPIError

from tensor_debugger import __version__
from tensor_debugger.compare.planning.plan import plan_session, sessions_needing_plan
from tensor_debugger.compare.reports.formatting import register_filters
from tensor_debugger.errors import TensorDebuggerError, is_second_tensor
from tensor_debugger.ingest.staging import Sweeper
from tensor_debugger.resources import resource_dir
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.layout import MissingChunkError
from tensor_debugger.web.address import ServerAddress, remove_address, write_address
from tensor_debugger.web.auth import COOKIE_NAME, Access, Authenticator, AuthMiddleware, request_access
from tensor_debugger.web.controllers.health import HealthController
from tensor_debugger.web.controllers.local import LocalController
from tensor_debugger.web.controllers.login import LoginController
from tensor_debugger.web.controllers.pair_page import PairPageController
from tensor_debugger.web.controllers.pairing import SessionPairingController
from tensor_debugger.web.controllers.pairing_page import PairingPageController
from tensor_debugger.web.controllers.pairs import PairController, SessionOrderController, SessionPairsController
from tensor_debugger.web.controllers.run_page import RunPageController
from tensor_debugger.web.controllers.runs import RunController
from tensor_debugger.web.controllers.session_diff import SessionDiffController
from tensor_debugger.web.controllers.session_page import SessionPageController
from tensor_debugger.web.controllers.sessions import SessionController
from tensor_debugger.web.controllers.sessions_page import SessionsPageController
from tensor_debugger.web.controllers.tensors import TensorController
from tensor_debugger.web.json_bodies import BoundedRequest
from tensor_debugger.web.openapi_viewer import REDOC_BUNDLE, openapi_config
from tensor_debugger.web.refusals import (
    damaged_store,
    database_error,
    error_response,
    http_error,
    known_ids,
    options_answer,
)
from tensor_debugger.web.security import SecurityMiddleware, SecurityPolicy, add_security_headers
from tensor_debugger.web.views.names import name_parts
from tensor_debugger.web.views.run_view import run_title


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
    new data directory, creates the demo session; then it says where it answers (`address.py`), until it stops."""
    hashes = static_hashes()
    policy = SecurityPolicy.from_settings(settings)
    # None: no token, every request may do everything; requests come once started, with the services opened
    authenticator = Authenticator.from_settings(settings, lambda: app.state.services.sign_outs)

    def static_url(name: str) -> str:
        return f"/static/{name}?h={hashes.get(name, '0')}"

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        """Start the services, recover, start the worker, take over killed uploads, say where the server answers,
        start the sweeper; on the way out (or where a step failed) stop what started, in the order below."""
        opened = app.state.services = services or open_services(settings)
        worker = opened.worker
        address: ServerAddress | None = None
        sweeper: Sweeper | None = None
        try:
            with opened.sessions() as db:
                unplanned = sessions_needing_plan(db)
            for session_id in unplanned:  # runs ingested from the command line while no server ran
                plan_session(opened.context, session_id)
            if settings.demo:
                # only here: the demo's generator imports torch (about a second), which a server without it never
                # needs
                from tensor_debugger.demo.session import ensure_demo_session

                ensure_demo_session(opened, building=lambda: print("building the demo session...", flush=True))
            worker.start()  # picks up pending pairs, those of a computation killed last time included
            opened.take_over_uploads()  # accepted uploads whose ingest a killed process left, from their staged files
            address = app.state.address = ServerAddress.drawn(settings.host, settings.port)
            write_address(settings.data_dir, address, settings.address_file)
            sweeper = Sweeper(opened.sweep, settings.staging_sweep_seconds)
            sweeper.start()
            yield
        finally:
            if address is not None:
                remove_address(settings.data_dir, address, settings.address_file)
            worker.stop()
            if sweeper is not None:
                sweeper.stop()
            if services is None:
                opened.close()

    def provide_services(state: State) -> Services:
        services_opened: Services = state.services
        return services_opened

    def configure_jinja(engine: JinjaTemplateEngine) -> None:
        env = engine.engine
        env.auto_reload = False  # the templates are the installed package's: compiled once, no stat per render
        env.globals["static"] = static_url
        env.globals["version"] = __version__
        env.globals["csrf_token"] = policy.form_token  # every POST form's first field (web/security.py)
        env.globals["can_change"] = _can_change
        env.globals["signed_in"] = _signed_in
        env.globals["run_title"] = run_title
        register_filters(env)
        env.filters["name_parts"] = name_parts
        env.tests["second_tensor"] = is_second_tensor  # a problem's reason: a file read, not one missing

    app = Litestar(
        route_handlers=[
            *([LoginController] if authenticator is not None else []),
            SessionDiffController,
            SessionController,
            SessionPairsController,
            SessionOrderController,
            PairController,
            RunController,
            TensorController,
            SessionPairingController,
            LocalController,
            HealthController,
            SessionsPageController,
            SessionPageController,
            PairingPageController,
            PairPageController,
            RunPageController,
            create_static_files_router(path="/static", directories=[resource_dir("web") / "static"]),
        ],
        dependencies={
            "services": Provide(provide_services, sync_to_thread=False),
            "authenticator": Provide(lambda: authenticator, sync_to_thread=False),
        },
        lifespan=[lifespan],
        # Host, same-origin and form-token checks (web/security.py), then tokens and read-only access (web/auth.py)
        middleware=[
            SecurityMiddleware(policy),
            *([AuthMiddleware(authenticator)] if authenticator is not None else []),
        ],
        before_send=[add_security_headers],  # on every response, those of the middlewares and 404s included
        exception_handlers={
            TensorDebuggerError: error_response,
            HTTPException: http_error,
            DBAPIError: database_error(settings.database_url),
            MissingChunkError: damaged_store,
        },
        guards=[known_ids],
        before_request=options_answer,
        request_class=BoundedRequest,
        template_config=TemplateConfig(
            directory=resource_dir("web") / "templates", engine=JinjaTemplateEngine, engine_callback=configure_jinja
        ),
        openapi_config=openapi_config("Tensor Debugger", __version__, redoc_url=static_url(REDOC_BUNDLE)),
        request_max_body_size=settings.max_upload_bytes,
        debug=False,
        # The app configures no logging: the process that serves it does (`serve`), so an app built inside another
        # program (a test, a notebook) leaves that program's root logger and its streams alone
        logging_config=None,
    )
    return app


@pass_context
def _can_change(context: Context) -> bool:
    """Whether the page's viewer may change things: the pages leave out the controls that would be refused."""
    request = context.get("request")
    return request is None or request_access(request.scope) is Access.WRITE


@pass_context
def _signed_in(context: Context) -> bool:
    """Whether the viewer signed in on the login page (and so has a session to sign out of)."""
    request = context.get("request")
    return request is not None and request_access(request.scope) is not None and COOKIE_NAME in request.cookies
