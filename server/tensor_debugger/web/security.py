"""What keeps a page on another site from using the server through the user's browser.

An ASGI middleware (`SecurityMiddleware`, the first of the app's `middleware`, so outside every other) checks
every HTTP request a route answers, and a `before_send` hook (`add_security_headers`) sets the headers of every
response, a 404 for a path no route has included:

- **Host.** A request whose `Host` is not an allowed name is refused with 400: a page of another site that
  re-points its own name at 127.0.0.1 (DNS rebinding) gets nothing. Allowed: `localhost`, `127.0.0.1`, `[::1]`,
  the address `serve` binds to, and `allowed_hosts` (comma-separated; `.example.org` also allows its subdomains,
  `*` any name).
- **Origin.** A state-changing request (POST, PUT, PATCH, DELETE) is refused with 403 unless it is same-origin:
  `Sec-Fetch-Site` must be `same-origin` or `none` and `Origin` must be this server's own scheme://host:port,
  where the browser sent them; without an `Origin`, a `Referer` must be a page of this server (an older browser,
  or a form posted where `Origin` is left out, sends only that). A request with none of them (curl, scripts, the
  CLI, `capture(server=...)`) is not a browser's cross-site request and goes on.
- **Form token.** A state-changing request outside `/api` (the pages' HTML forms) must also carry the form token:
  an HMAC of a secret drawn at start-up, which the templates put in a hidden `csrf_token` field as each form's
  first field (or an `X-CSRF-Token` header). It is read from the start of the body without parsing the rest:
  all of a url-encoded form (at most `MAX_FORM_BYTES`), the first part of a multipart one.
- **Headers.** Every response gets a Content-Security-Policy with no inline script or style, `nosniff`,
  `X-Frame-Options` and a same-origin `Referrer-Policy`. The OpenAPI viewer (`/schema`, Redoc) may use inline
  style and a worker from a blob, which its bundle needs; SVG images may be embedded by the app's own pages.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from litestar.enums import ScopeType
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

from tensor_debugger.settings import ENV_PREFIX, Settings

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
SAME_ORIGIN_FETCH_SITES = frozenset({"same-origin", "none"})  # `none`: typed in the address bar, a bookmark
TOKEN_FIELD = "csrf_token"
TOKEN_HEADER = "x-csrf-token"
MAX_FORM_BYTES = 1024 * 1024  # a url-encoded form is read whole to find its token; the pages' are a few hundred bytes
MAX_FIRST_PART_BYTES = 64 * 1024  # a multipart form's token is its first part, which must arrive within this

PAGE_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'self'; form-action 'self'"
)
# Redoc's bundle styles its elements at run time (styled-components) and searches in a worker made from a blob.
SCHEMA_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "worker-src 'self' blob:; frame-ancestors 'none'; base-uri 'self'; form-action 'self'"
)
# The heatmap is an SVG document the pair page embeds (<object>, for the cells' hover titles): same origin only.
EMBEDDED_POLICY = "default-src 'none'; style-src 'self'; img-src 'self' data:; frame-ancestors 'self'"
SCHEMA_PREFIX = "/schema"


@dataclass(frozen=True)
class SecurityPolicy:
    """The allowed host names and the form token of one app (one process: a new start draws a new token)."""

    allowed_hosts: frozenset[str]  # normalised names; "*" allows any
    host_suffixes: tuple[str, ...]  # from ".example.org" entries: the name and its subdomains
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> SecurityPolicy:
        names = {*LOOPBACK_NAMES, normalise_host(settings.host)}
        suffixes: list[str] = []
        for entry in settings.allowed_hosts.split(","):
            entry = entry.strip()
            if entry.startswith(".") and len(entry) > 1:
                suffixes.append(normalise_host(entry[1:]))
            elif entry:
                names.add("*" if entry == "*" else normalise_host(entry))
        return cls(frozenset(names), tuple(suffixes))

    @property
    def form_token(self) -> str:
        return hmac.new(self.secret, b"tensor-debugger form token v1", hashlib.sha256).hexdigest()[:32]

    def token_matches(self, candidate: str | None) -> bool:
        return candidate is not None and hmac.compare_digest(candidate.encode(), self.form_token.encode())

    def host_allowed(self, name: str) -> bool:
        if "*" in self.allowed_hosts or name in self.allowed_hosts:
            return True
        return any(name == s or name.endswith("." + s) for s in self.host_suffixes)


def normalise_host(host: str) -> str:
    """A host name as compared: lower case, no trailing dot, no port, an IPv6 address in brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[: end + 1] if end > 0 else host
    if host.count(":") > 1:  # a bare IPv6 address, as `--host ::1` names it
        return f"[{host}]"
    return host.split(":", 1)[0].rstrip(".")


