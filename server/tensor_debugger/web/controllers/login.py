"""Signing in and out with a token, for browsers (web/auth.py). Registered only when the server has a token."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, get, post
from litestar.datastructures import Cookie
from litestar.di import NamedDependency
from litestar.params import FromQuery
from litestar.response import Redirect, Template

from tensor_debugger.errors import TooManyWrongTokens
from tensor_debugger.web.auth import (
    COOKIE_NAME,
    LOGIN_PATH,
    LOGOUT_PATH,
    SESSION_SECONDS,
    Authenticator,
    client_address,
    cookie_value,
    request_access,
    safe_next,
)
from tensor_debugger.web.controllers.forms import Form


def _session_cookie(request: Request[Any, Any, Any], value: str, max_age: int) -> Cookie:
    """HttpOnly and SameSite=Strict always; Secure over https, which a trusted reverse proxy's X-Forwarded-Proto
    also sets (uvicorn's proxy headers, `TENSOR_DEBUGGER_TRUSTED_PROXIES`)."""
    return Cookie(
        key=COOKIE_NAME,
        value=value,
        max_age=max_age,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


class LoginController(Controller):
    path = "/"
    include_in_schema = False

    @get(LOGIN_PATH, sync_to_thread=False)
    def login_page(self, request: Request[Any, Any, Any], next: FromQuery[str | None] = None) -> Template:
        return Template(
            "login.html", context={"next": safe_next(next), "error": None, "current": request_access(request.scope)}
        )

    @post(LOGIN_PATH, sync_to_thread=False)
    def login(
        self, request: Request[Any, Any, Any], authenticator: NamedDependency[Authenticator], data: Form
    ) -> Template | Redirect:
        target = safe_next(data.get("next"))
        try:
            access = authenticator.sign_in(data.get("token", "").strip(), client_address(request.scope))
        except TooManyWrongTokens as refused:
            return Template(
                "login.html",
                status_code=429,
                headers={"retry-after": str(refused.retry_after)},
                context={"next": target, "error": str(refused).capitalize() + ".", "current": None},
            )
        if access is None:
            return Template(
                "login.html",
                status_code=401,
                context={"next": target, "error": "That is not this server's token.", "current": None},
            )
        cookie = _session_cookie(request, authenticator.issue(access), SESSION_SECONDS)
        return Redirect(target, status_code=303, cookies=[cookie])

    @post(LOGOUT_PATH, sync_to_thread=True)  # writes the sign-out: may wait for the database's writer lock
    def logout(
        self, request: Request[Any, Any, Any], authenticator: NamedDependency[Authenticator], data: Form
    ) -> Redirect:
        authenticator.revoke(cookie_value({"cookie": request.headers.get("cookie", "")}))
        return Redirect(LOGIN_PATH, status_code=303, cookies=[_session_cookie(request, "", 0)])
