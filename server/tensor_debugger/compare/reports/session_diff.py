"""Two sessions side by side ("did my fix help, and did it break anything else?"): their pairs matched by name
(and by candidate label where a session has several candidates), each with its error in both and the change.

The error is a pair's max |diff|. A pair is "fixed" (failed in A, passes in B), "broken" (passed, fails), "better"
or "worse" (same verdict, error lower or higher by more than `CHANGE`, a factor), "same", only in one session,
"pending" (not compared yet in either: nothing is said of it until it is) or "not compared" (could not be).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.reports.coverage import Coverage, SessionVerdict
from tensor_debugger.compare.reports.pair_report import PairReport
from tensor_debugger.compare.reports.pair_reports import FirstDivergence, SessionPairs, session_pairs
from tensor_debugger.engine.metrics import Number, json_number, parse_number
from tensor_debugger.errors import NotFoundError
from tensor_debugger.store import catalog
from tensor_debugger.store.models import SessionRecord
from tensor_debugger.store.reports import PairStatus

CHANGE = 1.1  # an error counts as changed when one side's is more than 10% above the other's


class Change(StrEnum):
    FIXED = "fixed"
    BROKEN = "broken"
    BETTER = "better"
    WORSE = "worse"
    SAME = "same"
    ONLY_A = "only in A"
    ONLY_B = "only in B"
    # errored or incomparable on either side, or its two sides not one value computed two ways (ops out of step,
    # inputs of different kinds: its session's coverage's `out_of_step`): nothing can be said of it
    NOT_COMPARED = "not compared"
    PENDING = "pending"  # not compared yet on either side: a server on the data dir compares it


@dataclass(frozen=True)
class SessionSide:
    id: int
    name: str
    first_divergence: FirstDivergence | None
    pending: int = 0  # pairs not compared yet: a server on the data dir compares them
    verdict: SessionVerdict = SessionVerdict.COMPARING  # the session's (compare/reports/coverage.py)
    coverage: Coverage = field(default_factory=Coverage)
    # passing pairs judged on summaries alone (a capture's values="summary", a use_repr trace), not shown
    # bit-identical by equal hashes: their pass says only that no difference was found in the summary
    on_summaries: int = 0


@dataclass(frozen=True)
class PairChange:
    """One pair name's verdict and error (max |diff|) in each session, and what changed."""

    key: str  # the pair's name, "candidate/name" where a session has several candidates
    layer: int | None
    status_a: str | None  # None: no such pair in that session
    status_b: str | None
    error_a: Number | None
    error_b: Number | None
    ratio: Number | None  # error_b / error_a
    change: Change
    pair_a: int | None  # the pairs' ids
    pair_b: int | None


@dataclass(frozen=True)
class SessionDiff:
    a: SessionSide
    b: SessionSide
    pairs: list[PairChange]  # in A's execution order, then those only in B
    counts: dict[str, int]  # per Change, every one listed

    @property
    def broke(self) -> bool:
        return self.counts[Change.BROKEN] > 0

    @property
    def pending(self) -> bool:
        """Whether either session has pairs not compared yet, or not comparable, or is still `comparing` with none
        pending (a run still ingesting, no candidate run yet), or A has pairs B lacks: what changed cannot all be
        said."""
        return (
            self.a.verdict in (SessionVerdict.COMPARING, SessionVerdict.NO_CANDIDATE)
            or self.b.verdict in (SessionVerdict.COMPARING, SessionVerdict.NO_CANDIDATE)
            or self.a.pending > 0
            or self.b.pending > 0
            or self.counts[Change.NOT_COMPARED] > 0
            or self.counts[Change.ONLY_A] > 0  # compared in A, not in B: whether B broke it is not known
            or self.counts[Change.PENDING] > 0
        )


def _keyed(report: SessionPairs) -> dict[str, PairReport]:
    several = len(report.candidates) > 1
    return {(f"{report.candidate_of(p)}/{p.name}" if several else p.name): p for p in report.pairs}


def _error(pair: PairReport | None) -> float | None:
    if pair is None or pair.stats is None:
        return None
    value = parse_number(pair.stats.max_abs_diff)
    return None if value is None else float(value)


def _change(a: PairReport | None, b: PairReport | None, error_a: float | None, error_b: float | None) -> Change:
    if a is None:
        return Change.ONLY_B
    if b is None:
        return Change.ONLY_A
    if {a.status, b.status} & {"error", "incomparable"}:
        return Change.NOT_COMPARED
    if "pending" in {a.status, b.status}:
        return Change.PENDING
    if a.status == "fail" and b.status == "pass":
        return Change.FIXED
    if a.status == "pass" and b.status == "fail":
        return Change.BROKEN
    if error_a is None or error_b is None or error_a == error_b:
        return Change.SAME
    if math.isnan(error_b) or error_b > error_a * CHANGE:
        return Change.WORSE
    if math.isnan(error_a) or error_a > error_b * CHANGE:
        return Change.BETTER
    return Change.SAME


def _number(value: float | None) -> Number | None:
    return None if value is None else json_number(value)


def find_session(db: DbSession, wanted: str) -> int:
    """A session's id from what the user typed: its id, or its name. Raises NotFoundError."""
    if wanted.isdigit():
        return catalog.get_session(db, int(wanted)).id
    found = db.scalar(select(SessionRecord.id).where(SessionRecord.name == wanted))
    if found is None:
        raise NotFoundError(f"no session with id or name {wanted!r}")
    return found


def diff_sessions(db: DbSession, session_a: int, session_b: int) -> SessionDiff:
    """Raises NotFoundError when either session does not exist."""
    sides = []
    keyed = []
    off: set[str] = set()  # pairs not one value computed two ways in either session: not compared there
    for session_id in (session_a, session_b):
        record = catalog.get_session(db, session_id)
        report = session_pairs(db, session_id)
        sides.append(
            SessionSide(
                record.id,
                record.name,
                report.first_divergence,
                report.progress.pending,
                report.verdict,
                report.coverage,
                sum(
                    1
                    for p in report.pairs
                    if p.status == PairStatus.PASS and p.summary is not None and p.summary.identical is not True
                ),
            )
        )
        keyed.append(_keyed(report))
        off |= {key for key, pair in keyed[-1].items() if pair.id in report.out_of_step}
    in_a, in_b = keyed
    rows = []
    for key in [*in_a, *(k for k in in_b if k not in in_a)]:
        a, b = in_a.get(key), in_b.get(key)
        error_a, error_b = (None, None) if key in off else (_error(a), _error(b))
        ratio = None
        if error_a is not None and error_b is not None:
            ratio = error_b / error_a if error_a else (1.0 if error_b == 0 else math.inf)
        rows.append(
            PairChange(
                key,
                a.layer if a is not None else b.layer if b is not None else None,
                None if a is None else str(a.status),
                None if b is None else str(b.status),
                _number(error_a),
                _number(error_b),
                _number(ratio),
                Change.NOT_COMPARED
                if key in off and a is not None and b is not None
                else _change(a, b, error_a, error_b),
                None if a is None else a.id,
                None if b is None else b.id,
            )
        )
    counts = {str(c): sum(1 for r in rows if r.change == c) for c in Change}
    return SessionDiff(sides[0], sides[1], rows, counts)