def _origin_tuple(origin: str) -> tuple[str, str, int | None] | None:
    """(scheme, host, port) of an origin or of scheme://Host, the default port made explicit; None if malformed."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname.rstrip(".")
    return parts.scheme, host, port or (443 if parts.scheme == "https" else 80)


def request_headers(scope: Scope) -> dict[str, str]:
    """The request's headers, lower-cased names, the first of each (latin-1, as HTTP sends them)."""
    found: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        found.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return found


def is_api(path: str) -> bool:
    return path == "/api" or path.startswith("/api/")


def cross_origin_reason(scope: Scope, headers: dict[str, str]) -> str | None:
    """Why a state-changing request is not from this server's own pages, or None when it may go on."""
    site = headers.get("sec-fetch-site")
    if site is not None and site.lower() not in SAME_ORIGIN_FETCH_SITES:
        return f"a cross-origin request (Sec-Fetch-Site: {site}) may not change anything here"
    origin = headers.get("origin")
    own = _origin_tuple(f"{scope.get('scheme', 'http')}://{headers.get('host', '')}")
    if origin is not None:
        if own is None or _origin_tuple(origin) != own:
            return f"a request from another origin ({origin}) may not change anything here"
        return None
    referer = headers.get("referer")
    if referer is not None and (own is None or _origin_tuple(_referer_origin(referer)) != own):
        return f"a request from another page ({referer[:200]}) may not change anything here"
    return None


def _referer_origin(referer: str) -> str:
    """scheme://host:port of a Referer (a whole URL); "" where it is none."""
    try:
        parts = urlsplit(referer)
    except ValueError:
        return ""
    return f"{parts.scheme}://{parts.netloc}"


class _Refused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


async def _read_form_token(headers: dict[str, str], receive: Receive) -> tuple[str | None, list[ReceiveMessage]]:
    """The form token from the start of the body, and the messages read to find it (to be replayed)."""
    kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    read: list[ReceiveMessage] = []
    if kind == "application/x-www-form-urlencoded":
        body = b""
        while True:
            message = await receive()
            read.append(message)
            if message["type"] != "http.request":
                return None, read
            body += message.get("body", b"")
            if len(body) > MAX_FORM_BYTES:
                raise _Refused(413, f"a form's fields may take at most {MAX_FORM_BYTES} bytes")
            if not message.get("more_body", False):
                break
        values = parse_qs(body.decode("latin-1"), keep_blank_values=True).get(TOKEN_FIELD)
        return (values[0] if values else None), read
    if kind == "multipart/form-data":
        match = re.search(r'boundary="?([^";]+)"?', headers.get("content-type", ""))
        if match is None:
            return None, read
        boundary = b"--" + match.group(1).encode("latin-1")
        body = b""
        while True:
            token, complete = _first_part_token(body, boundary)
            if complete:
                return token, read
            if len(body) > MAX_FIRST_PART_BYTES:
                return None, read
            message = await receive()
            read.append(message)
            if message["type"] != "http.request":
                return None, read
            body += message.get("body", b"")
            if not message.get("more_body", False):
                token, _ = _first_part_token(body, boundary)
                return token, read
    return None, read


def _first_part_token(body: bytes, boundary: bytes) -> tuple[str | None, bool]:
    """(the token, True) once the first part of a multipart body is all in `body`; (None, True) when that part
    is not the token (or the body does not start with a part: the pages' forms send no preamble); (None, False)
    while more bytes are needed."""
    opening = boundary + b"\r\n"
    if len(body) < len(opening):
        return None, False
    if not body.startswith(opening):
        return None, True
    head_end = body.find(b"\r\n\r\n", len(opening))
    if head_end < 0:
        return None, False
    head = body[len(opening) : head_end].decode("latin-1")
    name = re.search(r'content-disposition:[^\r\n]*;\s*name="([^"]*)"', head, re.IGNORECASE)
    if name is None or name.group(1) != TOKEN_FIELD:
        return None, True
    value_end = body.find(b"\r\n" + boundary, head_end + 4)
    if value_end < 0:
        return None, False
    return body[head_end + 4 : value_end].decode("latin-1"), True


