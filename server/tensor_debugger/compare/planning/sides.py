"""A pair's two sides: their stored tensors, lazy views of them in aligned coordinates, the pair's tolerance and the
cache key its result is stored under."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.context import cache_key
from tensor_debugger.engine.alignment import (
    Alignment,
    ReferenceCut,
    Step,
    cut_verdict,
    reference_cut,
    stored_steps,
)
from tensor_debugger.engine.summaries import ReportedSummary
from tensor_debugger.engine.tolerances import Tolerance, default_tolerance, has_ulp, is_exact_dtype, lower_precision
from tensor_debugger.engine.views import SourceView, View, build_view
from tensor_debugger.errors import ConflictError, InvalidInputError
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.dtypes import parse_dtype, storage_to_compute
from tensor_debugger.store.models import PairRecord, SessionRecord, TensorRecord


def values_unavailable(t: TensorRecord) -> str:
    return (
        f"element values are not available: {t.name} comes from {t.source_file}, a trace written with "
        f"use_repr=True, which keeps only its shape, dtype and mean, std, min and max"
    )


def tensor_summary(t: TensorRecord) -> ReportedSummary:
    return ReportedSummary(tuple(t.shape), t.dtype, {"mean": t.mean, "std": t.std, "min": t.min, "max": t.max})


def tolerance(session: SessionRecord, dtype_a: str, dtype_b: str) -> tuple[Tolerance, bool]:
    """The pair's tolerance and whether it compares exactly (integers and bools on both sides)."""
    exact = is_exact_dtype(dtype_a) and is_exact_dtype(dtype_b)
    if exact:
        return Tolerance(0.0, 0.0), True
    if session.ulp and has_ulp(dtype_a) and has_ulp(dtype_b):
        return Tolerance(0.0, 0.0, session.ulp, lower_precision(dtype_a, dtype_b)), False
    if session.rtol is not None or session.atol is not None:
        base = default_tolerance(dtype_a, dtype_b)
        return Tolerance(
            session.rtol if session.rtol is not None else base.rtol,
            session.atol if session.atol is not None else base.atol,
        ), False
    return default_tolerance(dtype_a, dtype_b), False


def pair_key(
    session: SessionRecord, pair: PairRecord, a: Sequence[TensorRecord], b: Sequence[TensorRecord], top: int
) -> tuple[str, Tolerance, bool]:
    """The pair's cache key, tolerance and exactness now (`top`: worst elements its result keeps)."""
    tol, exact = tolerance(session, a[0].dtype, b[0].dtype)
    return (
        cache_key([t.digest for t in a], [t.digest for t in b], alignment_key(pair), tol, exact, top),
        tol,
        exact,
    )


def settled_status(
    pair: PairRecord, a: Sequence[TensorRecord], passed: bool, on_summaries: bool = False
) -> tuple[str, str | None]:
    """The status and error a pair settles with, given whether what was compared of it is within tolerance
    (`passed`: its statistics' or, `on_summaries`, its summaries' verdict), by `engine.alignment.cut_verdict`: a
    pair whose alignment cut reference rows away (the candidate has fewer rows, a tensor-parallel shard is missing)
    is never a pass. Candidate rows cut away (a vocabulary padded to a multiple) leave every reference element compared:
    the alignment's words say they were not."""
    cut = reference_cut_words(pair, [tuple(t.shape) for t in a])
    return cut_verdict(passed, cut, "summaries" if on_summaries else "tolerance")


def reference_cut_words(pair: Any, shapes_a: Sequence[tuple[int, ...]]) -> str | None:
    """`reference_cut_of` a pair row in words; None where every reference element faces a candidate element."""
    cut = reference_cut_of(pair, shapes_a)
    return None if cut is None else cut.words()


def reference_cut_of(pair: Any, shapes_a: Sequence[tuple[int, ...]]) -> ReferenceCut | None:
    """`engine.alignment.reference_cut` of a pair row (its stored alignment, its reference shards' `shapes_a`);
    None where every reference element faces a candidate element (or the pair has no alignment)."""
    if not pair.alignment:
        return None
    return reference_cut(shapes_a, stored_steps(pair.alignment))


def alignment_key(pair: PairRecord) -> str:
    """The pair's alignment steps as the cache key hashes them (and its result records them)."""
    return alignment_key_of(pair.alignment or {})


def alignment_key_of(alignment_json: dict[str, Any]) -> str:
    """`alignment_key` of an alignment (`Alignment.to_json`)."""
    return json.dumps(alignment_json.get("steps", []), separators=(",", ":"))


def tensors_of(db: DbSession, pair: PairRecord) -> tuple[list[TensorRecord], list[TensorRecord]]:
    """The pair's stored tensors: the reference's shards and the candidate's, each in rank order."""
    ids = [*pair.a_tensor_ids, *pair.b_tensor_ids]
    found: dict[int, TensorRecord] = {}
    if not (db.new or db.dirty or db.deleted):  # nothing a query's autoflush would change: what this
        # session holds already is what the query would return (a page asks twice: its views, its tolerance)
        for i in ids:
            held = db.identity_map.get(db.identity_key(TensorRecord, i))
            if isinstance(held, TensorRecord):
                found[i] = held
    missing = [i for i in ids if i not in found]
    if missing:
        found.update((t.id, t) for t in db.scalars(select(TensorRecord).where(TensorRecord.id.in_(missing))))
    return [found[i] for i in pair.a_tensor_ids], [found[i] for i in pair.b_tensor_ids]


def views(store: ArrayStore, db: DbSession, pair: PairRecord) -> tuple[View, View, Alignment]:
    """Lazy views of both sides in aligned coordinates; reading one reads only the chunks it needs."""
    return views_of(store, pair, *tensors_of(db, pair))


def views_of(
    store: ArrayStore, pair: PairRecord, a: Sequence[TensorRecord], b: Sequence[TensorRecord]
) -> tuple[View, View, Alignment]:
    """`views`, given the pair's tensors (the reference's shards and the candidate's, in rank order)."""
    if pair.alignment is None:
        why = pair.error or "no alignment makes its shapes comparable"
        raise ConflictError(f"pair {pair.id} ({pair.name}) is incomparable ({why}): it has no aligned values to read")
    return aligned_views(store, pair.alignment, a, b)


def aligned_views(
    store: ArrayStore, alignment_json: dict[str, Any], a: Sequence[TensorRecord], b: Sequence[TensorRecord]
) -> tuple[View, View, Alignment]:
    """Lazy views of tensors `a` and `b` (rank order) in the coordinates of an alignment (`Alignment.to_json`);
    the tensors need only their store key, digest, dtype and shape (rows not yet written will do)."""
    for tensor in (*a, *b):
        if not tensor.has_values:
            raise InvalidInputError(values_unavailable(tensor))
    steps = [Step.from_json(s) for s in alignment_json["steps"]]  # the stored JSON: the edge
    alignment = Alignment.from_steps([tuple(t.shape) for t in a], [tuple(t.shape) for t in b], steps)

    def sources(side: Sequence[TensorRecord]) -> list[View]:
        return [
            SourceView(
                store.reader(t.store_key, t.digest),
                partial(storage_to_compute, logical=parse_dtype(t.dtype)),
                k,
            )
            for k, t in enumerate(side)
        ]

    return (
        build_view(sources(a), alignment.side_steps("a")),
        build_view(sources(b), alignment.side_steps("b")),
        alignment,
    )
