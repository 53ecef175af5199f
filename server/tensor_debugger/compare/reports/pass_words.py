"""What a verdict of no divergence rests on, in the words every surface says it with (the CLI's `compare`, its
`--json`, the session page): a pass on full values says every element is within tolerance; a pass on a capture's
summaries (values="summary") only that its summaries found no difference; a pass on a use_repr=True trace's printed
statistics only that its shape, mean, std, min and max agree to the digits printed. None of the latter two is a
verified pass of the elements, which were never compared."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tensor_debugger.compare.reports.summary_reports import SummaryReport

# what a use_repr=True trace keeps of a tensor, and so what a pass of one of its pairs says
PRINTED_STATISTICS = (
    "a trace written with use_repr=True keeps each tensor's shape and its mean, std, min and max printed to 5 "
    "significant digits, never its elements: a smaller difference is not seen"
)


def on_printed_statistics(summary: SummaryReport | None) -> bool:
    """Whether a pair's verdict rests on a use_repr=True trace's printed statistics (mean, std, min and max), not on
    its elements nor on a capture's summaries."""
    return summary is not None and not summary.on_summary


@dataclass(frozen=True)
class PassBasis:
    """One pair, for the words: its status ("pass", "fail", ...), whether its verdict rests on a capture's summaries
    (`sketched`), bit-identical by its content hash there (`identical`), its content hashes differing there
    (`hashes_differ`: its values differ, though the summaries found nothing outside tolerance), or on printed
    statistics (`printed`)."""

    status: str
    sketched: bool = False
    identical: bool = False
    printed: bool = False
    hashes_differ: bool = False


def statistics_words(count: int) -> str:
    """The hedge of `count` passes on printed statistics ("" where none)."""
    if not count:
        return ""
    return f"{count} compared on printed statistics only: {PRINTED_STATISTICS}"


def no_divergence_words(pairs: Sequence[PassBasis], compared: int | None = None, tensors: int | None = None) -> str:
    """A candidate's verdict where none of its `pairs` fails: "nothing was compared" where none has a verdict; on
    what it compared only ("among the pairs compared") where a pair was not compared or, by its run's coverage, it
    compared fewer (`compared`) of the reference's tensors than it was asked to record (`tensors`); "found in the
    summaries" or "found in the printed statistics" where every pass rests on them, each hedge said."""
    if pairs and not any(p.status in ("pass", "fail") for p in pairs):
        return f"nothing was compared: 0 of {len(pairs)} pairs compared"
    passing = [p for p in pairs if p.status == "pass"]
    short = compared is not None and tensors is not None and compared < tensors
    among = " among the pairs compared" if len(passing) < len(pairs) or short or not pairs else ""
    sketched = sum(1 for p in passing if p.sketched and not p.identical)
    printed = sum(1 for p in passing if p.printed)
    found = (
        " found in the printed statistics"
        if passing and printed == len(passing)
        else " found in the summaries"
        if passing and sketched == len(passing)
        else ""
    )
    told = f"no divergence{found}{among}: {len(passing)} of {len(pairs)} pairs pass"
    if short:
        told += f", {compared} of {tensors} reference tensors compared"
    differ = sum(1 for p in passing if p.sketched and not p.identical and p.hashes_differ)
    hedges = [
        f"{sketched} from summaries: no difference found in the summaries, not every element compared"
        + (f", though the content hashes of {differ} of them differ (their values differ)" if differ else "")
        if sketched
        else "",
        statistics_words(printed),
    ]
    said = "; ".join(h for h in hedges if h)
    return f"{told} ({said})" if said else told


def statistics_before_words(count: int) -> str:
    """Under a first divergence: that the `count` pairs before it passed on printed statistics only ("" where
    none did): where the difference began is not known."""
    if not count:
        return ""
    pairs = "1 pair before it was" if count == 1 else f"{count} pairs before it were"
    return (
        f"{pairs} compared on printed statistics only, and passed there ({PRINTED_STATISTICS}): the divergence may "
        "have begun in one of them"
    )


def hashes_changed_words(name: str) -> str:
    """Where no pair diverged on summaries but content hashes differ from pair `name` on: not a verified pass."""
    return (
        f"values differ (content hashes) from {name} on; the summaries found nothing outside tolerance (they bound "
        "max |diff| from below: not every element compared)"
    )