def _replaying(read: list[ReceiveMessage], receive: Receive) -> Receive:
    pending = list(read)

    async def replay() -> ReceiveMessage:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


def security_headers(path: str, response_headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The response's headers with the security headers set (replacing any the handler set)."""
    ours = {b"content-security-policy", b"x-content-type-options", b"x-frame-options", b"referrer-policy"}
    kept = [(k, v) for k, v in response_headers if k.lower() not in ours]
    content_type = next((v for k, v in kept if k.lower() == b"content-type"), b"").lower()
    if content_type.startswith(b"image/svg+xml"):
        policy, frames = EMBEDDED_POLICY, b"SAMEORIGIN"
    elif path == SCHEMA_PREFIX or path.startswith(SCHEMA_PREFIX + "/"):
        policy, frames = SCHEMA_POLICY, b"DENY"
    else:
        policy, frames = PAGE_POLICY, b"DENY"
    return [
        *kept,
        (b"content-security-policy", policy.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"x-frame-options", frames),
        (b"referrer-policy", b"same-origin"),
    ]


def add_security_headers(message: Message, scope: Scope) -> None:
    """The app's `before_send` hook: the security headers on every HTTP response, whatever answered it (a route, a
    static file, an error, a refusal of the middlewares, a path no route has)."""
    if message["type"] == "http.response.start":
        message["headers"] = security_headers(scope.get("path", ""), message.get("headers", ()))


class SecurityMiddleware(ASGIMiddleware):
    """The Host, Origin and form-token checks above, on every HTTP request that reaches a route (static files and
    the schema included); one that a route refuses or that matches none changes nothing, and is answered 404 or
    405."""

    scopes = (ScopeType.HTTP,)

    def __init__(self, policy: SecurityPolicy) -> None:
        self.policy = policy

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        headers = request_headers(scope)
        try:
            receive = await self._check(scope, headers, receive)
        except _Refused as refused:
            await send_refusal(send, headers, refused.status, refused.detail)
            return
        await next_app(scope, receive, send)

    async def _check(self, scope: Scope, headers: dict[str, str], receive: Receive) -> Receive:
        """The request's receive (replaying what was read of the body) if it may go on; raises _Refused if not."""
        host = headers.get("host")
        if host is not None and not self.policy.host_allowed(normalise_host(host)):
            raise _Refused(
                400,
                f"this server does not answer to the host name {normalise_host(host)!r}; "
                f"a name it should answer to goes in {ENV_PREFIX}ALLOWED_HOSTS",
            )
        if str(scope.get("method", "GET")).upper() not in UNSAFE_METHODS:
            return receive
        reason = cross_origin_reason(scope, headers)
        if reason is not None:
            raise _Refused(403, reason)
        if is_api(scope.get("path", "")):
            return receive
        token = headers.get(TOKEN_HEADER)
        read: list[ReceiveMessage] = []
        if token is None:
            token, read = await _read_form_token(headers, receive)
        if not self.policy.token_matches(token):
            raise _Refused(
                403,
                "the form's token is missing or out of date (the server restarted, or the form "
                "is not one of its pages): reload the page and send it again",
            )
        return _replaying(read, receive) if read else receive


async def send_refusal(
    send: Send, headers: dict[str, str], status: int, detail: str, extra: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    """Answer `status` with `detail`: a short page for a browser (Accept: text/html), else the API's JSON error."""
    if "text/html" in headers.get("accept", ""):
        body = (
            f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{status}</title></head>'
            f'<body><h1>{status}</h1><p>{_escape(detail)}</p><p><a href="/">Sessions</a></p></body></html>'
        ).encode()
        content_type = b"text/html; charset=utf-8"
    else:
        body = json.dumps({"status_code": status, "detail": detail}).encode()
        content_type = b"application/json"
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *extra],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
