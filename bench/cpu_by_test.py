"""The CPU of each test, and of each test file: a pytest plugin that appends one JSON line per test to a file (this
process's user + system CPU, `getrusage(RUSAGE_SELF)`, and that of the children it waited for, `RUSAGE_CHILDREN`:
subprocess.run, a Popen waited on; not a service nobody waits for), setup, call and teardown together; run as a
script, it sums a file of those lines by test file.

    PYTHONPATH=bench CPU_BY_TEST=/tmp/cpu.jsonl .venv/bin/python -m pytest -n 0 -p cpu_by_test tests/live
    .venv/bin/python bench/cpu_by_test.py /tmp/cpu.jsonl

With `-n 0` the first test to import something (torch, transformers) pays for it. Under pytest-xdist each worker
appends its own lines (the `worker` field says which)."""

from __future__ import annotations

import json
import os
import platform
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Generator
from typing import Any

import pytest


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, None]:
    own, children = _cpu()
    start = time.perf_counter()
    yield
    own_after, children_after = _cpu()
    line = {
        "id": item.nodeid,
        "self": round(own_after - own, 3),
        "children": round(children_after - children, 3),
        "wall": round(time.perf_counter() - start, 2),
        "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
    }
    with open(os.environ.get("CPU_BY_TEST", "cpu_by_test.jsonl"), "a") as out:
        out.write(json.dumps(line) + "\n")


def main(path: str) -> None:
    by_file: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    with open(path) as lines:
        for line in lines:
            test = json.loads(line)
            totals = by_file[test["id"].split("::")[0]]
            totals[0] += 1
            totals[1] += test["self"]
            totals[2] += test["children"]
    print(f"{platform.node()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} now")
    print(f"{'file':<60} {'tests':>5} {'pytest CPU s':>13} {'children CPU s':>15}")
    for name, (count, own, children) in sorted(by_file.items(), key=lambda item: -(item[1][1] + item[1][2])):
        print(f"{name:<60} {int(count):>5} {own:>13.1f} {children:>15.1f}")
    print(f"{'all':<60} {sum(int(t[0]) for t in by_file.values()):>5} "
          f"{sum(t[1] for t in by_file.values()):>13.1f} {sum(t[2] for t in by_file.values()):>15.1f}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
