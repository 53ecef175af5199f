"""Signing out lasts: a cookie signed out on one server process is refused by the next one on the same database
(the same server restarted, or a replica beside it), on SQLite and PostgreSQL, while the cookies of sessions
still signed in keep working there."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from tensor_debugger.web.auth import COOKIE_NAME

from tests.support.forms import hidden
from tests.support.polling import wait_until
from tests.support.postgres import DATABASES
from tests.support.servers import READ_TOKEN, WRITE_TOKEN, LiveServer, free_port

TOKENS = {"TENSOR_DEBUGGER_TOKEN": WRITE_TOKEN, "TENSOR_DEBUGGER_READ_TOKEN": READ_TOKEN}


def sign_in(server: LiveServer, token: str) -> tuple[str, str]:
    """(the session cookie, the form token) of a browser that signed in on `server` with `token`."""
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        form_token = hidden(browser.get("/login").text, "csrf_token")
        signed = browser.post("/login", data={"csrf_token": form_token, "token": token})
        assert signed.status_code == 303, signed.text
        return browser.cookies[COOKIE_NAME], form_token


def opens(server: LiveServer, cookie: str) -> int:
    return httpx.get(f"{server.url}/api/sessions", cookies={COOKIE_NAME: cookie}, timeout=30).status_code


@pytest.mark.parametrize("database_url", DATABASES, indirect=True)
def test_a_signed_out_cookie_stays_refused_on_the_next_process(tmp_path: Path, database_url: str) -> None:
    # a process that never saw the sign-out: on SQLite the server restarted; on PostgreSQL a replica beside it,
    # started with it (both at once: their start-ups overlap) and running all along
    (tmp_path / "data").mkdir()
    first, second = (LiveServer(tmp_path / "data", free_port(), env=TOKENS, database_url=database_url) for _ in "12")
    replica = bool(database_url)
    try:
        for server in (first, second) if replica else (first,):
            server.launch()
        wait_until(first.answers, what="the first server to answer", timeout=60, interval=0.02)
        leaving, form_token = sign_in(first, WRITE_TOKEN)
        staying, _ = sign_in(first, READ_TOKEN)
        out = httpx.post(
            f"{first.url}/logout", data={"csrf_token": form_token}, cookies={COOKIE_NAME: leaving}, timeout=30
        )
        assert out.status_code == 303, out.text
        assert (opens(first, leaving), opens(first, staying)) == (401, 200)
        first.stop()
        if replica:
            wait_until(second.answers, what="the replica to answer", timeout=60, interval=0.02)
        else:
            second.start()
        assert opens(second, leaving) == 401
        assert opens(second, staying) == 200  # the cookies outlive the process: only the signed-out one is refused
    finally:
        first.stop()
        second.stop()
