"""Pairs of a session: planned from the stored tensors, compared once (the cache), with verdicts.

Planning pairs every candidate run with the reference run (the session's first), or with the run it names as the
one it is compared against (`runs.compared_against_id`: find_divergence's full-values candidate against the
reference's full values), and records an alignment for each pair. Computing reads both sides block by block through
lazy views and stores the statistics in the comparison cache under the two sides' content digests, the alignment and
the tolerances: reopening a session, comparing the same dumps again or uploading an identical tensor never computes
them twice.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from fnmatch import fnmatchcase
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.context import CompareContext, tensor_ref
from tensor_debugger.compare.planning.current import CurrentPairs
from tensor_debugger.compare.planning.op_pairs import plan_ops
from tensor_debugger.compare.planning.sides import settled_status, tensor_summary, tolerance
from tensor_debugger.engine.alignment import Alignment, Step, align, stored_steps
from tensor_debugger.engine.logical_tensors import LogicalTensor, TensorRef
from tensor_debugger.engine.metrics import PairStats
from tensor_debugger.engine.missing_shards import missing_shards, run_ranks
from tensor_debugger.engine.name_patterns import compile_name_pattern
from tensor_debugger.engine.op_alignment import Likeness
from tensor_debugger.engine.pairing import PairPlan, execution_order, pair_runs
from tensor_debugger.engine.summaries import SummaryVerdict, compare_summaries
from tensor_debugger.engine.summary_compare import Sketch, SketchVerdict, sketch_likeness
from tensor_debugger.errors import InvalidInputError, NotFoundError
from tensor_debugger.ingest.sketches import sketch_verdict
from tensor_debugger.ingest.split_sketches import split_sketch_verdict
from tensor_debugger.ingest.traces import CaptureScope
from tensor_debugger.store.catalog import lock_sessions
from tensor_debugger.store.compared_against import session_reference
from tensor_debugger.store.models import (
    ComparisonResultRecord,
    PairOverrideRecord,
    PairRecord,
    RunRecord,
    SessionRecord,
    TensorRecord,
    UnmatchedRecord,
)


def plan_session(context: CompareContext, session_id: int) -> None:
    """(Re)build the session's pairs and unmatched lists from its ready runs and the user's overrides."""
    with context.sessions.begin() as db:
        # Locked first, before the runs are read: two ingests finishing at once each plan, and a plan that read
        # "one run ready" before the other's plan committed would otherwise delete that plan's pairs after it.
        session = db.get(SessionRecord, session_id) if lock_sessions(db, [session_id]) else None
        if session is None:
            raise NotFoundError(f"no session with id {session_id}")
        kept = [r for r in session.runs if r.status != "failed"]
        runs = [r for r in kept if r.status == "ready"]
        if len(runs) == 1 and _explored(db, session_id, runs[0].id):
            return  # an explore session (compare/planning/explore.py) keeps its pairs of one run
        # a pair planned again (same candidate, same two names) keeps its id: its page's address and an action
        # on it still name it; a new pair gets an id never used before (the table's AUTOINCREMENT)
        ids = {
            (run_b, a_name, b_name): pair_id
            for pair_id, run_b, a_name, b_name in db.execute(
                select(PairRecord.id, PairRecord.run_b_id, PairRecord.a_name, PairRecord.b_name).where(
                    PairRecord.session_id == session_id
                )
            )
        }
        db.execute(delete(PairRecord).where(PairRecord.session_id == session_id))
        db.execute(delete(UnmatchedRecord).where(UnmatchedRecord.session_id == session_id))
        if len(runs) < 2:
            return
        reference = next((r for r in runs if r.role != "noise"), runs[0])
        if reference is not session_reference(kept):
            return  # while the reference (the first run) is ingesting, no other run stands in for it
        runs = [reference, *(r for r in runs if r is not reference)]
        ready = {r.id: r for r in runs}
        refs: dict[int, list[TensorRef]] = {}
        sketches: dict[int, dict[str, Any]] = {}  # each tensor's kept summary, by id
        overrides = db.scalars(select(PairOverrideRecord).where(PairOverrideRecord.session_id == session_id)).all()
        position = 0
        kept_pairs: list[dict[str, Any]] = []
        new_pairs: list[dict[str, Any]] = []
        unmatched: list[dict[str, Any]] = []
        try:
            pattern = compile_name_pattern(session.name_pattern)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        # candidates first, then any rerun of the reference (its pairs are each candidate pair's noise floor)
        others = [r for r in runs[1:] if r.role != "noise"] + [r for r in runs[1:] if r.role == "noise"]
        for candidate in others:
            against = compared_with(candidate, reference, ready)
            if against is None:
                continue  # the run it is compared against is not ready (ingesting or failed): no stand-in for it
            if against.id not in refs:
                refs[against.id] = _refs(db, against.id, sketches)
            mine = [o for o in overrides if o.run_b_id == candidate.id]
            manual = [(o.a_name, o.b_name) for o in mine if o.action == "pair"]
            unpaired = [(o.a_name, o.b_name) for o in mine if o.action == "unpair"]
            candidate_refs = _refs(db, candidate.id, sketches)
            ranks = (run_ranks(refs[against.id], pattern), run_ranks(candidate_refs, pattern))
            # captured ops: paired within each module call by sequence alignment, the rest by the chain
            content = _content_of(sketches, session)
            ops = plan_ops(refs[against.id], candidate_refs, manual, unpaired, pattern, content)
            try:
                pairing = pair_runs(
                    ops.rest(refs[against.id]),
                    ops.rest(candidate_refs),
                    manual=manual,
                    unpaired=unpaired,
                    strategies=session.strategies,
                    pattern=pattern,
                )
            except ValueError as exc:
                raise InvalidInputError(f"the session's pairing strategies: {exc}") from None
            pairing = ops.merge(pairing)
            aligned = {(o.a_name, o.b_name): o.steps for o in mine if o.action == "align" and o.steps}
            for plan in pairing.pairs:
                # a shard one side lacks: not comparable as it stands (by shape alone it may read as replicas)
                lacking = missing_shards(plan.a, plan.b, *ranks, pattern)
                alignment, overridden = (
                    (None, False) if lacking else _alignment(plan.a, plan.b, aligned.get((plan.a.name, plan.b.name)))
                )
                row = dict(
                    module_path=plan.a.first.module_path,
                    place=plan.a.first.place,
                    session_id=session_id,
                    run_a_id=against.id,
                    run_b_id=candidate.id,
                    position=position,
                    name=plan.a.name,
                    layer=plan.a.layer,
                    stage=plan.a.stage,
                    strategy=plan.strategy,
                    a_name=plan.a.name,
                    b_name=plan.b.name,
                    a_tensor_ids=[s.id for s in plan.a.shards],
                    b_tensor_ids=[s.id for s in plan.b.shards],
                    alignment=alignment.to_json() if alignment else None,
                    alignment_overridden=overridden,
                    status="pending" if alignment else "incomparable",
                    error=lacking,
                )
                kept_id = ids.get((candidate.id, plan.a.name, plan.b.name))
                if kept_id is None:
                    new_pairs.append(row)
                else:
                    kept_pairs.append({**row, "id": kept_id})
                position += 1
            # the user's word that a tensor may stay unpaired: a one-sided unpair (a pairing file's `{"a"}`), a glob;
            # a refusal of two names (`{"a", "b"}`, an unpair by hand) says only "never these two", not that the
            # tensor may go uncompared: it stays unmatched until paired again or allowed
            refused = {
                side: {
                    name
                    for o in mine
                    if o.action == "unpair"
                    and (name := getattr(o, f"{side}_name"))
                    and not getattr(o, f"{'b' if side == 'a' else 'a'}_name")
                }
                for side in ("a", "b")
            }
            globs = [str(g) for g in session.allow_unmatched or []]
            unasked = _unasked(db, candidate.id, pairing.pairs)
            first = position - len(pairing.pairs)  # this candidate's first pair
            places = PairPlaces(pairing.pairs)
            for side, run_id, other, missing in (
                ("a", against.id, candidate.id, pairing.unmatched_a),
                ("b", candidate.id, against.id, pairing.unmatched_b),
            ):
                for n, tensor in enumerate(missing):
                    unmatched.append(
                        dict(
                            session_id=session_id,
                            run_id=run_id,
                            other_run_id=other,
                            position=n,
                            name=tensor.name,
                            tensor_ids=[s.id for s in tensor.shards],
                            allowed=tensor.name in refused[side]
                            or (side == "a" and (any(fnmatchcase(tensor.name, g) for g in globs) or unasked(tensor))),
                            before_position=first + places.before(tensor) if side == "a" else None,
                        )
                    )
        # each table's rows in one INSERT of many (every row the same columns, None as NULL: none of those a row
        # leaves None has a default), where ORM objects went in one INSERT a row (their ids RETURNING, which SQLite
        # keeps in no order): the pairs that keep their ids in one, the new ones (ids from the table) in another
        for table, rows in ((PairRecord, kept_pairs), (PairRecord, new_pairs), (UnmatchedRecord, unmatched)):
            if rows:
                db.execute(insert(table).execution_options(render_nulls=True), rows)
        # in the same transaction: a reader never sees a planned-again session's pairs all pending in between
        _refresh(context, db, session_id)


def compared_with(run: RunRecord, reference: RunRecord, ready: dict[int, RunRecord]) -> RunRecord | None:
    """The run `run`'s pairs are planned against: the run it names (`compared_against_id`), else the session's
    reference (a rerun, role "noise", is the noise floor of the run it is planned against). None where the run it
    names is not among the `ready` runs (still ingesting, or failed): it is not compared with another in its
    stead."""
    if run.compared_against_id is None:
        return reference
    return ready.get(run.compared_against_id)


def _unasked(db: DbSession, run_id: int, pairs: Sequence[PairPlan]) -> Callable[[LogicalTensor], bool]:
    """Whether a reference tensor is one run `run_id` was not asked to record: a capture of some modules only
    (`capture(modules=...)`, its module tree's "scope") leaves out the reference's other modules, and everything
    after the last tensor it asked for (where that tensor is paired, so that its place in the reference is known).
    Such a tensor lacks a partner by the user's choice, as one allowed to stay unpaired; any other stays unmatched."""
    scope = capture_scope(db, run_id)
    if scope is None:
        return lambda tensor: False
    end = next((p.a.first.position for p in pairs if scope.last is not None and p.b.name == scope.last), None)
    outside = outside_scope(scope, end)
    return lambda tensor: outside(tensor.first.module_path, tensor.first.position)


def capture_scope(db: DbSession, run_id: int) -> CaptureScope | None:
    """What run `run_id` was asked to record (its module tree's "scope"); None where it was not limited."""
    tree = db.scalar(select(RunRecord.module_tree).where(RunRecord.id == run_id))
    return CaptureScope.from_json(tree.get("scope")) if isinstance(tree, dict) else None  # not its whole tree


def outside_scope(scope: CaptureScope, end: int | None) -> Callable[[str | None, int], bool]:
    """Whether a tensor of the run compared against (its module path and position) is outside `scope`: of a module
    the capture was not asked for, or after `end` (the position there of the last tensor it asked for, None where
    not known)."""

    def outside(module_path: str | None, position: int) -> bool:
        if module_path is not None and not scope.selects(module_path):
            return True
        return end is not None and position > end

    return outside


def _explored(db: DbSession, session_id: int, run_id: int) -> bool:
    """Whether the session's pairs are an exploration of this run (each pairs two of its own tensors)."""
    sides = db.execute(
        select(PairRecord.run_a_id, PairRecord.run_b_id).where(PairRecord.session_id == session_id).limit(1)
    ).first()
    return sides is not None and tuple(sides) == (run_id, run_id)


def _refs(db: DbSession, run_id: int, sketches: dict[int, dict[str, Any]] | None = None) -> list[TensorRef]:
    """The run's tensors in order; each one's kept summary (where its row has one) put in `sketches` by id."""
    rows = db.scalars(select(TensorRecord).where(TensorRecord.run_id == run_id).order_by(TensorRecord.position))
    found = []
    for t in rows:
        if sketches is not None and t.sketch is not None:
            sketches[t.id] = t.sketch
        found.append(tensor_ref(t))
    return found


def _content_of(
    sketches: dict[int, dict[str, Any]], session: SessionRecord
) -> Callable[[LogicalTensor, LogicalTensor], Likeness]:
    """What two captured ops' kept summaries tell of their contents (`engine/summary_compare.sketch_likeness`, with
    the session's tolerance), for pairing ops of one name and shape by content: nothing (`same` None) for a side
    in shards or without a kept summary. Read from the rows planning has loaded: no stored value is read."""
    parsed: dict[int, Sketch | None] = {}

    def sketch_of(tensor: LogicalTensor) -> Sketch | None:
        if len(tensor.shards) != 1:
            return None
        ref = tensor.first
        if ref.id not in parsed:
            kept = sketches.get(ref.id)
            found = Sketch.from_json(kept) if kept is not None else None
            parsed[ref.id] = found.with_hash("fold64") or found if found is not None else None
        return parsed[ref.id]

    def content(a: LogicalTensor, b: LogicalTensor) -> Likeness:
        left, right = sketch_of(a), sketch_of(b)
        if left is None or right is None:
            return Likeness(None)
        return sketch_likeness(left, right, tolerance(session, left.dtype, right.dtype)[0])

    return content


def _alignment(a: LogicalTensor, b: LogicalTensor, steps: list[Any] | None) -> tuple[Alignment | None, bool]:
    if steps:
        try:
            return Alignment.from_steps(a.shapes, b.shapes, [Step.from_json(s) for s in steps]), True
        except ValueError:
            pass  # the tensors changed under the override: fall back to the automatic alignment
    return align(a.shapes, b.shapes), False


def refresh_session(context: CompareContext, session_id: int) -> None:
    """Give every comparable pair the verdict cached for its current key, or mark it pending; pairs without
    element values get their verdict on the summary statistics."""
    with context.sessions.begin() as db:
        _refresh(context, db, session_id)


def _refresh(context: CompareContext, db: DbSession, session_id: int) -> None:
    """`refresh_session` in the transaction `db` (a plan's own, or one of its own)."""
    lock_sessions(db, [session_id])  # a plan between reading the pairs and writing would reuse their ids
    db.flush()  # the pairs a plan in this transaction has just added
    # every pair with an alignment: one settled incomparable for the reference rows its alignment cut away is
    # judged again too (`settled_status`: what was compared may fail under other tolerances)
    pairs = [p for p in db.scalars(select(PairRecord).where(PairRecord.session_id == session_id)) if p.alignment]
    current = CurrentPairs(context, db, pairs)  # every pair's tensors and session in two queries
    keys: dict[int, str] = {}
    for pair in pairs:
        _, a, b = current.sides(pair.id)
        if all(t.has_values for t in (*a, *b)):
            keys[pair.id] = current.keyed(pair.id)[0]
            continue
        tol, _ = tolerance(current.session(pair), a[0].dtype, b[0].dtype)
        if len(a) != 1 or len(b) != 1:  # a summary is of one whole tensor: replicas, or shards read together
            steps = stored_steps(pair.alignment)
            split = split_sketch_verdict(context.store, a, b, steps, tol, context.kernel) if pair.alignment else None
            if split is None:
                pair.summary, pair.result_id, pair.status = None, None, "error"
                pair.error = _sharded_against_summary(a, b)
                continue
            verdict: SketchVerdict | SummaryVerdict = split
        else:
            verdict = sketch_verdict(context.store, a, b, tol, context.kernel) or compare_summaries(
                tensor_summary(a[0]), tensor_summary(b[0]), tol
            )
        pair.summary, pair.result_id = verdict.to_json(), None
        pair.status, pair.error = settled_status(pair, a, verdict.passed, on_summaries=True)
    cached = {
        r.cache_key: r
        for r in db.scalars(
            select(ComparisonResultRecord).where(ComparisonResultRecord.cache_key.in_(set(keys.values())))
        )
    }
    for pair in pairs:
        if pair.id not in keys:
            continue
        found = cached.get(keys[pair.id])
        pair.error = None
        if found is None:
            pair.result_id, pair.status = None, "pending"
        else:
            pair.result_id = found.id
            pair.status, pair.error = settled_status(
                pair, current.sides(pair.id)[1], PairStats.from_json(found.stats).passed
            )


def _sharded_against_summary(a: Sequence[TensorRecord], b: Sequence[TensorRecord]) -> str:
    """Why a pair with a side in several tensors (shards or replicas of ranks) and a side without element values
    gets no verdict (`split_sketches.split_sketch_verdict` found no sound summary comparison): shards known only by
    their summaries do not merge into the whole tensor's, nor do shards aligned other than by concatenation."""
    split, other = (a, b) if len(a) > 1 else (b, a)
    held = (
        "as summaries of its shards"
        if not all(t.has_values for t in split)
        else "in shards aligned other than by concatenation"
    )
    return (
        f"not compared: {split[0].name} is held as {len(split)} tensors (shards or replicas of ranks), {held}, "
        f"and {other[0].name} only as a summary (no element values), which is of one whole tensor; capture the "
        'sharded side with values="full" to compare them'
    )


class PairPlaces:
    """Where a reference tensor falls among a candidate's pairs (in execution order)."""

    def __init__(self, pairs: Sequence[PairPlan]) -> None:
        self.pairs = pairs
        self.keys = [execution_order(p.a) for p in pairs]

    def before(self, tensor: LogicalTensor) -> int:
        """How many of the pairs come before `tensor` in execution order."""
        try:
            return bisect_right(self.keys, execution_order(tensor))
        except TypeError:  # a traced tensor's order beside a dump's: their positions in the run
            return sum(1 for p in self.pairs if p.a.position < tensor.position)


def sessions_needing_plan(db: DbSession) -> list[int]:
    """Sessions with two or more ready runs and no pairs yet (ingested by the CLI, say)."""
    sessions = db.scalars(select(SessionRecord)).all()
    found = []
    for session in sessions:
        ready = [r for r in session.runs if r.status == "ready"]
        has_pairs = db.scalar(select(func.count()).where(PairRecord.session_id == session.id))
        if len(ready) >= 2 and not has_pairs:
            found.append(session.id)
    return found
