"""Debian's Chromium, driven by Playwright: one browser for the whole run (tests/web/conftest.py's `browser`)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from playwright.sync_api import Browser, BrowserContext, CDPSession, Frame, Page, ViewportSize

from tests.support import ARTIFACTS
from tests.support.polling import wait_until

CHROMIUM = "/usr/bin/chromium"
# no sandbox (tests run as root here), no GPU, and none of Chromium's own network traffic
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


class ModulePage:
    """One context and one page for a module's tests, made as good as new before each test (`fresh`): a context
    and page of a test's own cost Chromium a renderer start, about 0.4 s of CPU (bench/browser_contexts.py), while
    one page navigated again does not. What a test leaves behind, and what `fresh` does about it:

    - the document, its scripts, timers and pending requests: the page goes to about:blank (which stays in its
      renderer, so the next page of the same site reuses it);
    - cookies: all cleared (a cookie of 127.0.0.1 is sent to every port, so every server of the run);
    - local and session storage, IndexedDB, Cache Storage, service workers: cleared for every origin the page's
      frames showed since the last `fresh` (Chromium's `Storage.clearDataForOrigin`, all storage types);
    - the HTTP cache: cleared (a fresh context's is empty: a test sees what a first visit sees);
    - the viewport: set back to the module's;
    - the pointer: moved off the page (a hover left on a chart would otherwise stay hovered).

    What it keeps, and no test here reads: the tab's history (`history.length` grows; a test's `go_back` goes
    back within its own visits) and the context's options (JavaScript on or off, downloads, timeouts), which are
    the module's. A page that a test closed or crashed is replaced by a new one."""

    def __init__(
        self,
        browser: Browser,
        viewport: ViewportSize,
        *,
        java_script_enabled: bool = True,
        timeout_ms: float | None = None,
    ) -> None:
        self.viewport = viewport
        self.context = browser.new_context(viewport=viewport, java_script_enabled=java_script_enabled)
        if timeout_ms is not None:
            self.context.set_default_timeout(timeout_ms)
        self.origins: set[str] = set()
        self.crashed = False
        self.page, self.devtools = self._new_page()

    def _new_page(self) -> tuple[Page, CDPSession]:
        page = self.context.new_page()
        page.on("framenavigated", self._shown)
        page.on("crash", self._crashed)
        return page, self.context.new_cdp_session(page)

    def _shown(self, frame: Frame) -> None:
        parts = urlsplit(frame.url)
        if parts.scheme in ("http", "https"):
            self.origins.add(f"{parts.scheme}://{parts.netloc}")

    def _crashed(self, page: Page) -> None:
        self.crashed = True

    def fresh(self) -> Page:
        """The module's page, as a new context's would be (see the class)."""
        if self.page.is_closed() or self.crashed:
            if not self.page.is_closed():
                self.page.close()
            self.page, self.devtools = self._new_page()
            self.crashed = False
        self.page.goto("about:blank")
        self.context.clear_cookies()
        for origin in sorted(self.origins):
            self.devtools.send("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"})
        self.origins.clear()
        self.devtools.send("Network.clearBrowserCache")
        self.page.set_viewport_size(self.viewport)
        self.page.mouse.move(-1, -1)
        return self.page

    def close(self) -> None:
        self.context.close()


AXE = Path(__file__).resolve().parent / "axe" / "axe.min.js"  # axe-core, vendored (axe/README.md)
# each serious or critical violation of the document as one line: its rule, its impact and its first three elements
AXE_SERIOUS = """async () => (await axe.run(document, {resultTypes: ['violations']})).violations
    .filter(v => v.impact === 'serious' || v.impact === 'critical')
    .map(v => `${v.id} (${v.impact}): ${v.nodes.slice(0, 3).map(n => n.target.join(' '))}`)"""


def axe_context(browser: Browser, viewport: ViewportSize) -> BrowserContext:
    """A context whose every page has axe-core as `axe` from its start. Given to the context once, as a script to
    run in each new document: the 650 kB are sent to Chromium once, and Chromium compiles them once (an
    `add_script_tag` per page sent and compiled them again each time: 0.2 s of CPU a page). It bypasses the pages'
    CSP only so that `axe.run` may do what it does; the pages themselves are unchanged (axe only defines `axe`)."""
    context = browser.new_context(viewport=viewport, bypass_csp=True)
    context.add_init_script(path=AXE)
    return context


def axe_violations(page: Page) -> list[str]:
    """axe-core's serious and critical violations of the page as it is laid out now (its viewport, its state)."""
    found: list[str] = page.evaluate(AXE_SERIOUS)
    return found


SCREENSHOTS = "TEST_SCREENSHOTS"  # set (not "0" or empty), `shot` writes its screenshots: `make screenshots`


def shot(page: Page, name: str) -> None:
    """A screenshot of the whole page into test-artifacts/, for a person to look at before a page change is called
    done, when the run was asked for them (`make screenshots`, which sets TEST_SCREENSHOTS=1). No test reads them,
    and a whole-page screenshot of a tall page is dear (0.6 s of Chromium's CPU for 1,280 x 11,108 px), so `make
    test` takes none."""
    if os.environ.get(SCREENSHOTS, "") in ("", "0"):
        return
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def wait_until_compared(page: Page, timeout: float = 60) -> None:
    """Reload until no pair is pending (the page refreshes itself meanwhile; a reload is simpler to await)."""

    def compared() -> bool:
        if page.locator(".progress").count() == 0:
            return True
        page.reload()
        return False

    wait_until(compared, what=f"{page.url} to show no pair pending", timeout=timeout, interval=0.2)


def open_new_session_form(page: Page) -> None:
    """Unfold the home page's new-session form (folded once sessions exist), as a user clicks its title."""
    details = page.locator("details.new-session")
    if details.get_attribute("open") is None:
        details.locator("summary").click()
