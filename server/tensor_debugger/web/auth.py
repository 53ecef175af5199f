"""Who may use a server that has a token (`TENSOR_DEBUGGER_TOKEN`, `TENSOR_DEBUGGER_READ_TOKEN`).

Without either setting nothing here runs: the server is one user's, on loopback. With one, every request must
show a token, one of two ways:

- **Bearer.** `Authorization: Bearer <token>` (the API's clients: scripts, the CLI, `capture(server=...)`). A
  request without it, or with another token, is answered 401 with `WWW-Authenticate: Bearer`.
- **Session cookie.** A browser signs in on `/login` with a token and gets a cookie (HttpOnly, SameSite=Strict,
  Secure over https): `<access>.<expiry>.<nonce>.<mac>`, signed by itsdangerous (`Signer`: an HMAC-SHA256 keyed by
  a key derived from that access's token, compared in constant time). It holds no token; changing a token ends
  the sessions signed with it; signing out revokes one in the database (store/sign_outs.py), so no replica, and no
  restart, takes it again. A browser without a valid cookie asking for a page is sent to `/login`.

Tokens are compared as SHA-256 digests with `hmac.compare_digest`, so the time taken says nothing of the token,
its length included; a client address that presents too many wrong ones, or a wrong token presented too often,
waits (web/sign_in_limits.py: 429); a right token always gets in.
The read token's holder may GET anything (pages, API, slices, exports) and is refused with 403 on every POST, PUT,
PATCH and DELETE, signing out excepted. The login page and the static files it needs are open to all, and so is
`/healthz` (it says only whether the database and the store answer).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from urllib.parse import quote

import anyio.to_thread
from itsdangerous import BadSignature, Signer
from litestar.enums import ScopeType
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Receive, Scope, Send

from tensor_debugger.errors import TooManyWrongTokens
from tensor_debugger.settings import Settings
from tensor_debugger.store.sign_outs import SignOuts
from tensor_debugger.web.security import UNSAFE_METHODS, is_api, request_headers, send_refusal
from tensor_debugger.web.sign_in_limits import SignInLimits

ACCESS_KEY = "tensor_debugger.access"  # where the middleware leaves the request's Access in the ASGI scope
COOKIE_NAME = "tensor_debugger_session"
SESSION_SECONDS = 12 * 3600  # a working day; then the login page again
LOGIN_PATH = "/login"
LOGOUT_PATH = "/logout"
# the login page's style sheet; the command line's warm path (web/controllers/local.py), which checks the token
# of server.json in the data dir, readable by its owner only, instead of these tokens
OPEN_PREFIXES = ("/static/", "/api/local")
HEALTH_PATH = "/healthz"  # web/controllers/health.py: for orchestrators, which hold no token; says only ok or not
OPEN_PATHS = frozenset({LOGIN_PATH, LOGOUT_PATH, HEALTH_PATH})
_COOKIE_KEY_LABEL = b"tensor-debugger session cookie v1"


class Access(enum.Enum):
    """What a request may do: `write` (the token) changes things, `read` (the read token) only looks."""

    WRITE = "write"
    READ = "read"


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


class Authenticator:
    """The tokens of one server, the wrong tokens lately presented, and where sign-outs are kept."""

    def __init__(self, tokens: dict[Access, str], sign_outs: Callable[[], SignOuts]) -> None:
        self.tokens = tokens
        self.sign_outs = sign_outs  # the database's, once the server has started
        self.limits = SignInLimits()

    @classmethod
    def from_settings(cls, settings: Settings, sign_outs: Callable[[], SignOuts]) -> Authenticator | None:
        """None when the settings name no token: nothing to check."""
        tokens = {Access.WRITE: settings.token, Access.READ: settings.read_token}
        present = {access: token for access, token in tokens.items() if token}
        return cls(present, sign_outs) if present else None

    def access_for_token(self, candidate: str | None) -> Access | None:
        if not candidate:
            return None
        found = None
        given = _digest(candidate)
        for access, token in self.tokens.items():  # every token compared, whichever matches
            if hmac.compare_digest(given, _digest(token)):
                found = access
        return found

    def sign_in(self, candidate: str | None, client: str) -> Access | None:
        """The access of the token a client at address `client` presents. A right token always gets in, however
        many wrong ones came before it from that address. A wrong one counts against the address and against the
        token itself (a stale token a script keeps sending, from whatever address); raises TooManyWrongTokens
        while either must wait, else answers None."""
        access = self.access_for_token(candidate)
        if access is not None:
            return access
        keys = {"from this address": f"address {client}", "of this token": f"token {_digest(candidate or '').hex()}"}
        for why, key in keys.items():
            wait = self.limits.retry_after(key)
            if wait is not None:
                raise TooManyWrongTokens(wait, why)
        for key in keys.values():
            self.limits.failed(key)
        return None

    def _signer(self, access: Access) -> Signer:
        """Signs and checks the cookies of `access`, with a key derived from its token (HMAC of the label)."""
        return Signer(self.tokens[access], salt=_COOKIE_KEY_LABEL, key_derivation="hmac", digest_method=hashlib.sha256)

    def issue(self, access: Access, now: float | None = None) -> str:
        """A new session cookie's value for `access`."""
        expires = int((time.time() if now is None else now) + SESSION_SECONDS)
        return self._signer(access).sign(f"{access.value}.{expires}.{secrets.token_urlsafe(16)}").decode()

    def _parse(self, cookie: str, now: float) -> tuple[Access, str, float] | None:
        """(access, nonce, expiry) of a cookie this server signed that has not expired; None for any other."""
        parts = cookie.split(".")
        if len(parts) != 4:
            return None
        kind, expires, nonce, _ = parts
        try:
            access = Access(kind)
            expiry = float(int(expires))
        except ValueError:
            return None
        if access not in self.tokens or expiry <= now:
            return None
        signer = self._signer(access)
        try:
            payload = signer.unsign(cookie)
        except BadSignature:
            return None
        # Base64 leaves the last character's low bits unused, so more than one spelling decodes to the right
        # signature: only the one this server wrote opens anything.
        if not hmac.compare_digest(signer.sign(payload), cookie.encode()):
            return None
        return access, nonce, expiry

    def access_for_cookie(self, cookie: str | None, now: float | None = None) -> Access | None:
        if not cookie:
            return None
        parsed = self._parse(cookie, time.time() if now is None else now)
        if parsed is None or self.sign_outs().signed_out(parsed[1]):  # one row asked for by its primary key
            return None
        return parsed[0]

    def revoke(self, cookie: str | None, now: float | None = None) -> None:
        """Sign a session out: its cookie is refused from now on, by every process on the database, even if the
        browser keeps it."""
        moment = time.time() if now is None else now
        parsed = self._parse(cookie or "", moment)
        if parsed is not None:
            self.sign_outs().record(parsed[1], parsed[2], moment)


