"""The suite's two tiers. `make test` runs the quick one (`-m "not slow"`), `make test-slow` the rest, `make ci`
both. This plugin marks a test `slow` when:

- it drives Chromium (marked `browser`);
- it needs a service started for it: PostgreSQL, SeaweedFS's S3, a Dask cluster, a server of its own
  (the fixtures in `SERVICE_FIXTURES`), or it is parametrized onto PostgreSQL, S3 or Dask
  (tests/support/backends.py);
- `tests/slow_tests.txt` names it or its file: the tests that took more than about a second on a quiet 2-core
  machine (lint, packaging, the fuzzer, the answers on unseen models, the big ingests). `tests/test_tiers.py`
  checks that each entry still names a test.

Only the mark is added: every test runs in `make ci`, and `pytest` with no `-m` runs both tiers."""

from __future__ import annotations

from pathlib import Path

import pytest

LISTED = Path(__file__).resolve().parent.parent / "slow_tests.txt"

SERVICE_FIXTURES = frozenset(
    {
        "postgres",
        "s3",
        "dask_cluster",
        "own_postgres",
        "own_s3",
        "_outage_postgres",
        "_outage_s3",
        "browser",
        "live_server",
        "token_server",
    }
)

# each parametrized backend fixture and its default, the one that needs no service (tests/conftest.py)
BACKEND_DEFAULTS = {"database_url": "sqlite", "store_url": "files", "dask_scheduler": ""}


def listed_tests(path: Path = LISTED) -> list[str]:
    """The entries of tests/slow_tests.txt: node ids, or test files (every test in them)."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def needs_a_service(item: pytest.Item) -> bool:
    if item.get_closest_marker("browser") is not None:
        return True
    if SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    return any(params.get(name, default) != default for name, default in BACKEND_DEFAULTS.items())


class Tiers:
    """A pytest plugin: marks the slow tier's tests (module docstring)."""

    def __init__(self) -> None:
        entries = listed_tests()
        self.files = {entry for entry in entries if "::" not in entry}
        self.tests = {entry for entry in entries if "::" in entry}

    @pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the mark
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            if item.nodeid in self.tests or item.nodeid.split("::", 1)[0] in self.files or needs_a_service(item):
                item.add_marker(pytest.mark.slow)
