"""The ranges the server checks are in its OpenAPI document too, on a real server: a session's tolerances (rtol
and atol at least 0, ulp 1 to 2**20) and a pair profile's dimension (at least 0). Just outside each is refused
with 400, just inside accepted."""

from __future__ import annotations

import uuid
from typing import Any

from tests.support import loopback_http as http
from tests.support.servers import LiveServer


def bound(schema: dict[str, Any], key: str) -> Any:
    """A bound of an optional property: beside its oneOf (where Litestar puts it) or in its non-null branch."""
    branches = [schema, *(s for s in schema.get("oneOf", []) if s.get("type") != "null")]
    return next(s[key] for s in branches if key in s)


def test_tolerance_ranges_are_in_the_schema_and_kept(shared_server: LiveServer) -> None:
    document = http.get(shared_server.url + "/schema/openapi.json").json()
    patch = document["components"]["schemas"]["SessionPatch"]["properties"]
    assert bound(patch["rtol"], "minimum") == 0 and bound(patch["atol"], "minimum") == 0
    assert (bound(patch["ulp"], "minimum"), bound(patch["ulp"], "maximum")) == (1, 2**20)
    profile = document["paths"]["/api/pairs/{pair_id}/profile"]["get"]["parameters"]
    assert next(p for p in profile if p["name"] == "dim")["schema"]["minimum"] == 0

    made = http.post(shared_server.url + "/api/sessions", json={"name": f"ranges {uuid.uuid4().hex}"})
    assert made.status_code == 201, made.text
    url = f"{shared_server.url}/api/sessions/{made.json()['id']}"
    for body in ({"rtol": -1e-9}, {"atol": -1.0}, {"ulp": 0}, {"ulp": 2**20 + 1}):
        refused = http.patch(url, json=body)
        assert refused.status_code == 400, (body, refused.text)
        assert next(iter(body)) in refused.json()["detail"], refused.text
    accepted = http.patch(url, json={"rtol": 0.0, "atol": 0.0})
    assert accepted.status_code == 200, accepted.text
    assert http.patch(url, json={"ulp": 2**20}).status_code == 200
    assert http.get(f"{shared_server.url}/api/pairs/1/profile", params={"dim": -1}).status_code == 400
    http.delete(url)
