"""The session-level view of error profiles: for every pair with aligned dimension `dim`, its profile along it
(compare/compute/profiles.py, each computed once and kept with the pair's result), rows in execution order, so that an
error that starts at token 40 of layer 9 and spreads to the layers after shows as one shape.

The dimension is chosen by number (the same aligned dimension of every pair) or by name (engine/dimension_names.py:
each pair's own dimension of that name, so that tokens are compared with tokens whatever their place in each
pair's shape)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.compute.profiles import error_profile
from tensor_debugger.compare.context import CompareContext
from tensor_debugger.compare.reports.pair_reports import session_pairs
from tensor_debugger.engine.dimension_names import NAME, dimension_names
from tensor_debugger.engine.metrics import Number
from tensor_debugger.errors import InvalidInputError
from tensor_debugger.store import catalog
from tensor_debugger.store.layout import MissingChunkError
from tensor_debugger.store.reports import PairStatus


@dataclass(frozen=True)
class ProfileRow:
    """One pair's profile along the session view's dimension."""

    pair_id: int
    name: str
    candidate: str  # the candidate run's label
    layer: int | None
    aligned_shape: list[int]
    dim: int  # the pair's aligned dimension profiled (by name: where that name is in its shape)
    dim_names: list[str] | None  # the names of the pair's aligned dimensions (the session's `dims`), null: none
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
    element values, or not compared yet), each with why. `dim`: the aligned dimension asked for by number, null
    when asked for by `name` (each row says its own)."""

    dim: int | None
    name: str | None
    size: int
    rows: list[ProfileRow]
    skipped: list[SkippedPair]


def parse_dim(text: str) -> int | str:
    """A dimension as a query gives it: a whole number (0 for the first), else a dimension's name."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    if not NAME.fullmatch(text):
        raise InvalidInputError(
            f"dim must be an aligned dimension (a whole number) or a dimension's name, got {text!r}"
        )
    return text


def session_profiles(db: DbSession, context: CompareContext, session_id: int, dim: int | str) -> SessionProfiles:
    """Every pair's profile along aligned dimension `dim` (0 for the first), or along each pair's dimension named
    `dim`."""
    if isinstance(dim, int) and dim < 0:
        raise InvalidInputError(f"dim must be 0 or more, got {dim}")
    dims = catalog.get_session(db, session_id).dims
    report = session_pairs(db, session_id)
    rows: list[ProfileRow] = []
    skipped: list[SkippedPair] = []
    for pair in sorted(report.pairs, key=lambda p: p.position):
        candidate = report.candidate_of(pair)
        shape = pair.aligned_shape
        names = dimension_names(dims, (pair.name, pair.a.name, pair.b.name), len(shape)) if shape else None
        index = dim if isinstance(dim, int) else names.index(dim) if names and dim in names else None
        reason = None
        if pair.summary is not None or shape is None:
            reason = "no element values to compare" if pair.summary is not None else "incomparable"
        elif index is None:
            given = (
                f"its dimensions are {', '.join(names)}" if names else "the session's dims name none of its dimensions"
            )
            reason = f"no dimension named {dim!r} ({given})"
        elif len(shape) <= index:
            reason = f"aligned shape {shape} has no dimension {dim}"
        elif pair.status == PairStatus.PENDING:
            reason = "not compared yet"
        elif pair.status == PairStatus.ERROR:
            reason = pair.error or "its comparison failed"
        if reason is None and index is not None:
            try:
                profile = error_profile(db, context, pair.id, index)
            except (InvalidInputError, MissingChunkError) as exc:  # a damaged pair is skipped saying so
                reason = str(exc)
            else:
                rows.append(
                    ProfileRow(
                        pair.id,
                        pair.name,
                        candidate,
                        pair.layer,
                        shape or [],
                        index,
                        names,
                        profile.max_abs_diff,
                        profile.mean_abs_diff,
                    )
                )
                continue
        skipped.append(SkippedPair(pair.id, pair.name, candidate, reason or f"no dimension {dim}"))
    size = max((len(r.max_abs_diff) for r in rows), default=0)
    return SessionProfiles(
        dim if isinstance(dim, int) else None, dim if isinstance(dim, str) else None, size, rows, skipped
    )
