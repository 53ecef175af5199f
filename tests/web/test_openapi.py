"""The OpenAPI document describes every JSON answer of the API: each 2xx application/json response of an /api/
path has a schema that says something (not missing, not `{}`), so clients can be generated from it; and in the
document a running server serves, every response of every /api/ operation is typed all the way down (no field,
item or member left `{}`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tensor_debugger.settings import Settings
from tensor_debugger.web.app import create_app

from tests.support import loopback_http as http
from tests.support.servers import LiveServer, upload, wait_done


def openapi_document(tmp_path: Path) -> dict[str, Any]:
    """Built from the routes' annotations, without starting the app (nothing is opened)."""
    app = create_app(Settings(data_dir=tmp_path / "data", demo=False))
    document: dict[str, Any] = app.openapi_schema.to_schema()
    return document


def _resolve(schema: dict[str, Any], document: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].removeprefix("#/components/schemas/")
        schema = document["components"]["schemas"][name]
    return schema


def _says_nothing(schema: dict[str, Any], document: dict[str, Any]) -> bool:
    """Whether a schema leaves its value untyped: missing, `{}`, an object of any keys (`additionalProperties: {}`,
    what a `dict[str, Any]` return makes), an array of such, or a union with such a member."""
    schema = _resolve(schema, document)
    if not schema or set(schema) <= {"description", "title"}:
        return True
    for key in ("oneOf", "anyOf", "allOf"):
        if key in schema:
            return any(_says_nothing(member, document) for member in schema[key])
    if schema.get("type") == "array":
        return _says_nothing(schema.get("items") or {}, document)
    if schema.get("type") == "object" and not schema.get("properties"):
        values = schema.get("additionalProperties")
        return not isinstance(values, dict) or _says_nothing(values, document)
    return False


def undocumented_json_responses(document: dict[str, Any]) -> list[str]:
    """Every 2xx answer of an /api/ path that says nothing of its body: no content where there is one (all but
    204), or JSON whose schema leaves it untyped."""
    missing = []
    for where, status, response in api_responses(document):
        if not str(status).startswith("2"):
            continue
        content = response.get("content") or {}
        if not content and str(status) != "204":
            missing.append(f"{where} {status}: no content")
        if "application/json" not in content:
            continue
        if _says_nothing(content["application/json"].get("schema") or {}, document):
            missing.append(f"{where} {status}")
    return missing


def api_responses(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """("METHOD /api/path", status, response) of every response of every /api operation the document lists."""
    for path, item in document["paths"].items():
        if not path.startswith("/api/"):
            continue
        for method, operation in item.items():
            if isinstance(operation, dict) and "responses" in operation:
                for status, response in operation["responses"].items():
                    yield f"{method.upper()} {path}", str(status), response


def test_every_json_response_of_the_api_has_a_schema(tmp_path: Path) -> None:
    document = openapi_document(tmp_path)
    assert any(p.startswith("/api/") for p in document["paths"])
    assert undocumented_json_responses(document) == []


def test_reports_are_documented_with_their_fields(tmp_path: Path) -> None:
    """The typed reports land in the components with the fields the JSON has (statuses as their values)."""
    schemas = openapi_document(tmp_path)["components"]["schemas"]
    pair = next(s for name, s in schemas.items() if name.endswith("PairReport"))
    assert {"id", "status", "strategy", "alignment", "a", "b", "stats"} <= set(pair["properties"])
    status = _resolve(pair["properties"]["status"], {"components": {"schemas": schemas}})
    assert set(status.get("enum", [])) == {"pending", "pass", "fail", "incomparable", "error"}


def test_the_check_catches_an_undocumented_response() -> None:
    document = {
        "paths": {"/api/things": {"get": {"responses": {"200": {"content": {"application/json": {"schema": {}}}}}}}},
        "components": {"schemas": {}},
    }
    assert undocumented_json_responses(document) == ["GET /api/things 200"]


def untyped_parts(document: dict[str, Any]) -> list[str]:
    """Every place, in any response (any status, any content type) of an /api/ operation, whose schema leaves its
    value untyped (`{}`, or an object of any keys), however deep: a field of an object, an array's items, a union's
    member, a map's values. Each named by the component holding it, else the operation, status and content type
    ("SliceReport.a", "GET /api/things 200 application/json:")."""
    found: list[str] = []

    def walk(schema: dict[str, Any], where: str, seen: frozenset[str]) -> None:
        if "$ref" in schema:
            name = schema["$ref"].removeprefix("#/components/schemas/")
            if name not in seen:
                walk(document["components"]["schemas"][name], name, seen | {name})
            return
        if not set(schema) - {"description", "title", "examples", "default", "deprecated"}:
            found.append(where)  # `{}`: any value at all
            return
        for key in ("oneOf", "anyOf", "allOf"):
            for member in schema.get(key, []):
                walk(member, f"{where}|", seen)
        if schema.get("type") == "array":
            walk(schema.get("items") or {}, f"{where}[]", seen)
        for field, value in (schema.get("properties") or {}).items():
            walk(value, f"{where}.{field}", seen)
        values = schema.get("additionalProperties")
        if isinstance(values, dict):
            walk(values, f"{where}{{}}", seen)
        elif schema.get("type") == "object" and not schema.get("properties"):
            found.append(f"{where}{{}}")

    for where, status, response in api_responses(document):
        for media, content in (response.get("content") or {}).items():
            walk(content.get("schema") or {}, f"{where} {status} {media}:", frozenset())
    return sorted(set(found))


def test_every_response_of_the_served_document_is_typed_all_the_way_down(shared_server: LiveServer) -> None:
    """The document a running server serves at /schema/openapi.json, every operation and status: a client
    generated from it gets a type for every value (a slice's values are numbers, "nan"/"inf" or nested lists of
    them, not `{}`)."""
    document = http.get(shared_server.url + "/schema/openapi.json", headers=shared_server.auth).json()
    operations = [m for path, item in document["paths"].items() if path.startswith("/api/") for m in item]
    assert len(operations) >= 25, operations
    assert undocumented_json_responses(document) == []
    assert untyped_parts(document) == []


def test_the_deep_check_catches_an_untyped_field_item_or_member() -> None:
    untyped: dict[str, Any] = {}
    document = {
        "paths": {
            "/api/things": {
                "get": {
                    "responses": {
                        "200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Thing"}}}}
                    }
                }
            }
        },
        "components": {
            "schemas": {
                "Thing": {
                    "type": "object",
                    "properties": {
                        "ok": {"type": "integer"},
                        "values": untyped,
                        "rows": {"type": "array", "items": {"oneOf": [{"type": "number"}, untyped]}},
                        "notes": {"type": "object"},
                        "itself": {"$ref": "#/components/schemas/Thing"},
                    },
                }
            }
        },
    }
    assert untyped_parts(document) == ["Thing.notes{}", "Thing.rows[]|", "Thing.values"]


