"""Requests to the servers a test started, through one client for the whole run: `httpx.get` and its siblings build
a client per call, whose TLS context (the CA bundle read again) costs more than a request to loopback itself (about
25 ms of the 30 ms on a quiet machine). The client keeps no cookies, so each request says who sends it by its own
headers and cookies, as with `httpx.get`; it is made at the first request, not at import."""

from __future__ import annotations

import functools
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx


@functools.cache
def client() -> httpx.Client:
    return httpx.Client(cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])))


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    return client().request(method, url, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return client().get(url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return client().post(url, **kwargs)


def put(url: str, **kwargs: Any) -> httpx.Response:
    return client().put(url, **kwargs)


def patch(url: str, **kwargs: Any) -> httpx.Response:
    return client().patch(url, **kwargs)


def delete(url: str, **kwargs: Any) -> httpx.Response:
    return client().delete(url, **kwargs)
