"""Safe to share: what another site can make the user's browser send is refused, on the real server process.

Each attack is sent as a browser would send it (its Origin, Sec-Fetch-Site or Host) and then the test checks that
nothing changed; requests from the app's own pages and from scripts without those headers still work."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from playwright.sync_api import Browser
from tensor_debugger.compare.reports.inspector import cell_css
from tensor_debugger.web.security import PAGE_POLICY

from tests.support import REPO
from tests.support import loopback_http as http
from tests.support.polling import wait_until
from tests.support.servers import LiveServer, cli_command, free_port
from tests.support.servers import child_env as _child_env

EVIL = "http://evil.example"
SECURITY_HEADERS = {"x-content-type-options": "nosniff", "x-frame-options": "DENY", "referrer-policy": "same-origin"}


def new_session(server: LiveServer, name: str) -> int:
    """An empty session, made the way a script makes one (no Origin, no Sec-Fetch-Site)."""
    response = http.post(server.url + "/api/sessions", json={"name": name})
    assert response.status_code == 201, response.text
    body = response.json()
    return int(body.get("session", body)["id"])


def session_names(server: LiveServer) -> set[str]:
    return {s["name"] for s in http.get(server.url + "/api/sessions").json()}


def tolerances(server: LiveServer, session_id: int) -> dict[str, Any]:
    return dict(http.get(f"{server.url}/api/sessions/{session_id}").json()["tolerances"])


def from_evil(**extra: str) -> dict[str, str]:
    """What a page on another site sends along with a request it makes the browser send here."""
    return {"origin": EVIL, "sec-fetch-site": "cross-site", **extra}


def from_own_page(server: LiveServer) -> dict[str, str]:
    return {"origin": server.url, "sec-fetch-site": "same-origin"}


class Forms(HTMLParser):
    """Every form of a page: its method, action and its inputs in order (name, type, value)."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[dict[str, Any]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if tag == "form":
            self.forms.append(
                {"method": values.get("method", "get").lower(), "action": values.get("action", ""), "inputs": []}
            )
        elif tag in ("input", "button", "select", "textarea") and self.forms and "name" in values:
            self.forms[-1]["inputs"].append((values["name"], values.get("type", ""), values.get("value", "")))


def post_forms(html: str) -> list[dict[str, Any]]:
    parser = Forms()
    parser.feed(html)
    return [f for f in parser.forms if f["method"] == "post"]


def form_token(server: LiveServer) -> str:
    forms = post_forms(http.get(server.url + "/").text)
    name, kind, value = forms[0]["inputs"][0]
    assert (name, kind) == ("csrf_token", "hidden")
    return str(value)


def npy(path: Path) -> Path:
    np.save(path, np.arange(12, dtype=np.float32).reshape(3, 4))
    return path


# --- state-changing requests from another origin --------------------------------------------------------------


def test_an_api_delete_from_another_origin_is_refused(shared_server: LiveServer) -> None:
    session_id = new_session(shared_server, "security: keep me (api)")
    for headers in (
        from_evil(),
        {"origin": EVIL},
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site"},
        {"origin": "null"},
        {"origin": shared_server.url.replace("127.0.0.1", "localhost")},
        {"referer": f"{EVIL}/page.html"},  # no Origin: the Referer says where the request comes from
        {"referer": "not a url"},
    ):
        response = http.delete(f"{shared_server.url}/api/sessions/{session_id}", headers=headers)
        assert response.status_code == 403, (headers, response.text)
        assert "may not change anything here" in response.json()["detail"]
    assert "security: keep me (api)" in session_names(shared_server)
    # the same request from the app's own page (its Origin, or only its Referer), and from a script (no header)
    own_referer = {"referer": f"{shared_server.url}/sessions/{session_id}"}
    kept = new_session(shared_server, "security: deleted from its page's referer")
    assert http.delete(f"{shared_server.url}/api/sessions/{kept}", headers=own_referer).status_code == 204
    assert (
        http.delete(f"{shared_server.url}/api/sessions/{session_id}", headers=from_own_page(shared_server)).status_code
        == 204
    )
    other = new_session(shared_server, "security: deleted by a script")
    assert http.delete(f"{shared_server.url}/api/sessions/{other}").status_code == 204
    assert not {"security: keep me (api)", "security: deleted by a script"} & session_names(shared_server)


