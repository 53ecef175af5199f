"""The count of wrong tokens per client address over time, on a clock the test turns (the server's side, 429
and Retry-After, is in tests/web/test_auth.py)."""

from __future__ import annotations

from tensor_debugger.web.sign_in_limits import MAX_ADDRESSES, SignInLimits


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_address_waits_until_its_oldest_wrong_token_leaves_the_window() -> None:
    clock = Clock()
    limits = SignInLimits(failures=3, window=60, clock=clock)
    for _ in range(2):
        limits.failed("a")
        clock.now += 10
    assert limits.retry_after("a") is None  # two wrong tokens: still free to try
    limits.failed("a")  # at 1020, the oldest at 1000
    assert limits.retry_after("a") == 40
    assert limits.retry_after("b") is None
    clock.now = 1059.5
    assert limits.retry_after("a") == 1  # never 0: a client told 0 would come back at once
    clock.now = 1060
    assert limits.retry_after("a") is None  # the first left the window; two remain
    limits.failed("a")
    assert limits.retry_after("a") == 10  # now the one at 1010 must leave


def test_the_addresses_remembered_are_bounded() -> None:
    limits = SignInLimits(failures=1, window=60, clock=Clock())
    addresses = [f"10.0.{n // 256}.{n % 256}" for n in range(MAX_ADDRESSES + 5)]
    for address in addresses:
        limits.failed(address)
    assert len(limits.recent) == MAX_ADDRESSES
    assert limits.retry_after(addresses[0]) is None  # the oldest forgotten first
    assert limits.retry_after(addresses[-1]) == 60
