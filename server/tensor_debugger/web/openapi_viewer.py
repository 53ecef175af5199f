"""The OpenAPI pages at /schema: Redoc from the app's own static files (web/static/vendor/redoc), no CDN and no
inline script, so the viewer works offline and under the app's Content-Security-Policy; and the JSON schema."""

from __future__ import annotations

import html
from typing import Any

from litestar import Request
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin, RedocRenderPlugin

REDOC_BUNDLE = "vendor/redoc/redoc.standalone.js"  # under web/static


class LocalRedoc(RedocRenderPlugin):
    """Redoc's page as its standalone bundle starts itself: a <redoc spec-url> element and the bundle after it."""

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        title = html.escape(str(openapi_schema["info"]["title"]))
        spec_url = html.escape(self.get_openapi_json_route(request))
        return (
            '<!doctype html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{title} API</title><link rel="icon" href="data:,"></head>'
            f'<body><redoc spec-url="{spec_url}"></redoc><script src="{html.escape(self.js_url)}"></script></body>'
            "</html>"
        ).encode()


class JsonSchema(JsonRenderPlugin):
    """/schema/openapi.json, with every `oneOf` that offers both a number and an integer offering the number alone: a
    statistic is a float, or an exact integer for an integer pair (compare/module_reports.py's `Number`), and JSON
    Schema counts 0.0 an integer too, so `oneOf` would refuse every whole number for matching both."""

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return self.render_json(request, _numbers_once(openapi_schema))


def _numbers_once(node: Any) -> Any:
    """`node` (the OpenAPI document or a part of it) with `{"type": "integer"}` left out of a `oneOf` beside
    `{"type": "number"}`."""
    if isinstance(node, list):
        return [_numbers_once(item) for item in node]
    if not isinstance(node, dict):
        return node
    found = {key: _numbers_once(value) for key, value in node.items()}
    choices = found.get("oneOf")
    if isinstance(choices, list) and {"type": "number"} in choices and {"type": "integer"} in choices:
        kept = [c for c in choices if c != {"type": "integer"}]
        if len(kept) == 1:
            del found["oneOf"]
            found.update(kept[0])
        else:
            found["oneOf"] = kept
    return found


def openapi_config(title: str, version: str, redoc_url: str) -> OpenAPIConfig:
    """/schema (and /schema/redoc): the viewer, loading `redoc_url`; /schema/openapi.json: the schema."""
    return OpenAPIConfig(
        title=title,
        version=version,
        path="/schema",
        render_plugins=[
            LocalRedoc(js_url=redoc_url, google_fonts=False, path=["/", "/redoc"], favicon=""),
            JsonSchema(),
        ],
    )