def test_a_form_delete_from_another_origin_is_refused_even_with_the_token(shared_server: LiveServer) -> None:
    session_id = new_session(shared_server, "security: keep me (form)")
    token = form_token(shared_server)
    response = http.post(
        f"{shared_server.url}/sessions/{session_id}/delete",
        headers=from_evil(),
        data={"csrf_token": token, "confirm": "yes"},
    )
    assert response.status_code == 403
    assert "security: keep me (form)" in session_names(shared_server)
    response = http.post(
        f"{shared_server.url}/sessions/{session_id}/delete",
        headers=from_own_page(shared_server),
        data={"csrf_token": token, "confirm": "yes"},
    )
    assert response.status_code == 303
    assert "security: keep me (form)" not in session_names(shared_server)


def test_tolerances_from_another_origin_are_refused(shared_server: LiveServer) -> None:
    session_id = new_session(shared_server, "security: tolerances")
    token = form_token(shared_server)
    url = f"{shared_server.url}/sessions/{session_id}/tolerances"
    assert http.post(url, headers=from_evil(), data={"csrf_token": token, "rtol": "1000"}).status_code == 403
    assert (
        http.patch(
            f"{shared_server.url}/api/sessions/{session_id}", headers=from_evil(), json={"rtol": 1000}
        ).status_code
        == 403
    )
    assert tolerances(shared_server, session_id) == {"rtol": None, "atol": None, "ulp": None}
    assert (
        http.post(url, headers=from_own_page(shared_server), data={"csrf_token": token, "rtol": "0.5"}).status_code
        == 303
    )
    assert tolerances(shared_server, session_id)["rtol"] == 0.5
    assert http.patch(f"{shared_server.url}/api/sessions/{session_id}", json={"rtol": 0.25}).status_code == 200
    assert tolerances(shared_server, session_id)["rtol"] == 0.25


def test_an_upload_from_another_origin_is_refused(shared_server: LiveServer, tmp_path: Path) -> None:
    weights = npy(tmp_path / "security-refused.npy")
    token = form_token(shared_server)
    name = "security: planted"
    for url, data in (("/api/sessions", {"name": name}), ("/sessions", {"csrf_token": token, "name": name})):
        with open(weights, "rb") as handle:
            response = http.post(
                shared_server.url + url, headers=from_evil(), data=data, files=[("reference", (weights.name, handle))]
            )
        assert response.status_code == 403, (url, response.text)
    assert "security: planted" not in session_names(shared_server)
    assert not any((shared_server.data_dir / "staging").glob(f"**/{weights.name}"))  # nothing of it was kept
    with open(weights, "rb") as handle:  # the app's own upload script, and curl, go through
        response = http.post(
            shared_server.url + "/api/sessions",
            headers=from_own_page(shared_server),
            data={"name": "security: uploaded"},
            files=[("reference", (weights.name, handle))],
            timeout=60,
        )
    assert response.status_code == 201, response.text
    assert "security: uploaded" in session_names(shared_server)


def test_requests_that_change_nothing_are_not_checked_for_origin(shared_server: LiveServer) -> None:
    """A link from another site to a page (GET, cross-site) opens it; `Sec-Fetch-Site: none` (typed, bookmarked)
    is the user's own request."""
    assert http.get(shared_server.url + "/", headers=from_evil()).status_code == 200
    assert (
        http.post(
            shared_server.url + "/api/sessions", json={"name": "security: typed"}, headers={"sec-fetch-site": "none"}
        ).status_code
        == 201
    )


# --- Host ------------------------------------------------------------------------------------------------------


