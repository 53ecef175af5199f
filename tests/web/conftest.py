"""What the web tests share: one Chromium, and one first start with the demo, for the run."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, sync_playwright

from tests.support.browser import CHROMIUM, FLAGS
from tests.support.built_once import built_once
from tests.support.servers import LiveServer, started_server, started_with_demo, wait_done


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """One Chromium for the run. A module's tests share one page, made as good as new before each test
    (tests/support/browser.py's `ModulePage`: cookies, storage and cache cleared, the viewport set back); a test
    that needs other context options (axe's, JavaScript off once) makes a context of its own."""
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


@pytest.fixture(scope="session")
def demo_data(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the shared demo server's data dir once the demo session is computed (the database copied by
    SQLite's backup, the arrays as files), taken once for the run (tests/support/built_once.py): each server of a
    test's own with the demo starts from a copy of it instead of generating the demo again, and a worker that finds
    it taken starts no demo server for it. Not to be changed: its users copy it."""

    def copy_demo(root: Path) -> dict[str, int]:
        shared_demo_server: LiveServer = request.getfixturevalue("shared_demo_server")
        wait_done(shared_demo_server, 1)
        copy = root / "data"
        ignore = shutil.ignore_patterns("metadata.sqlite3*", "staging")
        shutil.copytree(shared_demo_server.data_dir, copy, ignore=ignore)
        source = sqlite3.connect(shared_demo_server.data_dir / "metadata.sqlite3")
        target = sqlite3.connect(copy / "metadata.sqlite3")
        try:
            source.backup(target)
        finally:
            target.close()
            source.close()
        return {"session": 1}

    built, _ = built_once(tmp_path_factory, "demo", copy_demo)
    return built / "data"


@pytest.fixture(scope="session")
def one_ingest_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One server with a single ingest slot (TENSOR_DEBUGGER_INGEST_WORKERS=1) per worker, for the tests that
    need uploads ingested one at a time (the order of the queue, the slot's one child). The same manners as
    `shared_server`: each test its own session names, nothing left under way when it ends."""
    server = started_server(tmp_path_factory.mktemp("one-ingest-server"), env={"TENSOR_DEBUGGER_INGEST_WORKERS": "1"})
    yield server
    server.stop()


@pytest.fixture
def demo_server(demo_data: Path, tmp_path: Path) -> Iterator[LiveServer]:
    """A server of the test's own with the demo session computed (a copy of `demo_data`), as it is after the first
    start: for a test that changes the demo session or restarts the server."""
    server = started_with_demo(demo_data, tmp_path)
    yield server
    server.stop()
