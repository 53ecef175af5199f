"""Authentication beyond loopback, on the real server process with a token and a read-only token (`token_server`,
bound to 0.0.0.0): bearer tokens for the API, the login page and its cookie for browsers, read-only access."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar.routes import HTTPRoute
from playwright.sync_api import Browser
from tensor_debugger.live.upload import upload_files
from tensor_debugger.settings import Settings
from tensor_debugger.web.app import create_app
from tensor_debugger.web.auth import COOKIE_NAME, OPEN_PATHS
from tensor_debugger.web.security import UNSAFE_METHODS
from tensor_debugger.web.sign_in_limits import FAILURES, WINDOW_SECONDS

from tests.support import loopback_http as http
from tests.support.dumps import named_dump
from tests.support.forms import hidden
from tests.support.servers import READ_TOKEN, WRITE_TOKEN, LiveServer, bearer, started_server, wait_done

HTML = {"accept": "text/html"}
READ_ONLY = "a read-only token may look at everything and change nothing"


def post_actions(html: str) -> list[str]:
    """The action of every POST form of a page."""
    return re.findall(r'<form[^>]*method="post"[^>]*action="([^"]*)"', html)


@pytest.fixture(scope="module")
def seeded(token_server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A session of two runs with computed pairs, sent with the token as `capture` and the CLI send it. Named for
    its dumps' folder: the server lives for the whole run, and the module's fixtures may be set up again on the same
    worker (the tests of a module can be spread over a worker's run), where a second "reference" would be refused."""
    root = tmp_path_factory.mktemp("auth-dumps")
    name = f"auth seeded {root.name}"
    names = ["layer0_attn", "layer0_mlp", "layer1_attn"]
    reference = sorted(named_dump(root / "a", names).iterdir())
    candidate = sorted(named_dump(root / "b", names, seed=5).iterdir())
    session_id, _ = upload_files(token_server.url, name, "reference", reference, WRITE_TOKEN)
    upload_files(token_server.url, name, "candidate", candidate, WRITE_TOKEN)
    with httpx.Client(base_url=token_server.url, headers=bearer(WRITE_TOKEN), timeout=30) as client:
        report = wait_done(token_server, session_id)
        session = client.get(f"/api/sessions/{session_id}").json()
    return {"session": session_id, "pair": report["pairs"][0]["id"], "run": session["runs"][0]["id"], "name": name}


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str]]:
    """(method, path) of every route the app has, as the app itself lists them (so a new one cannot slip through
    these tests), except the login page and the warm path's `/api/local` (its own data-dir token, in
    tests/cli/test_warm.py)."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("routes"), token=WRITE_TOKEN, read_token=READ_TOKEN)
    found: list[tuple[str, str]] = []
    for route in create_app(settings).routes:
        if (
            isinstance(route, HTTPRoute)
            and route.path not in OPEN_PATHS  # the login page, signing out, the health check
            and not route.path.startswith("/api/local")
        ):
            found += [(method, route.path) for method in sorted(route.methods - {"HEAD", "OPTIONS"})]
    return found


def fill(path: str, ids: dict[str, Any]) -> str:
    """A route's path with its parameters given: the seeded session's ids, else 1."""
    return re.sub(r"\{(\w+):?\w*\}", lambda m: str(ids.get(m.group(1), 1)), path)


def test_the_api_answers_only_the_bearer_of_a_token(
    token_server: LiveServer, seeded: dict[str, Any], routes: list[tuple[str, str]]
) -> None:
    url = f"{token_server.url}/api/sessions/{seeded['session']}"
    basic, empty = {"authorization": f"Basic {WRITE_TOKEN}"}, {"authorization": "Bearer"}
    wrong: list[dict[str, str]] = [{}, bearer("not-the-token-0123456789"), basic, empty]
    for headers in wrong:
        refused = http.get(url, headers=headers)
        assert refused.status_code == 401, (headers, refused.text)
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert "name" not in refused.json()  # nothing of the session
    for token in (WRITE_TOKEN, READ_TOKEN):
        assert http.get(url, headers=bearer(token)).json()["name"] == seeded["name"]
    # every kind of read, to the read token: pages, the API, slices and exports, on every route that reads
    ids = {"session_id": seeded["session"], "pair_id": seeded["pair"], "run_id": seeded["run"], "tensor_id": 1}
    reads = [fill(path, ids) for method, path in routes if method == "GET" and not path.startswith("/static")]
    assert len(reads) >= 20 and f"/api/pairs/{seeded['pair']}/slice" in reads
    for path in reads:
        answer = http.get(token_server.url + path, headers=bearer(READ_TOKEN))
        assert answer.status_code not in (401, 403) and answer.status_code < 500, (path, answer.text[:300])
        assert http.get(token_server.url + path).status_code == 401, path
    window = {"index": ":,:", "start": "0,0", "count": "4,4"}
    url = f"{token_server.url}/api/pairs/{seeded['pair']}/slice"
    slice_ = http.get(url, params=window, headers=bearer(READ_TOKEN))
    assert slice_.status_code == 200 and slice_.json(), slice_.text
    # what the login page needs stays open; nothing else does
    assert http.get(token_server.url + "/static/app.css").status_code == 200
    assert http.get(token_server.url + "/login").status_code == 200
    assert http.get(token_server.url + "/schema").status_code == 401


def test_a_browser_signs_in_and_out_with_a_session_cookie(token_server: LiveServer, seeded: dict[str, Any]) -> None:
    page = f"/sessions/{seeded['session']}"
    with httpx.Client(base_url=token_server.url, headers=HTML, timeout=30) as browser:
        sent = browser.get(page)
        assert sent.status_code == 303 and sent.headers["location"] == f"/login?next={page.replace('/', '%2F')}"
        login = browser.get(sent.headers["location"])
        assert login.status_code == 200 and 'type="password" name="token"' in login.text
        assert 'href="/static/app.css' in login.text  # the same look as the other pages
        form = {"csrf_token": hidden(login.text, "csrf_token"), "next": hidden(login.text, "next")}
        assert form["next"] == page

        wrong = browser.post("/login", data={**form, "token": READ_TOKEN[:-1]})
        assert wrong.status_code == 401 and "not this server&#39;s token" in wrong.text
        assert COOKIE_NAME not in browser.cookies
        assert browser.post("/login", data={"next": page, "token": WRITE_TOKEN}).status_code == 403  # no form token

        signed = browser.post("/login", data={**form, "token": WRITE_TOKEN})
        assert signed.status_code == 303 and signed.headers["location"] == page
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower() and "Path=/" in cookie
        assert "Secure" not in cookie  # plain http on loopback: a Secure cookie would never come back
        value = browser.cookies[COOKIE_NAME]
        assert WRITE_TOKEN not in value and READ_TOKEN not in value
        shown = browser.get(page)
        assert shown.status_code == 200 and "/logout" in post_actions(shown.text)
        assert f"/sessions/{seeded['session']}/tolerances" in post_actions(shown.text)
        assert browser.get("/api/sessions").status_code == 200  # the pages' scripts call the API with it

        # a changed cookie is no cookie: another expiry, or claiming the other access
        kind, expires, nonce, mac = value.split(".")
        for forged in (f"{kind}.{int(expires) + 3600}.{nonce}.{mac}", f"read.{expires}.{nonce}.{mac}", "write"):
            assert httpx.get(token_server.url + "/api/sessions", cookies={COOKIE_NAME: forged}).status_code == 401

        out = browser.post("/logout", data={"csrf_token": form["csrf_token"]})
        assert out.status_code == 303 and out.headers["location"] == "/login"
        assert COOKIE_NAME not in browser.cookies
        # the cookie kept from before signing out opens nothing
        assert httpx.get(token_server.url + "/api/sessions", cookies={COOKIE_NAME: value}).status_code == 401


def test_signing_in_goes_only_to_this_servers_pages(token_server: LiveServer) -> None:
    with httpx.Client(base_url=token_server.url, timeout=30) as browser:
        token = hidden(browser.get("/login").text, "csrf_token")
        for target in ("//evil.example/", "https://evil.example/", "/\\evil.example", "sessions"):
            signed = browser.post("/login", data={"csrf_token": token, "next": target, "token": READ_TOKEN})
            assert signed.status_code == 303 and signed.headers["location"] == "/", target


def test_behind_a_proxy_that_says_https_the_cookie_is_secure(token_server: LiveServer) -> None:
    """uvicorn believes X-Forwarded-Proto from TENSOR_DEBUGGER_TRUSTED_PROXIES, here 127.0.0.1 (a proxy on this
    machine), as these requests come; the origin the same-origin check expects becomes https's too."""
    proxied = {"x-forwarded-proto": "https", "x-forwarded-for": "203.0.113.7"}
    with httpx.Client(base_url=token_server.url, headers=proxied, timeout=30) as browser:
        token = hidden(browser.get("/login").text, "csrf_token")
        origin = {"origin": f"https://127.0.0.1:{token_server.port}", "sec-fetch-site": "same-origin"}
        signed = browser.post("/login", data={"csrf_token": token, "token": READ_TOKEN}, headers=origin)
        assert signed.status_code == 303, signed.text
        assert "Secure" in signed.headers["set-cookie"]


