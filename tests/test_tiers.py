"""The quick tier (`make test`) and the slow one (`make test-slow`) split the suite: every entry of
tests/slow_tests.txt still names a test (a renamed test would otherwise drift back into the quick tier unseen),
and the two tiers together are the whole suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tiers import listed_tests

REPO = Path(__file__).resolve().parent.parent


def _collected(*args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args, "tests"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode in (0, 5), done.stdout[-3000:] + done.stderr[-3000:]
    return {line for line in done.stdout.splitlines() if "::" in line and not line.startswith(" ")}


@pytest.mark.slow
def test_every_listed_slow_test_exists_and_the_tiers_make_the_suite() -> None:
    everything = _collected()
    files = {test.split("::", 1)[0] for test in everything}
    stale = [entry for entry in listed_tests() if entry not in (everything if "::" in entry else files)]
    assert not stale, f"tests/slow_tests.txt names tests that no longer exist: {stale}"
    quick, slow = _collected("-m", "not slow"), _collected("-m", "slow")
    assert quick and slow and not quick & slow
    assert quick | slow == everything
    assert "tests/test_lint.py::test_mypy_strict_is_clean" in slow
    assert "tests/test_tiers.py::test_every_listed_slow_test_exists_and_the_tiers_make_the_suite" in slow