def test_a_host_that_is_not_allowed_is_refused(shared_server: LiveServer) -> None:
    session_id = new_session(shared_server, "security: rebound")
    for path in ("/", "/api/sessions", f"/sessions/{session_id}", "/static/app.css", "/schema"):
        response = http.get(shared_server.url + path, headers={"host": "evil.example"})
        assert response.status_code == 400, path
        assert "does not answer to the host name 'evil.example'" in response.json()["detail"]
        assert "TENSOR_DEBUGGER_ALLOWED_HOSTS" in response.json()["detail"]
    response = http.delete(
        f"{shared_server.url}/api/sessions/{session_id}", headers={"host": f"evil.example:{shared_server.port}"}
    )
    assert response.status_code == 400
    assert "security: rebound" in session_names(shared_server)
    for host in (
        f"localhost:{shared_server.port}",
        f"127.0.0.1:{shared_server.port}",
        f"LOCALHOST.:{shared_server.port}",
        f"[::1]:{shared_server.port}",
    ):
        assert http.get(shared_server.url + "/api/sessions", headers={"host": host}).status_code == 200, host


@dataclass
class ConfiguredServer(LiveServer):
    """A server started with settings from the environment (the shared fixture's strips them)."""

    environ: dict[str, str] = field(default_factory=dict)

    def launch(self) -> subprocess.Popen[bytes]:
        args = [*cli_command(), "--data-dir", str(self.data_dir), "serve", "--port", str(self.port), "--no-demo"]
        log = open(self.data_dir.parent / f"server-{self.port}.log", "ab")
        self.process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env={**_child_env(), **self.environ}
        )
        return self.process


@pytest.fixture
def server_with_allowed_hosts(tmp_path: Path) -> Iterator[LiveServer]:
    server = ConfiguredServer(
        tmp_path / "data", free_port(), environ={"TENSOR_DEBUGGER_ALLOWED_HOSTS": "tensors.example, .lab.example"}
    )
    server.data_dir.mkdir(parents=True)
    server.start()
    yield server
    server.stop()


def test_allowed_hosts_adds_names(server_with_allowed_hosts: LiveServer) -> None:
    server = server_with_allowed_hosts
    for host, status in (
        ("tensors.example", 200),
        ("lab.example", 200),
        ("gpu1.lab.example:8000", 200),
        ("localhost", 200),
        ("evil.example", 400),
        ("notlab.example", 400),
    ):
        assert http.get(server.url + "/api/sessions", headers={"host": host}).status_code == status, host
    # a same-origin request under an added name: its Origin is that name
    response = http.post(
        server.url + "/api/sessions",
        json={"name": "named"},
        headers={
            "host": "tensors.example:8000",
            "origin": "http://tensors.example:8000",
            "sec-fetch-site": "same-origin",
        },
    )
    assert response.status_code == 201


# --- headers ---------------------------------------------------------------------------------------------------


def assert_security_headers(response: httpx.Response, policy: str = PAGE_POLICY) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert response.headers.get(name) == value, (response.url, name)
    assert response.headers.get("content-security-policy") == policy, response.url


def test_every_response_carries_the_security_headers(shared_server: LiveServer) -> None:
    session_id = new_session(shared_server, "security: headers")
    csp = PAGE_POLICY
    assert "script-src 'self'" in csp and "'unsafe-inline'" not in csp and "frame-ancestors 'none'" in csp
    for path in (
        "/",
        f"/sessions/{session_id}",
        "/api/sessions",
        f"/api/sessions/{session_id}",
        "/static/app.css",
        "/static/session.js",
        "/api/sessions/999999",
        "/no-such-page",
    ):
        assert_security_headers(http.get(shared_server.url + path), csp)
    refused = http.delete(f"{shared_server.url}/api/sessions/{session_id}", headers=from_evil())
    assert refused.status_code == 403
    assert_security_headers(refused, csp)
    assert_security_headers(http.get(shared_server.url + "/", headers={"host": "evil.example"}), csp)
    schema = http.get(shared_server.url + "/schema")
    assert schema.headers["content-security-policy"].startswith("default-src 'self'; script-src 'self';")
    assert schema.headers["x-frame-options"] == "DENY"


