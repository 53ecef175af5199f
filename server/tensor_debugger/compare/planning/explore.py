"""Explore one run: every tensor against every other (N·(N−1)/2 pairs), as pairs of a one-run session.

Shapes that no alignment makes comparable get the verdict `incomparable`; the rest are computed like any pair
(and cached like any). Past `MAX_PAIRS` pairs, a filter is asked for rather than computing them all.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from itertools import combinations

from sqlalchemy import delete, select

from tensor_debugger.compare.context import CompareContext, tensor_ref
from tensor_debugger.compare.planning.plan import refresh_session
from tensor_debugger.engine.alignment import align
from tensor_debugger.engine.logical_tensors import group_shards
from tensor_debugger.engine.pairing import execution_order
from tensor_debugger.errors import InvalidInputError
from tensor_debugger.store import catalog
from tensor_debugger.store.models import PairRecord, TensorRecord, UnmatchedRecord

MAX_PAIRS = 5000
CLI_FILTER = "--match GLOB (e.g. --match '*attn*')"


def plan_explore(
    context: CompareContext,
    session_id: int,
    match: str | None = None,
    max_pairs: int = MAX_PAIRS,
    filter_hint: str = CLI_FILTER,
) -> int:
    """Pair every tensor of the session's (one) run with every other whose name matches `match` (a glob, any
    case); returns how many pairs. Raises InvalidInputError past `max_pairs`, asking for a filter in the words
    of `filter_hint` (the CLI's option, or the page's field)."""
    with context.sessions.begin() as db:
        catalog.lock_sessions(db, [session_id])  # as a plan does, before reading the runs
        session = catalog.get_session(db, session_id)
        ready = [r for r in session.runs if r.status == "ready"]
        if len(ready) != 1:
            raise InvalidInputError(f"explore takes one run, the session has {len(ready)} ready")
        run = ready[0]
        rows = db.scalars(select(TensorRecord).where(TensorRecord.run_id == run.id).order_by(TensorRecord.position))
        tensors = sorted(group_shards(tensor_ref(t) for t in rows), key=execution_order)
        if match:
            tensors = [t for t in tensors if fnmatchcase(t.name.lower(), match.lower())]
        count = len(tensors) * (len(tensors) - 1) // 2
        if count > max_pairs:
            raise InvalidInputError(
                f"{len(tensors)} tensors make {count:,} pairs, over {max_pairs:,}: choose fewer with {filter_hint}"
            )
        db.execute(delete(PairRecord).where(PairRecord.session_id == session_id))
        db.execute(delete(UnmatchedRecord).where(UnmatchedRecord.session_id == session_id))
        for position, (a, b) in enumerate(combinations(tensors, 2)):
            alignment = align(a.shapes, b.shapes)
            db.add(
                PairRecord(
                    session_id=session_id,
                    run_a_id=run.id,
                    run_b_id=run.id,
                    position=position,
                    name=f"{a.name} ~ {b.name}",
                    layer=a.layer,
                    stage=a.stage,
                    strategy="explore",
                    a_name=a.name,
                    b_name=b.name,
                    a_tensor_ids=[s.id for s in a.shards],
                    b_tensor_ids=[s.id for s in b.shards],
                    alignment=alignment.to_json() if alignment else None,
                    status="pending" if alignment else "incomparable",
                    module_path=a.first.module_path,
                    place=a.first.place,
                )
            )
    refresh_session(context, session_id)
    return count
