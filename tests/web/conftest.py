"""What the web tests share: one Chromium, and one first start with the demo, for the run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, sync_playwright

from tests.support.browser import CHROMIUM, FLAGS
from tests.support.servers import LiveServer, started_server


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """One Chromium for the run; each test gets a context (cookies, storage, cache) and a page of its own."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield launched
        launched.close()


@pytest.fixture(scope="session")
def shared_demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A first start with the demo, for the tests that only look at the demo session (and never change it)."""
    server = started_server(tmp_path_factory.mktemp("demo-server"), demo=True)
    yield server
    server.stop()
