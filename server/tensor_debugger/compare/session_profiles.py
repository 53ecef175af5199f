"""The session-level view of error profiles: for every pair with aligned dimension `dim`, its profile along it
(compare/profiles.py, each computed once and kept with the pair's result), rows in execution order, so that an
error that starts at token 40 of layer 9 and spreads to the layers after shows as one shape."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.module_reports import Number
from tensor_debugger.compare.pair_reports import session_pairs
from tensor_debugger.compare.plan import Comparisons
from tensor_debugger.compare.profiles import error_profile
from tensor_debugger.errors import InvalidInputError
from tensor_debugger.store import catalog
from tensor_debugger.store.reports import PairStatus


@dataclass(frozen=True)
class ProfileRow:
    """One pair's profile along the session view's dimension."""

    pair_id: int
    name: str
    candidate: str  # the candidate run's label
    layer: int | None
    aligned_shape: list[int]
    max_abs_diff: list[Number]  # per index ("nan" where a NaN met it)
    mean_abs_diff: list[Number]


@dataclass(frozen=True)
class SkippedPair:
    pair_id: int
    name: str
    candidate: str
    reason: str


@dataclass(frozen=True)
class SessionProfiles:
    """Rows in execution order; `size`: the longest row; `skipped`: the pairs without the dimension (or without
    element values, or not compared yet), each with why."""

    dim: int
    size: int
    rows: list[ProfileRow]
    skipped: list[SkippedPair]


def session_profiles(db: DbSession, comparisons: Comparisons, session_id: int, dim: int) -> SessionProfiles:
    """Every pair's profile along aligned dimension `dim` (0 for the first)."""
    if dim < 0:
        raise InvalidInputError(f"dim must be 0 or more, got {dim}")
    catalog.get_session(db, session_id)
    report = session_pairs(db, session_id)
    rows: list[ProfileRow] = []
    skipped: list[SkippedPair] = []
    for pair in sorted(report.pairs, key=lambda p: p.position):
        candidate = report.candidate_of(pair)
        shape = pair.aligned_shape
        reason = None
        if pair.summary is not None or shape is None:
            reason = "no element values to compare" if pair.summary is not None else "incomparable"
        elif len(shape) <= dim:
            reason = f"aligned shape {shape} has no dimension {dim}"
        elif pair.status == PairStatus.PENDING:
            reason = "not compared yet"
        elif pair.status == PairStatus.ERROR:
            reason = pair.error or "its comparison failed"
        if reason is None:
            try:
                profile = error_profile(db, comparisons, pair.id, dim)
            except InvalidInputError as exc:
                reason = str(exc)
            else:
                rows.append(
                    ProfileRow(
                        pair.id,
                        pair.name,
                        candidate,
                        pair.layer,
                        shape or [],
                        profile.max_abs_diff,
                        profile.mean_abs_diff,
                    )
                )
                continue
        skipped.append(SkippedPair(pair.id, pair.name, candidate, reason))
    return SessionProfiles(dim, max((len(r.max_abs_diff) for r in rows), default=0), rows, skipped)
