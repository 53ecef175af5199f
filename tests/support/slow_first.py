"""The run's test files ordered slowest first, by the seconds their tests took when they last ran (pytest's cache,
.pytest_cache; a run of some tests updates only theirs): with pytest-xdist's workers taking work as they free up
(`--dist worksteal`, the Makefile's), the long tests that start their own servers begin at once and the short ones
fill in around them, instead of one long test starting last while the other worker has nothing left. Tests keep
their order within a file (its module fixtures are set up once); a file with no time recorded (new, or a first run)
keeps its place after those with one. Only the order changes: every test collected runs."""

from __future__ import annotations

from collections import defaultdict

import pytest

CACHE_KEY = "tensor_debugger/test_seconds"  # seconds by test id: setup, call and teardown


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class SlowFirst:
    """A pytest plugin: records each test's seconds and orders the files by the sum of their tests'."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def _cache(self) -> pytest.Cache | None:
        return getattr(self.config, "cache", None)  # None under -p no:cacheprovider

    def _recorded(self) -> dict[str, float]:
        cache = self._cache()
        found = cache.get(CACHE_KEY, {}) if cache is not None else {}
        if not isinstance(found, dict):
            return {}
        return {str(k): float(v) for k, v in found.items() if isinstance(v, int | float)}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        recorded: defaultdict[str, float] = defaultdict(float)
        for test, seconds in self._recorded().items():
            recorded[_file(test)] += seconds
        if not recorded:
            return
        first_seen: dict[str, int] = {}
        for index, item in enumerate(items):
            first_seen.setdefault(_file(item.nodeid), index)

        def key(item: pytest.Item) -> tuple[float, int]:
            file = _file(item.nodeid)
            return (-recorded.get(file, 0.0), first_seen[file])

        items.sort(key=key)  # stable: a file's tests keep their order

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # in a pytest-xdist run the controller gets every worker's reports: it alone records (below)
        self.seconds[report.nodeid] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        cache = self._cache()
        if cache is None or hasattr(self.config, "workerinput") or not self.seconds:
            return
        recorded = self._recorded()
        recorded.update({test: round(seconds, 3) for test, seconds in self.seconds.items()})
        cache.set(CACHE_KEY, recorded)