def request_access(scope: Scope) -> Access | None:
    """The request's access as the middleware found it; WRITE when the server has no token (its user may do all)."""
    access = scope.get(ACCESS_KEY, Access.WRITE)
    return access if isinstance(access, Access) else None


def cookie_value(headers: dict[str, str], name: str = COOKIE_NAME) -> str | None:
    for item in headers.get("cookie", "").split(";"):
        key, _, value = item.strip().partition("=")
        if key == name:
            return value
    return None


def bearer_token(headers: dict[str, str]) -> str | None:
    """The token of an `Authorization: Bearer` header; "" for an Authorization header of another kind."""
    header = headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _is_open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


class AuthMiddleware(ASGIMiddleware):
    """Finds each request's access and refuses what it may not do (the app's middleware after SecurityMiddleware,
    which checks Host, Origin and form tokens first; the app's `before_send` hook adds the security headers to
    these refusals too)."""

    scopes = (ScopeType.HTTP,)

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        headers = request_headers(scope)
        path = scope.get("path", "")
        method = str(scope.get("method", "GET")).upper()
        bearer = bearer_token(headers)
        if bearer is not None:
            try:
                access = self.authenticator.sign_in(bearer, client_address(scope))
            except TooManyWrongTokens as refused:
                await send_refusal(send, headers, 429, str(refused), retry_after(refused))
                return
            if access is None:
                await send_refusal(
                    send, headers, 401, "the bearer token is not this server's", _challenge('error="invalid_token"')
                )
                return
        else:
            cookie = cookie_value(headers)
            # a signed cookie is looked up among the sign-outs in the database: off the event loop, which a
            # slow database (PostgreSQL across a network) would otherwise hold up for every request
            access = await anyio.to_thread.run_sync(self.authenticator.access_for_cookie, cookie) if cookie else None
        scope[ACCESS_KEY] = access  # type: ignore[literal-required]
        if _is_open(path):
            await next_app(scope, receive, send)
            return
        if access is None:
            if method in ("GET", "HEAD") and not is_api(path) and "text/html" in headers.get("accept", ""):
                await _redirect_to_login(send, scope)
            else:
                await send_refusal(
                    send, headers, 401, "this server needs a token: Authorization: Bearer <token>", _challenge()
                )
            return
        if access is Access.READ and method in UNSAFE_METHODS:
            await send_refusal(send, headers, 403, "a read-only token may look at everything and change nothing")
            return
        await next_app(scope, receive, send)


def client_address(scope: Scope) -> str:
    """The client's address as uvicorn gives it (a trusted proxy's `X-Forwarded-For` already applied)."""
    client = scope.get("client")
    return str(client[0]) if client else ""


def retry_after(refused: TooManyWrongTokens) -> list[tuple[bytes, bytes]]:
    return [(b"retry-after", str(refused.retry_after).encode())]


def _challenge(extra: str = "") -> list[tuple[bytes, bytes]]:
    value = 'Bearer realm="tensor-debugger"' + (f", {extra}" if extra else "")
    return [(b"www-authenticate", value.encode())]


async def _redirect_to_login(send: Send, scope: Scope) -> None:
    target = scope.get("path", "/")
    if scope.get("query_string"):
        target += "?" + scope["query_string"].decode("latin-1")
    location = f"{LOGIN_PATH}?next={quote(target, safe='')}"
    await send(
        {
            "type": "http.response.start",
            "status": 303,
            "headers": [(b"location", location.encode()), (b"content-length", b"0")],
        }
    )
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path of this server, never another site (`//evil`, `/\\evil`, a scheme)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")) or any(c in target for c in "\r\n"):
        return "/"
    return target
