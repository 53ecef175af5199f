"""How often a wrong token may be presented before its sender must wait: `FAILURES` wrong tokens within
`WINDOW_SECONDS`, then 429 with `Retry-After` until the oldest of them is older than the window. Counted per key:
web/auth.py counts each wrong token against the client's address and against the token presented (so a client
that rotates addresses still runs into the count of the tokens it repeats); a right token is never refused, so
no one can lock its holder out, and does not reset the count (else the read token's holder could keep guessing
the write token between sign-ins). The client address is uvicorn's: the connection's, or the `X-Forwarded-For`
of a proxy in `TENSOR_DEBUGGER_TRUSTED_PROXIES` (none by default). Counted in this process's memory: each replica
counts its own.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable

FAILURES = 5
WINDOW_SECONDS = 60.0
MAX_ADDRESSES = 10_000  # the oldest keys are forgotten first past this many, so memory stays bounded


class SignInLimits:
    """Wrong tokens per key (a client address, a token's digest) over a sliding window."""

    def __init__(
        self,
        failures: int = FAILURES,
        window: float = WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures = failures
        self.window = window
        self.clock = clock
        self.recent: dict[str, deque[float]] = {}  # address -> when its wrong tokens came, oldest first
        self.lock = threading.Lock()

    def retry_after(self, address: str) -> int | None:
        """Whole seconds `address` must wait before presenting a token again; None when it may now."""
        now = self.clock()
        with self.lock:
            times = self._recent(address, now)
            if times is None or len(times) < self.failures:
                return None
            return max(1, math.ceil(times[-self.failures] + self.window - now))

    def failed(self, address: str) -> None:
        """`address` presented a wrong token."""
        now = self.clock()
        with self.lock:
            times = self._recent(address, now)
            if times is None:
                if len(self.recent) >= MAX_ADDRESSES:
                    self._forget(now)
                times = self.recent[address] = deque(maxlen=self.failures)
            times.append(now)

    def _recent(self, address: str, now: float) -> deque[float] | None:
        times = self.recent.get(address)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self.recent[address]
            return None
        return times

    def _forget(self, now: float) -> None:
        """Drop the addresses whose wrong tokens are all past the window, then the oldest until there is room."""
        for address in [a for a, times in self.recent.items() if times[-1] <= now - self.window]:
            del self.recent[address]
        while len(self.recent) >= MAX_ADDRESSES:
            del self.recent[next(iter(self.recent))]
