"""The pair page's parts computed on the server, without a browser."""

from __future__ import annotations

from tensor_debugger.web.views.pair_page import histogram_bars


def test_the_histogram_is_on_a_log_scale_of_counts() -> None:
    counts = [129_792, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 816, 0, 0, 0, 0, 0, 0]
    bars = histogram_bars(counts)
    assert bars[0].percent == 100 and bars[0].label == "0"
    decade = next(b for b in bars if b.count == 816)
    assert decade.label == "1e-2" and 55 < decade.percent < 60  # log10(817) / log10(129793)
    assert all(b.percent == 0 for b in bars if b.count == 0)


def test_each_bar_reads_out_its_exact_range_count_and_share() -> None:
    counts = [129_792, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 816, 0, 0, 0, 0, 0, 1]
    bars = histogram_bars(counts)
    assert bars[0].readout == "|diff| exactly 0: 129,792 elements (99.4% of 130,612)"
    assert bars[1].readout == "|diff| above 0, below 1e-11: 3 elements (0.0023% of 130,612)"
    assert bars[11].readout == "|diff| 1e-2 up to 1e-1: 816 elements (0.625% of 130,612)"
    assert bars[-1].readout == "|diff| 1e4 or more (Inf included): 1 element (0.000766% of 130,612)"
