"""Every malformed request is a 4xx whose body says why, on a real server that stays up: ids outside int64, JSON
bodies of the wrong shape, too large or too deep, names and notes past their limits, form and multipart bodies
likewise, and methods a route does not take."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import httpx
import pytest

from tests.support import loopback_http as http
from tests.support.servers import LiveServer

INT64_MAX = 2**63 - 1
OUTSIDE_INT64 = [2**63, 2**64 + 5, 10**30, -1, -(2**63) - 1]
ID_PATHS = [
    "/api/sessions/{}",
    "/api/sessions/{}/pairs",
    "/api/sessions/{}/progress",
    "/api/runs/{}",
    "/api/runs/{}/tensors",
    "/api/pairs/{}",
    "/api/pairs/{}/slice",
    "/api/tensors/{}",
    "/sessions/{}",
    "/sessions/{}/pairs.csv",
    "/runs/{}",
    "/pairs/{}",
    "/pairs/{}/heatmap.svg",
    "/pairs/{}/heatmap.png",
    "/pairs/{}/heatmap.json",
]
DEEP = "[" * 5000 + "]" * 5000


def refusal(response: httpx.Response, status: int, *words: str) -> str:
    """The refusal's reason, once its status and JSON body are as every refusal's are."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["status_code"] == status
    detail: str = body["detail"]
    for word in words:
        assert word in detail, detail
    return detail


def send_json(method: str, url: str, body: Any) -> httpx.Response:
    """`body` as JSON, whatever it is (`None` too: httpx's json= would send no body for it)."""
    return http.request(method, url, content=json.dumps(body), headers={"content-type": "application/json"})


def new_session(server: LiveServer, **fields: Any) -> dict[str, Any]:
    response = http.post(f"{server.url}/api/sessions", json={"name": f"malformed {uuid.uuid4().hex}", **fields})
    assert response.status_code == 201, response.text
    session: dict[str, Any] = response.json()
    return session


@pytest.mark.parametrize("path", ID_PATHS)
def test_an_id_outside_int64_names_nothing(shared_server: LiveServer, path: str) -> None:
    with httpx.Client(base_url=shared_server.url) as client:
        for value in OUTSIDE_INT64:
            refusal(client.get(path.format(value)), 404, f"id {value}")
        assert client.get(path.format(INT64_MAX)).status_code == 404  # the largest id: looked up, names nothing


def test_changes_to_an_id_outside_int64_are_404(shared_server: LiveServer) -> None:
    huge = 2**63
    with httpx.Client(base_url=shared_server.url) as client:
        refusal(client.delete(f"/api/sessions/{huge}"), 404, "no session")
        refusal(client.patch(f"/api/sessions/{huge}", json={"name": "x"}), 404, "no session")
        refusal(client.put(f"/api/pairs/{huge}/alignment", json={"steps": []}), 404, "no pair")
        page = client.get(f"/sessions/{huge}", headers={"accept": "text/html"})
        assert page.status_code == 404 and "no session with id" in page.text


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([], "Expected `object`, got `array`"),
        ("a name", "Expected `object`, got `str`"),
        (None, "Expected `object`, got `null`"),
        ({"name": "extra", "colour": "red"}, "unknown field `colour`"),
        ({"notes": "no name"}, "missing required field `name`"),
        ({"name": 5}, "Expected `str`, got `int`"),
        ({"name": ["a"]}, "Expected `str`, got `array`"),
    ],
)
def test_a_new_session_json_body_of_the_wrong_shape_is_400(shared_server: LiveServer, body: Any, reason: str) -> None:
    refusal(send_json("POST", f"{shared_server.url}/api/sessions", body), 400, reason)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([], "Expected `object`, got `array`"),
        ("a name", "Expected `object`, got `str`"),
        (None, "Expected `object`, got `null`"),
        ({"name": "x", "colour": "red"}, "unknown field `colour`"),
        ({"name": 5}, "Expected `str | null`, got `int`"),
    ],
)
def test_a_session_patch_of_the_wrong_shape_is_400_and_changes_nothing(
    shared_server: LiveServer, body: Any, reason: str
) -> None:
    session = new_session(shared_server)
    url = f"{shared_server.url}/api/sessions/{session['id']}"
    refusal(send_json("PATCH", url, body), 400, reason)
    assert http.get(url).json()["name"] == session["name"]


