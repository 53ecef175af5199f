"""The OpenAPI document describes every JSON answer of the API: each 2xx application/json response of an /api/
path has a schema that says something (not missing, not `{}`), so clients can be generated from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tensor_debugger.settings import Settings
from tensor_debugger.web.app import create_app


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
    for path, item in document["paths"].items():
        if not path.startswith("/api/"):
            continue
        for method, operation in item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            for status, response in operation["responses"].items():
                if not str(status).startswith("2"):
                    continue
                content = response.get("content") or {}
                if not content and str(status) != "204":
                    missing.append(f"{method.upper()} {path} {status}: no content")
                if "application/json" not in content:
                    continue
                if _says_nothing(content["application/json"].get("schema") or {}, document):
                    missing.append(f"{method.upper()} {path} {status}")
    return missing


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