def overlapping_unions(document: dict[str, Any]) -> list[str]:
    """Every oneOf, in the document's components and /api/ paths, with both an integer and a number member: JSON
    Schema's integers are numbers too, so an integer matches both and oneOf refuses it."""
    found: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            types = [m.get("type") for m in node.get("oneOf", []) if isinstance(m, dict)]
            if "integer" in types and "number" in types:
                found.append(where)
            for key, value in node.items():
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for item in node:
                walk(item, where)

    walk(document.get("components", {}), "components")
    walk({p: item for p, item in document["paths"].items() if p.startswith("/api/")}, "paths")
    return found


def test_no_union_refuses_an_integer(shared_server: LiveServer) -> None:
    """In the served document (the one built in this process without serving lists `int | float` as both)."""
    served = http.get(shared_server.url + "/schema/openapi.json", headers=shared_server.auth).json()
    assert overlapping_unions(served) == []
    assert overlapping_unions({"paths": {}, "components": {"x": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}})


def test_real_slices_hold_what_the_schema_says(shared_server: LiveServer, tmp_path: Path) -> None:
    """Windows of an integer and of a float tensor (whole-valued floats, NaN, infinities), as a running server
    answers them: numbers and "nan"/"inf" nested in the window's shape, as the schema says."""
    for side, shift in (("reference", 0), ("candidate", 1)):
        folder = tmp_path / side
        folder.mkdir()
        np.save(folder / "0_ints.npy", np.arange(12, dtype=np.int32).reshape(3, 4) + shift)
        floats = np.arange(12, dtype=np.float32).reshape(3, 4)
        floats[1, 1], floats[2, 3] = (np.nan, np.inf) if shift else (4.0, -np.inf)
        np.save(folder / "1_floats.npy", floats)
    files = [
        (side, tmp_path / side / name) for side in ("reference", "candidate") for name in ("0_ints.npy", "1_floats.npy")
    ]
    created = upload(shared_server, "openapi: slices decode", files)
    assert created.status_code == 201, created.text
    pairs = wait_done(shared_server, created.json()["session"]["id"])["pairs"]
    assert len(pairs) == 2, pairs
    seen = set()
    for pair in pairs:
        for index in (":,:", "1,:"):
            answer = http.get(
                f"{shared_server.url}/api/pairs/{pair['id']}/slice", params={"index": index}, headers=shared_server.auth
            )
            assert answer.status_code == 200, answer.text
            window = answer.json()
            for values in (window["a"], window["b"], window["diff"]):
                rows = values if index == ":,:" else [values]
                assert len(rows) == (3 if index == ":,:" else 1) and all(len(row) == 4 for row in rows), window
                assert all(isinstance(v, int | float) or v in ("nan", "inf", "-inf") for row in rows for v in row)
            seen.add(str(window["b"]))
    assert "[4.0, 'nan', 6.0, 7.0]" in seen and "[5, 6, 7, 8]" in seen, seen