def test_the_read_token_changes_nothing_on_any_route(
    token_server: LiveServer, seeded: dict[str, Any], routes: list[tuple[str, str]]
) -> None:
    """Every state-changing route the app has (listed from the app itself, so a new one cannot slip through) is
    refused to the read token, as a bearer (API clients) and as a signed-in browser (with a valid form token)."""
    ids = {"session_id": seeded["session"], "pair_id": seeded["pair"], "run_id": seeded["run"]}
    changing = [(method, fill(path, ids)) for method, path in routes if method in UNSAFE_METHODS]
    assert len(changing) >= 15 and ("DELETE", f"/api/sessions/{seeded['session']}") in changing

    with httpx.Client(base_url=token_server.url, timeout=30) as browser:
        login = browser.get("/login").text
        form_token = hidden(login, "csrf_token")
        browser.post("/login", data={"csrf_token": form_token, "token": READ_TOKEN})
        assert browser.cookies[COOKIE_NAME].startswith("read.")
        for method, path in changing:
            for client, headers in ((httpx, bearer(READ_TOKEN)), (browser, {})):
                response = client.request(
                    method,
                    token_server.url + path,
                    headers={**headers, "x-csrf-token": form_token},
                    json={"name": "changed"},
                )
                assert response.status_code == 403, (method, path, response.text)
                assert response.json()["detail"] == READ_ONLY

        # the pages leave out every control that would be refused: only signing out is left
        for page in ("/", f"/sessions/{seeded['session']}", f"/pairs/{seeded['pair']}", f"/runs/{seeded['run']}"):
            html = browser.get(page).text
            assert post_actions(html) == ["/logout"], page
            assert "read-only" in html and "data-reorder" not in html
            assert post_actions(http.get(token_server.url + page, headers=bearer(READ_TOKEN)).text) == []
        assert browser.post("/logout", data={"csrf_token": form_token}).status_code == 303  # signing out is allowed

    session = http.get(f"{token_server.url}/api/sessions/{seeded['session']}", headers=bearer(WRITE_TOKEN)).json()
    assert session["name"] == seeded["name"] and len(session["runs"]) == 2  # nothing changed
    write_page = http.get(f"{token_server.url}/sessions/{seeded['session']}", headers=bearer(WRITE_TOKEN)).text
    assert len(post_actions(write_page)) >= 3 and "read-only" not in write_page


