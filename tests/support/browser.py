"""Debian's Chromium, driven by Playwright: one browser for the whole run (tests/web/conftest.py's `browser`)."""

from __future__ import annotations

from playwright.sync_api import Page

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


def shot(page: Page, name: str) -> None:
    """A screenshot of the whole page into test-artifacts/ (looked at before a page change is called done)."""
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
