"""The one way the tests wait for something to happen: poll, and on time-out say what was waited for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    check: Callable[[], T],
    *,
    what: str,
    timeout: float = 60,
    interval: float = 0.05,
    until: Callable[[T], object] | None = None,
) -> T:
    """Call `check` until its answer is truthy (or, given `until`, until `until(answer)` is) and return that answer.

    After `timeout` seconds, fail with an AssertionError naming `what` was waited for and the last answer. An exception
    from `check` (a process found dead, an assertion) ends the wait at once. The timeout only bounds the wait: no
    test asserts how long anything took.
    """
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if until(answer) if until is not None else answer:
            return answer
        if time.monotonic() >= deadline:
            last = repr(answer)
            if len(last) > 2000:
                last = last[:2000] + "…"
            raise AssertionError(f"waited {timeout:g} s for {what}; the last answer was {last}")
        time.sleep(interval)