def test_the_token_changes_things(token_server: LiveServer) -> None:
    created = http.post(f"{token_server.url}/api/sessions", json={"name": "auth made"}, headers=bearer(WRITE_TOKEN))
    assert created.status_code == 201, created.text
    session_id = created.json().get("session", created.json())["id"]
    gone = http.delete(f"{token_server.url}/api/sessions/{session_id}", headers=bearer(WRITE_TOKEN))
    assert gone.status_code == 204


@pytest.mark.browser
def test_chromium_signs_in_changes_things_and_signs_out(
    token_server: LiveServer, seeded: dict[str, Any], browser: Browser
) -> None:
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(f"{token_server.url}/sessions/{seeded['session']}?group=none")
        page.wait_for_url("**/login?next=*")
        page.get_by_label("Token").fill(WRITE_TOKEN)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(f"**/sessions/{seeded['session']}?group=none")
        (cookie,) = [c for c in context.cookies() if c["name"] == COOKIE_NAME]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert page.evaluate("() => document.cookie") == ""  # no script can read it

        rows = page.locator("table.pairs tbody tr")
        first = rows.first.get_attribute("data-key")
        page.locator("td.move button[value=down]").first.click()  # a form POST, with the cookie and its form token
        page.wait_for_function(f"() => document.querySelector('table.pairs tbody tr').dataset.key !== {first!r}")
        assert page.evaluate("() => fetch('/api/sessions').then(r => r.status)") == 200  # the scripts' calls too

        page.get_by_role("button", name="Sign out").click()
        page.wait_for_url("**/login")
        page.goto(f"{token_server.url}/sessions/{seeded['session']}")
        page.wait_for_url("**/login?next=*")
    finally:
        context.close()


