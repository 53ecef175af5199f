"""The pair page's parts computed on the server, without a browser."""

from __future__ import annotations

from tensor_debugger.web.views.pair_page import histogram_bars


def test_the_histogram_is_on_a_log_scale_of_counts() -> None:
    counts = [129_792, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 816, 0, 0, 0, 0, 0, 0]
    bars = histogram_bars(counts)
    assert bars[0]["percent"] == 100 and bars[0]["label"] == "0"
    decade = next(b for b in bars if b["count"] == 816)
    assert decade["label"] == "1e-2" and 55 < decade["percent"] < 60  # log10(817) / log10(129793)
    assert all(b["percent"] == 0 for b in bars if b["count"] == 0)
