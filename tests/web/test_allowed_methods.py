"""OPTIONS and a 405's Allow name every method of a path, as the OpenAPI document lists them, on a real server:
not only those of one of the path's handlers."""

from __future__ import annotations

import re

from tests.support import loopback_http as http
from tests.support.servers import LiveServer


def test_options_and_allow_name_every_method_of_every_path(shared_server: LiveServer) -> None:
    document = http.get(shared_server.url + "/schema/openapi.json").json()
    checked = 0
    for template, operations in document["paths"].items():
        path = re.sub(r"{\w+}", "1", template)
        documented = {method.upper() for method in operations if method.upper() != "OPTIONS"}
        answer = http.request("OPTIONS", shared_server.url + path)
        assert answer.status_code == 204, (path, answer.text)
        allowed = set(answer.headers["allow"].split(", "))
        assert documented | {"OPTIONS"} <= allowed, (template, sorted(allowed), sorted(documented))
        missing = {"GET", "PUT", "PATCH", "DELETE"} - allowed
        if missing and template.startswith("/api/"):  # elsewhere a change without a form token is 403 first
            refused = http.request(sorted(missing)[0], shared_server.url + path)
            assert refused.status_code == 405, (path, refused.text)
            assert set(refused.headers["allow"].split(", ")) == allowed, path
        checked += len(documented)
    assert checked >= 25
    # the session: GET, PATCH and DELETE (Litestar's own OPTIONS answer named DELETE and OPTIONS only)
    session = http.request("OPTIONS", shared_server.url + "/api/sessions/1")
    assert session.headers["allow"] == "DELETE, GET, OPTIONS, PATCH"
