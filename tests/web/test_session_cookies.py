"""The login page's session cookie (web/auth.py), on the app in this process with a token and a read token: it
comes HttpOnly, SameSite=Strict and expiring; any change to it, a signature made with another key, or an expired
one opens nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from litestar import Litestar
from litestar.testing import TestClient
from tensor_debugger.settings import Settings
from tensor_debugger.web.app import create_app
from tensor_debugger.web.auth import COOKIE_NAME, SESSION_SECONDS, Access, Authenticator

from tests.support.forms import hidden
from tests.support.servers import READ_TOKEN, WRITE_TOKEN


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient[Litestar]]:
    settings = Settings(data_dir=tmp_path / "data", demo=False, token=WRITE_TOKEN, read_token=READ_TOKEN)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as test_client:
        yield test_client


def sign_in(client: TestClient[Litestar], token: str) -> tuple[str, str]:
    """(the cookie's value, its Set-Cookie header) after signing in with `token`."""
    form_token = hidden(client.get("/login").text, "csrf_token")
    signed = client.post("/login", data={"csrf_token": form_token, "token": token}, follow_redirects=False)
    assert signed.status_code == 303, signed.text
    value = client.cookies[COOKIE_NAME]
    client.cookies.clear()
    return value, signed.headers["set-cookie"]


def opens(client: TestClient[Litestar], cookie: str) -> int:
    client.cookies.clear()
    return client.get("/api/sessions", headers={"cookie": f"{COOKIE_NAME}={cookie}"}).status_code


def test_the_cookie_is_http_only_strict_and_expires(client: TestClient[Litestar]) -> None:
    value, header = sign_in(client, READ_TOKEN)
    attributes = [part.strip().lower() for part in header.split(";")]
    assert "httponly" in attributes and "samesite=strict" in attributes and "path=/" in attributes
    assert f"max-age={SESSION_SECONDS}" in attributes
    assert READ_TOKEN not in value and WRITE_TOKEN not in value
    kind, expires, _, _ = value.split(".")
    assert kind == "read" and abs(int(expires) - (time.time() + SESSION_SECONDS)) < 60
    assert opens(client, value) == 200


def test_a_changed_cookie_opens_nothing(client: TestClient[Litestar]) -> None:
    value, _ = sign_in(client, READ_TOKEN)
    kind, expires, nonce, mac = value.split(".")
    flipped = mac[:-1] + ("A" if mac[-1] != "A" else "B")
    forged = [
        f"write.{expires}.{nonce}.{mac}",  # claiming the other access
        f"{kind}.{int(expires) + 3600}.{nonce}.{mac}",  # a later expiry
        f"{kind}.{expires}.{nonce[:-1]}x.{mac}",  # another session's nonce
        f"{kind}.{expires}.{nonce}.{flipped}",  # a changed signature
        f"{kind}.{expires}.{nonce}.",  # none
        f"{kind}.{expires}.{nonce}",  # no signature part at all
        value + ".extra",
    ]
    for cookie in forged:
        assert cookie != value
        assert opens(client, cookie) == 401, cookie
    assert opens(client, value) == 200  # the original still opens


def test_a_signature_spelled_another_way_opens_nothing(client: TestClient[Litestar]) -> None:
    """Base64's last character carries unused low bits, so up to three other spellings decode to the same signature
    bytes: each is refused, whatever this cookie's last character happens to be."""
    value, _ = sign_in(client, READ_TOKEN)
    head, mac = value.rsplit(".", 1)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    same_bytes = [c for c in alphabet if c != mac[-1] and alphabet.index(c) // 4 == alphabet.index(mac[-1]) // 4]
    assert len(same_bytes) == 3
    for last in same_bytes:
        assert opens(client, f"{head}.{mac[:-1]}{last}") == 401, last
    assert opens(client, value) == 200


def test_only_this_servers_tokens_sign_cookies_and_only_until_they_expire(client: TestClient[Litestar]) -> None:
    """A cookie is keyed by the token alone: another process with the same tokens signs one this server takes (a
    replica, a restart); one signed with another token, or one past its expiry, is refused."""
    same = Authenticator({Access.WRITE: WRITE_TOKEN, Access.READ: READ_TOKEN}, lambda: pytest.fail("not asked"))
    assert opens(client, same.issue(Access.WRITE)) == 200
    other = Authenticator({Access.WRITE: "another-token-0123456789abcdef"}, lambda: pytest.fail("not asked"))
    assert opens(client, other.issue(Access.WRITE)) == 401
    assert opens(client, same.issue(Access.WRITE, now=time.time() - SESSION_SECONDS - 1)) == 401
    # the read token's key cannot sign write access, nor the other way round
    read_only = Authenticator({Access.READ: READ_TOKEN}, lambda: pytest.fail("not asked"))
    kind, rest = read_only.issue(Access.READ).split(".", 1)
    assert opens(client, f"write.{rest}") == 401