def test_names_take_at_most_200_characters_and_notes_64_ki(shared_server: LiveServer) -> None:
    stem = uuid.uuid4().hex
    longest = (stem * 10)[:200]
    assert new_session(shared_server, name=longest, notes="n" * 65536)["name"] == longest
    url = f"{shared_server.url}/api/sessions"
    refusal(http.post(url, json={"name": longest + "x"}), 400, "200")
    refusal(http.post(url, json={"name": f"{stem} notes", "notes": "n" * 65537}), 400, "65536")
    session = new_session(shared_server)
    one = f"{url}/{session['id']}"
    refusal(http.patch(one, json={"name": "y" * 201}), 400, "200")
    refusal(http.patch(one, json={"notes": "é" * 65537}), 400, "65536")
    refusal(http.patch(one, json={"name": "   "}), 400)
    refusal(http.patch(one, json={"name": "tab\there"}), 400)
    assert http.get(one).json()["notes"] == ""


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/sessions"),
        ("PATCH", "/api/sessions/{id}"),
        ("PUT", "/api/sessions/{id}/pairing"),
        ("PUT", "/api/sessions/{id}/order"),
        ("POST", "/api/sessions/{id}/pairs"),
        ("PUT", "/api/pairs/1/alignment"),
    ],
)
def test_json_nested_5000_deep_is_400(shared_server: LiveServer, method: str, path: str) -> None:
    session = new_session(shared_server)
    url = shared_server.url + path.format(id=session["id"])
    response = http.request(method, url, content=DEEP, headers={"content-type": "application/json"})
    refusal(response, 400, "more than 32 deep")
    assert http.get(f"{shared_server.url}/api/sessions/{session['id']}").status_code == 200  # and the server is up


def test_a_pairing_file_nested_too_deep_is_refused_on_the_page(shared_server: LiveServer) -> None:
    session = new_session(shared_server)
    with httpx.Client(base_url=shared_server.url) as client:
        token = form_token(client)
        response = client.post(
            f"/sessions/{session['id']}/pairing",
            data={"csrf_token": token},
            files={"file": ("deep.json", DEEP.encode(), "application/json")},
        )
    assert response.status_code == 400
    assert "more than 32 deep" in response.text


def test_json_bodies_past_their_size_are_413(shared_server: LiveServer) -> None:
    session = new_session(shared_server)
    big = {"name": "big", "notes": "x" * (1024 * 1024)}
    refusal(http.post(f"{shared_server.url}/api/sessions", json=big), 413, "1048576 bytes")
    refusal(http.patch(f"{shared_server.url}/api/sessions/{session['id']}", json=big), 413, "1048576 bytes")


def test_multipart_bodies_are_checked_like_json_ones(shared_server: LiveServer) -> None:
    url = f"{shared_server.url}/api/sessions"
    files = {"reference": ("a.npy", b"not really", "application/octet-stream")}
    refusal(http.post(url, data={"name": "n" * 201}, files=files), 400, "200")
    refusal(http.post(url, data={"name": "ok", "notes": "x" * 70000}, files=files), 400, "too long")
    refusal(http.post(url, content=b"--x\r\nnonsense", headers={"content-type": "multipart/form-data"}), 400)
    refusal(
        http.post(url, content=b"--x\r\nnonsense", headers={"content-type": "multipart/form-data; boundary=x"}),
        400,
        "malformed multipart",
    )
    refusal(http.post(url, content=b"name=x", headers={"content-type": "text/plain"}), 400, "multipart")


def form_token(client: httpx.Client) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/").text)
    assert found is not None
    return found.group(1)


def test_page_forms_of_the_wrong_shape_are_400(shared_server: LiveServer) -> None:
    session = new_session(shared_server)
    with httpx.Client(base_url=shared_server.url) as client:
        token = form_token(client)
        rename = f"/sessions/{session['id']}/rename"
        twice = client.post(rename, content=f"csrf_token={token}&name=a&name=b", headers=form_headers())
        refusal(twice, 400, "Expected `str`, got `array`")
        refusal(client.post(rename, data={"csrf_token": token, "name": "n" * 201}), 400, "200")
        refusal(client.post(f"/sessions/{2**63}/rename", data={"csrf_token": token, "name": "x"}), 404, "no session")
        bad = client.post(f"/sessions/{session['id']}/tolerances", data={"csrf_token": token, "rtol": "lots"})
        refusal(bad, 400, "rtol must be a number")
        assert client.get(f"/api/sessions/{session['id']}").json()["name"] == session["name"]


def form_headers() -> dict[str, str]:
    return {"content-type": "application/x-www-form-urlencoded"}


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("TRACE", "/api/sessions/1", {"GET", "PATCH", "DELETE"}),
        ("PUT", "/api/runs/1", {"GET"}),
        ("POST", "/api/tensors/1", {"GET"}),
        ("TRACE", "/sessions/1", {"GET"}),
    ],
)
def test_a_method_the_route_does_not_take_is_405_with_allow(
    shared_server: LiveServer, method: str, path: str, allowed: set[str]
) -> None:
    response = http.request(method, shared_server.url + path)
    refusal(response, 405)
    assert allowed <= {m.strip() for m in response.headers["allow"].split(",")}