def test_no_template_has_inline_script_or_style() -> None:
    for template in sorted((REPO / "web" / "templates").glob("*.html")):
        text = template.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), template.name
        assert not re.search(r"\sstyle=", text), template.name
        assert not re.search(r"<style", text), template.name
        assert not re.search(r"\son[a-z]+=", text), template.name
        assert "javascript:" not in text, template.name


def test_the_inspector_colour_classes_are_in_the_stylesheet() -> None:
    css = (REPO / "web" / "static" / "app.css").read_text()
    assert cell_css() in css, "web/static/app.css misses compare/reports/inspector.py cell_css(): paste it in again"


# --- the form token --------------------------------------------------------------------------------------------


def test_every_post_form_carries_the_token_first(shared_server: LiveServer) -> None:
    session_id = new_session(shared_server, "security: forms")
    token = form_token(shared_server)
    assert re.fullmatch(r"[0-9a-f]{32}", token)
    pages = ["/", f"/sessions/{session_id}", f"/sessions/{session_id}?group=none"]
    seen = 0
    for path in pages:
        for form in post_forms(http.get(shared_server.url + path).text):
            assert form["inputs"][0] == ("csrf_token", "hidden", token), (path, form)
            seen += 1
    assert seen >= 4  # new session, rename, delete, tolerances


def test_a_form_post_with_a_missing_or_forged_token_is_refused(shared_server: LiveServer, tmp_path: Path) -> None:
    session_id = new_session(shared_server, "security: original")
    token = form_token(shared_server)
    url = f"{shared_server.url}/sessions/{session_id}/rename"
    own = from_own_page(shared_server)
    for headers, data in (
        (own, {"name": "security: renamed"}),
        ({}, {"name": "security: renamed"}),
        (own, {"csrf_token": "0" * 32, "name": "security: renamed"}),
        (own, {"csrf_token": token[:-1], "name": "security: renamed"}),
        ({**own, "x-csrf-token": "forged"}, {"name": "security: renamed"}),
    ):
        response = http.post(url, headers={**headers, "accept": "text/html"}, data=data)
        assert response.status_code == 403, (headers, data)
        assert "reload the page" in response.text
    assert "security: original" in session_names(shared_server)
    weights = npy(tmp_path / "weights.npy")
    for data in (
        {"name": "security: no token"},
        {"name": "security: token not first", "csrf_token": token},
        {"csrf_token": "forged", "name": "security: forged"},
    ):
        with open(weights, "rb") as handle:
            response = http.post(
                shared_server.url + "/sessions", headers=own, data=data, files=[("reference", ("weights.npy", handle))]
            )
        assert response.status_code == 403, data
    assert not {"security: no token", "security: token not first", "security: forged"} & session_names(shared_server)
    # the right token, as the page's own form sends it (first field), or as a header
    assert http.post(url, headers=own, data={"csrf_token": token, "name": "security: renamed"}).status_code == 303
    assert http.post(url, headers={"x-csrf-token": token}, data={"name": "security: again"}).status_code == 303
    assert "security: again" in session_names(shared_server)
    with open(weights, "rb") as handle:
        response = http.post(
            shared_server.url + "/sessions",
            headers=own,
            data={"csrf_token": token, "name": "security: form"},
            files=[("reference", ("weights.npy", handle))],
        )
    assert response.status_code == 303
    assert "security: form" in session_names(shared_server)
    progress = f"{shared_server.url}/api{response.headers['location']}/progress"  # left done, on the shared server
    wait_until(lambda: http.get(progress).json()["stage"], until=lambda s: s == "done", what=f"{progress} to be done")


# --- the OpenAPI viewer ----------------------------------------------------------------------------------------


def test_the_schema_page_loads_nothing_from_elsewhere(shared_server: LiveServer) -> None:
    page = http.get(shared_server.url + "/schema")
    assert page.status_code == 200
    assert not re.search(r"(https?:)?//[a-z0-9.-]+", page.text.replace('href="data:,"', "")), page.text
    scripts = re.findall(r'<script[^>]*src="([^"]+)"', page.text)
    assert scripts and all(s.startswith("/static/vendor/redoc/") for s in scripts)
    assert "<script>" not in page.text and "<style" not in page.text
    bundle = http.get(shared_server.url + scripts[0])
    assert bundle.status_code == 200 and bundle.headers["content-type"].startswith("text/javascript")
    assert len(bundle.content) > 500_000
    assert http.get(shared_server.url + "/schema/openapi.json").json()["info"]["title"] == "Tensor Debugger"
    licence = REPO / "web" / "static" / "vendor" / "redoc" / "LICENSE"
    assert "MIT License" in licence.read_text()