def test_wrong_tokens_from_one_address_are_slowed_down_and_the_right_one_still_gets_in(
    token_server: LiveServer,
) -> None:
    """After FAILURES wrong tokens (the login form's and bearer tokens alike) one client address's wrong tokens are
    answered 429 with Retry-After, while another address's are not; the right token gets in from that address all
    the same, so a guesser cannot lock its holder out. The addresses are those the proxy on this machine forwards,
    so this server's other tests, from 127.0.0.1, are not slowed."""
    guesser, neighbour = {"x-forwarded-for": "198.51.100.23"}, {"x-forwarded-for": "198.51.100.24"}
    api = f"{token_server.url}/api/sessions"
    with httpx.Client(base_url=token_server.url, headers=guesser, timeout=30) as browser:
        form = {"csrf_token": hidden(browser.get("/login").text, "csrf_token")}
        for guess in range(FAILURES - 2):
            assert browser.post("/login", data={**form, "token": f"guess-{guess}"}).status_code == 401
        for guess in range(2):
            assert http.get(api, headers={**guesser, **bearer(f"guess-{guess}")}).status_code == 401

        again = browser.post("/login", data={**form, "token": "guess-again"})
        assert again.status_code == 429, again.text
        assert 1 <= int(again.headers["retry-after"]) <= WINDOW_SECONDS
        assert "Too many wrong tokens from this address: try again in" in again.text
        refused = http.get(api, headers={**guesser, **bearer("guess-again")})
        assert refused.status_code == 429 and 1 <= int(refused.headers["retry-after"]) <= WINDOW_SECONDS
        assert refused.json()["detail"].startswith("too many wrong tokens from this address")

        signed = browser.post("/login", data={**form, "token": WRITE_TOKEN})
        assert signed.status_code == 303, signed.text
        assert browser.cookies[COOKIE_NAME].startswith("write.")
        assert http.get(api, headers={**guesser, **bearer(READ_TOKEN)}).status_code == 200
    assert http.get(api, headers={**neighbour, **bearer("guess-elsewhere")}).status_code == 401


def test_a_wrong_token_sent_from_ever_new_addresses_is_slowed_down(token_server: LiveServer) -> None:
    """The count is per token presented too: a client that rotates its (forwarded) address runs into it."""
    api = f"{token_server.url}/api/sessions"
    stale = bearer("a-stale-token-some-script-keeps-sending")
    for n in range(FAILURES):
        assert http.get(api, headers={**stale, "x-forwarded-for": f"203.0.113.{n + 1}"}).status_code == 401
    refused = http.get(api, headers={**stale, "x-forwarded-for": "203.0.113.200"})
    assert refused.status_code == 429, refused.text
    assert refused.json()["detail"].startswith("too many wrong tokens of this token")
    assert http.get(api, headers={"x-forwarded-for": "203.0.113.200", **bearer(WRITE_TOKEN)}).status_code == 200


def test_x_forwarded_for_is_not_believed_by_default(tmp_path: Path) -> None:
    """Without TENSOR_DEBUGGER_TRUSTED_PROXIES no proxy is trusted, loopback included: a local process rotating
    X-Forwarded-For is still one address, slowed down after FAILURES wrong tokens, and the right token still gets
    in from it."""
    server = started_server(tmp_path, env={"TENSOR_DEBUGGER_TOKEN": WRITE_TOKEN})
    try:
        api = f"{server.url}/api/sessions"
        statuses = [
            http.get(api, headers={"x-forwarded-for": f"192.0.2.{n}", **bearer(f"guess-{n}")}).status_code
            for n in range(FAILURES + 1)
        ]
        assert statuses == [401] * FAILURES + [429]
        assert http.get(api, headers={"x-forwarded-for": "192.0.2.99", **bearer(WRITE_TOKEN)}).status_code == 200
        # nor is X-Forwarded-Proto: a sign-in it marks https is plain http's, its cookie not Secure
        with httpx.Client(base_url=server.url, headers={"x-forwarded-proto": "https"}, timeout=30) as browser:
            form = {"csrf_token": hidden(browser.get("/login").text, "csrf_token"), "token": WRITE_TOKEN}
            signed = browser.post("/login", data=form)
            assert signed.status_code == 303, signed.text
            assert COOKIE_NAME in signed.headers["set-cookie"] and "Secure" not in signed.headers["set-cookie"]
    finally:
        server.stop()
