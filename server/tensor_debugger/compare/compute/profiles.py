"""A pair's error profile along one aligned dimension (engine/profiles.py), read block by block through the pair's
views and kept with its comparison result, so that asking again reads nothing."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.context import CompareContext
from tensor_debugger.compare.planning.sides import tensors_of, tolerance, views
from tensor_debugger.engine.chunking import iter_blocks, plan_chunks
from tensor_debugger.engine.metrics import Number, json_number
from tensor_debugger.engine.profiles import ProfileAccumulator
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.engine.views import View
from tensor_debugger.errors import InvalidInputError, NotFoundError
from tensor_debugger.store.layout import MissingChunkError
from tensor_debugger.store.models import ComparisonResultRecord, PairRecord, SessionRecord

PROFILE_BLOCK_BYTES = 8 * 1024 * 1024  # of float64 per side read at once


@dataclass(frozen=True)
class ErrorProfile:
    """Per index of aligned dimension `dim` (of `size`): the largest and the mean |difference| and the elements
    outside the tolerance ("nan" where a NaN met the index)."""

    dim: int
    size: int
    max_abs_diff: list[Number]
    mean_abs_diff: list[Number]
    mismatched: list[int]


def error_profile(db: DbSession, context: CompareContext, pair_id: int, dim: int) -> ErrorProfile:
    """The pair's profile along `dim`, from its result's cache or computed now (and cached where the pair has a
    result). InvalidInputError for a pair without element values or a dim out of range."""
    pair = db.get(PairRecord, pair_id)
    if pair is None:
        raise NotFoundError(f"no pair with id {pair_id}")
    if pair.alignment is None or pair.summary is not None:
        raise InvalidInputError(f"pair {pair_id} has no element values to profile (incomparable or summary-only)")
    result = db.get(ComparisonResultRecord, pair.result_id) if pair.result_id is not None else None
    cached = (result.profiles or {}).get(str(dim)) if result is not None else None
    if cached is not None:
        return ErrorProfile(**cached)  # a profile stored as JSON: `stored_profiles`
    view_a, view_b, _ = views(context.store, db, pair)
    side_a, side_b = tensors_of(db, pair)
    session = db.get_one(SessionRecord, pair.session_id)
    tol, exact = tolerance(session, side_a[0].dtype, side_b[0].dtype)
    try:
        profile = profile_views(view_a, view_b, dim, tol, exact)
    except MissingChunkError:
        raise  # the data dir is damaged, not the request: web/refusals.py's damaged_store answers it
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None
    if result is not None:
        result.profiles = {**(result.profiles or {}), **stored_profiles({dim: profile})}
        db.commit()
    return profile


def stored_profiles(profiles: dict[int, ErrorProfile]) -> dict[str, dict[str, Any]]:
    """Profiles as a result's profiles column holds them: by dimension (as text), each as JSON."""
    return {str(dim): asdict(profile) for dim, profile in profiles.items()}


def profile_views(view_a: View, view_b: View, dim: int, tolerance: Tolerance, exact: bool) -> ErrorProfile:
    """The profile along `dim` of two aligned views (of one shape), read block by block; ValueError for a dim out of
    range."""
    shape = tuple(view_a.shape)
    accumulator = ProfileAccumulator(shape, dim, tolerance, exact)
    for region in iter_blocks(plan_chunks(shape, 8, PROFILE_BLOCK_BYTES), 1):
        accumulator.add(view_a.read(region), view_b.read(region), region[dim].start)
    top, mean, mismatched = accumulator.result()
    return ErrorProfile(dim, shape[dim], [json_number(v) for v in top], [json_number(v) for v in mean], mismatched)
