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


def openapi_config(title: str, version: str, redoc_url: str) -> OpenAPIConfig:
    """/schema (and /schema/redoc): the viewer, loading `redoc_url`; /schema/openapi.json: the schema."""
    return OpenAPIConfig(
        title=title,
        version=version,
        path="/schema",
        render_plugins=[
            LocalRedoc(js_url=redoc_url, google_fonts=False, path=["/", "/redoc"], favicon=""),
            JsonRenderPlugin(),
        ],
    )