# --- the pages in a browser, under the policy ------------------------------------------------------------------

REPORT_VIOLATIONS = """document.addEventListener("securitypolicyviolation", (e) =>
  console.error(`CSP violation: ${e.violatedDirective} blocked ${e.blockedURI} in ${e.sourceFile}:${e.lineNumber}`));"""


@pytest.fixture
def watched_page(browser: Browser) -> Iterator[tuple[Any, list[str]]]:
    """A Chromium page, and the list of every CSP violation and script error it reports (empty is good)."""
    problems: list[str] = []
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(REPORT_VIOLATIONS)
    page = context.new_page()
    page.on(
        "console",
        lambda m: (
            problems.append(m.text)
            if m.type == "error" and ("Content Security Policy" in m.text or "CSP violation" in m.text)
            else None
        ),
    )
    page.on("pageerror", lambda e: problems.append(f"script error: {e}"))
    yield page, problems
    context.close()


@pytest.mark.browser
def test_the_pages_run_under_the_policy_without_a_violation(
    shared_demo_server: LiveServer, watched_page: tuple[Any, list[str]]
) -> None:
    page, problems = watched_page
    page.goto(shared_demo_server.url + "/")
    page.get_by_role("link", name="demo: planted divergence at layer 2 post_attn").click()
    page.locator(".banner.fail").wait_for(timeout=60_000)
    page.get_by_role("button", name="Collapse all").click()  # session.js runs
    assert not page.locator("tbody.group").first.evaluate("g => g.classList.contains('open')")
    page.get_by_role("button", name="Expand all").click()
    page.goto(page.url.split("?")[0] + "?group=none")
    assert page.locator("td.move form input[name=csrf_token]").count() > 0
    page.locator(".banner.fail").get_by_role("link", name="2_post_attn").click()
    page.wait_for_url("**/pairs/*")
    page.get_by_role("link", name="Jump to max diff").click()  # inspector.js fetches the grids and swaps them in
    page.wait_for_function("() => document.querySelector('.caption').textContent.includes('[5, ')")
    biggest = page.locator("figure.grid", has_text="Difference").locator("td.max")
    assert "bd-out10" in (biggest.get_attribute("class") or "")
    # the colours come from the stylesheet's classes, not inline style
    # read once the cell is in the document and styled: the inspector may still be swapping a grid in
    styled = page.wait_for_function(
        """() => {
            const grid = [...document.querySelectorAll('figure.grid')].find(f => f.textContent.includes('Difference'));
            const td = grid && grid.querySelector('td.max');
            const style = td && td.isConnected && getComputedStyle(td);
            return style && style.borderTopColor ? [style.borderTopColor, style.backgroundColor] : null;
        }"""
    ).json_value()
    assert styled[0] == "rgb(230, 110, 0)"
    assert styled[1] != "rgba(0, 0, 0, 0)"
    bars = page.locator("table.histogram svg.bar rect")
    assert bars.count() > 0 and max(float(bars.nth(i).get_attribute("width") or 0) for i in range(bars.count())) == 100
    assert bars.first.evaluate("r => r.getBoundingClientRect().width") > 0
    heatmap = page.locator("figure.heatmap img")  # the PNG is the app's own image: the policy lets it load
    heatmap.wait_for()
    page.wait_for_function("() => document.querySelector('figure.heatmap img').naturalWidth > 0")
    page.goto(shared_demo_server.url + "/schema")
    page.get_by_role("heading", name=re.compile("Tensor Debugger")).first.wait_for(timeout=30_000)
    page.get_by_text("/api/sessions").first.wait_for()
    assert problems == [], problems
