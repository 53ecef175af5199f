"""The session's worst pairs, and the one ranking of pairs by a statistic that the session page sorts its table by
too: the compared pairs with the largest max |diff| and those with the lowest cosine similarity (the largest
1 − cosine), worst first. NaN ranks as the worst value there is; a pair without statistics (not compared yet,
incomparable, failed, or judged on summary statistics alone) has no rank and comes after every pair that has one."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tensor_debugger.compare.reports.pair_report import PairReport
from tensor_debugger.compare.reports.pair_stats import PairStatsSummary
from tensor_debugger.engine.metrics import Number, parse_number
from tensor_debugger.store.reports import PairStatus

WORST_COUNT = 10  # pairs in each list
COMPARED = (PairStatus.PASS, PairStatus.FAIL)


@dataclass(frozen=True)
class RankedPair:
    """A pair of a worst-pairs list, with the two statistics it is ranked by."""

    pair_id: int
    name: str  # the pair's name (the reference tensor's)
    b_name: str  # the candidate tensor's
    run_id: int  # the candidate run's
    status: PairStatus
    max_abs_diff: Number
    cosine: Number | None


@dataclass(frozen=True)
class WorstPairs:
    """At most WORST_COUNT compared pairs each, worst first: by the largest max |diff|, and by the lowest cosine
    similarity. Both empty while no pair is compared."""

    by_max_abs_diff: list[RankedPair] = field(default_factory=list)
    by_cosine: list[RankedPair] = field(default_factory=list)


def stat_value(stats: PairStatsSummary | None, key: str) -> float:
    """A statistic of a pair as a float (the API's "nan" and "inf" as NaN and Inf); NaN without statistics."""
    if stats is None:
        return math.nan
    value = parse_number(getattr(stats, key))
    return float(value) if value is not None else math.nan


def _worst_first(value: float) -> float:
    return -math.inf if math.isnan(value) else value


def by_largest_diff(pair: PairReport) -> tuple[bool, float]:
    """Sort key: the largest max |diff| first (NaN before anything), pairs without statistics last."""
    return pair.stats is None, _worst_first(-stat_value(pair.stats, "max_abs_diff"))


def by_lowest_cosine(pair: PairReport) -> tuple[bool, float]:
    """Sort key: the lowest cosine similarity first (NaN before anything), pairs without statistics last."""
    return pair.stats is None, _worst_first(stat_value(pair.stats, "cosine"))


def worst_pairs(pairs: Sequence[PairReport], count: int = WORST_COUNT) -> WorstPairs:
    """The `count` worst compared pairs by each statistic; ties keep the pairs' order (execution order)."""
    # a pair of 0 elements has no difference to rank (its cosine is None, never the worst)
    compared = [p for p in pairs if p.status in COMPARED and p.stats is not None and p.stats.numel > 0]
    return WorstPairs(
        [_ranked(p) for p in sorted(compared, key=by_largest_diff)[:count]],
        [_ranked(p) for p in sorted(compared, key=by_lowest_cosine)[:count]],
    )


def _ranked(pair: PairReport) -> RankedPair:
    """A compared pair (one with statistics) as its lists show it."""
    stats = pair.stats
    if stats is None:
        raise ValueError(f"pair {pair.id} ({pair.name}) has no statistics to rank it by")
    return RankedPair(pair.id, pair.name, pair.b.name, pair.b.run_id, pair.status, stats.max_abs_diff, stats.cosine)
