"""tests/support/browser.py's `ModulePage`: the one page a module's browser tests share is, after `fresh`, as a
new context's would be: no cookie, no storage, no cached file, the module's viewport, no pointer on the page."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, ViewportSize

from tests.support.browser import ModulePage
from tests.support.servers import LiveServer

pytestmark = pytest.mark.browser

VIEWPORT: ViewportSize = {"width": 1280, "height": 900}
# what the test before may have left: a cookie, storage, the viewport, the pointer, the cache (the stylesheet
# "cached" where fewer bytes came over the wire than its body: from the cache, or a 304)
LEFT = """() => ({
    cookie: document.cookie,
    local: localStorage.length,
    session: sessionStorage.length,
    width: innerWidth,
    hovered: document.querySelectorAll(':hover').length,
    stylesheet: performance.getEntriesByType('resource').filter(e => e.name.includes('/static/app.css'))
        .map(e => e.transferSize > e.encodedBodySize ? 'fetched' : 'cached'),
})"""


def test_a_fresh_page_keeps_nothing_of_the_test_before(shared_server: LiveServer, browser: Browser) -> None:
    shared = ModulePage(browser, VIEWPORT)
    try:
        page = shared.fresh()
        # what a test may do to the shared page: set a cookie and both storages, narrow the window, hover
        page.goto(f"{shared_server.url}/")
        page.evaluate("document.cookie = 'c=1'; localStorage.setItem('l', '1'); sessionStorage.setItem('s', '1')")
        page.set_viewport_size({"width": 390, "height": 844})
        page.mouse.move(20, 20)
        left = page.evaluate(LEFT)
        assert (left["cookie"], left["local"], left["session"], left["width"]) == ("c=1", 1, 1, 390)
        assert left["hovered"] > 0
        page.goto(f"{shared_server.url}/")  # the same page again, not made fresh: served from the cache
        assert page.evaluate(LEFT)["stylesheet"] == ["cached"]
        assert shared.fresh() is page  # the same page, not a new one
        page.goto(f"{shared_server.url}/")
        assert page.evaluate(LEFT) == {
            "cookie": "",
            "local": 0,
            "session": 0,
            "width": 1280,
            "hovered": 0,
            "stylesheet": ["fetched"],
        }
        assert shared.context.cookies() == []
    finally:
        shared.close()


def test_a_closed_page_is_replaced(shared_server: LiveServer, browser: Browser) -> None:
    shared = ModulePage(browser, VIEWPORT, java_script_enabled=False)
    try:
        closed = shared.fresh()
        closed.close()
        page = shared.fresh()
        assert page is not closed and not page.is_closed()
        page.goto(f"{shared_server.url}/")
        assert page.locator("h1").count() >= 1
    finally:
        shared.close()
