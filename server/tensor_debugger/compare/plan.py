"""Pairs of a session: planned from the stored tensors, compared once (the cache), with verdicts.

Planning pairs every candidate run with the reference run (the session's first) and records an alignment for
each pair. Computing reads both sides block by block through lazy views and stores the statistics in the
comparison cache under the two sides' content digests, the alignment and the tolerances: reopening a session,
comparing the same dumps again or uploading an identical tensor never computes them twice.
"""

from __future__ import annotations

import hashlib
import json
import threading
from bisect import bisect_right
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from tensor_debugger.compare.dask_connection import SchedulerConnection
from tensor_debugger.compare.pair_rows import StatsCache
from tensor_debugger.compare.pending import CurrentPairs, ProgressCallback, compute_pending
from tensor_debugger.engine.alignment import Alignment, Step, align
from tensor_debugger.engine.metrics import DEFAULT_TOP, PairStats
from tensor_debugger.engine.pairing import (
    LogicalTensor,
    PairPlan,
    TensorRef,
    compile_name_pattern,
    execution_order,
    pair_runs,
)
from tensor_debugger.engine.summaries import ReportedSummary, compare_summaries
from tensor_debugger.engine.tolerances import Tolerance, default_tolerance, has_ulp, is_exact_dtype, lower_precision
from tensor_debugger.engine.views import SourceView, View, build_view
from tensor_debugger.errors import InvalidInputError, NotFoundError
from tensor_debugger.ingest.sketches import sketch_verdict
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.catalog import lock_sessions
from tensor_debugger.store.claims import DEFAULT_LEASE_SECONDS, Claims
from tensor_debugger.store.dtypes import parse_dtype, storage_to_compute
from tensor_debugger.store.models import (
    ComparisonResultRecord,
    PairOverrideRecord,
    PairRecord,
    SessionRecord,
    TensorRecord,
    UnmatchedRecord,
)

if TYPE_CHECKING:
    from tensor_debugger.settings import Settings


@dataclass(frozen=True)
class Progress:
    total: int
    done: int  # pairs with a verdict (pass, fail, incomparable or error)

    @property
    def pending(self) -> int:
        return self.total - self.done


def cache_key(
    digests_a: Sequence[str], digests_b: Sequence[str], alignment_key: str, tol: Tolerance, exact: bool, top: int
) -> str:
    """A result's key: the sides' contents, the alignment, the tolerance and how many worst elements it keeps."""
    text = json.dumps(
        [list(digests_a), list(digests_b), alignment_key, tol.rtol, tol.atol, tol.ulp, tol.ulp_dtype, exact, top]
    )
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def tensor_ref(t: TensorRecord) -> TensorRef:
    return TensorRef(
        t.id,
        t.name,
        tuple(t.shape),
        t.dtype,
        t.position,
        t.layer,
        t.stage,
        tuple(t.key_path),
        t.digest,
        t.module_path,
        t.place,
    )


def values_unavailable(t: TensorRecord) -> str:
    return (
        f"element values are not available: {t.name} comes from {t.source_file}, a trace written with "
        f"use_repr=True, which keeps only its shape, dtype and mean, std, min and max"
    )


def tensor_summary(t: TensorRecord) -> ReportedSummary:
    return ReportedSummary(tuple(t.shape), t.dtype, {"mean": t.mean, "std": t.std, "min": t.min, "max": t.max})


class Comparisons:
    def __init__(
        self,
        sessions: sessionmaker[DbSession],
        store: ArrayStore,
        workers: int,
        claims: Claims | None = None,
        cluster: Settings | None = None,
        top: int = DEFAULT_TOP,
    ) -> None:
        """`workers`: threads that read and reduce blocks (Settings.threads); results do not depend on it.
        `claims`: this process's, on the pending pairs it computes (a new owner with the default lease if None).
        `cluster`: settings naming a Dask scheduler whose workers compute pending pairs instead (dask_pairs.py).
        `top`: worst elements kept per pair (Settings.top)."""
        self.top = top
        if workers < 1:
            raise ValueError(f"a comparison needs at least one worker thread, got {workers}")
        self.sessions = sessions
        self.claims = claims or Claims(sessions, DEFAULT_LEASE_SECONDS)
        self.store = store
        self.workers = workers
        self.cluster = cluster if cluster is not None and cluster.dask_scheduler else None
        # one client to the scheduler for the process's life, made once pairs are first sent to the workers
        self.scheduler = SchedulerConnection(self.cluster.dask_scheduler) if self.cluster is not None else None
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="compare")
        self.lock = threading.Lock()  # held while computing: one computation at a time per process
        self.stats = StatsCache()  # decoded statistics of results, for reports (pair_rows.py)

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)
        if self.scheduler is not None:
            self.scheduler.close()

    # --- planning ---------------------------------------------------------------------------------------

    def plan(self, session_id: int) -> None:
        """(Re)build the session's pairs and unmatched lists from its ready runs and the user's overrides."""
        with self.sessions.begin() as db:
            # Locked first, before the runs are read: two ingests finishing at once each plan, and a plan that read
            # "one run ready" before the other's plan committed would otherwise delete that plan's pairs after it.
            session = db.get(SessionRecord, session_id) if lock_sessions(db, [session_id]) else None
            if session is None:
                raise NotFoundError(f"no session with id {session_id}")
            kept = [r for r in session.runs if r.status != "failed"]
            runs = [r for r in kept if r.status == "ready"]
            if len(runs) == 1 and self._explored(db, session_id, runs[0].id):
                return  # an explore session (compare/explore.py) keeps its pairs of one run
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
            if reference is not next((r for r in kept if r.role != "noise"), kept[0]):
                return  # while the reference (the first run) is ingesting, no other run stands in for it
            runs = [reference, *(r for r in runs if r is not reference)]
            refs_a = self._refs(db, reference.id)
            overrides = db.scalars(select(PairOverrideRecord).where(PairOverrideRecord.session_id == session_id)).all()
            position = 0
            try:
                pattern = compile_name_pattern(session.name_pattern)
            except ValueError as exc:
                raise InvalidInputError(str(exc)) from None
            # candidates first, then any rerun of the reference (its pairs are each candidate pair's noise floor)
            others = [r for r in runs[1:] if r.role != "noise"] + [r for r in runs[1:] if r.role == "noise"]
            for candidate in others:
                mine = [o for o in overrides if o.run_b_id == candidate.id]
                try:
                    pairing = pair_runs(
                        refs_a,
                        self._refs(db, candidate.id),
                        manual=[(o.a_name, o.b_name) for o in mine if o.action == "pair"],
                        unpaired=[(o.a_name, o.b_name) for o in mine if o.action == "unpair"],
                        strategies=session.strategies,
                        pattern=pattern,
                    )
                except ValueError as exc:
                    raise InvalidInputError(f"the session's pairing strategies: {exc}") from None
                aligned = {(o.a_name, o.b_name): o.steps for o in mine if o.action == "align" and o.steps}
                for plan in pairing.pairs:
                    alignment, overridden = self._alignment(plan.a, plan.b, aligned.get((plan.a.name, plan.b.name)))
                    db.add(
                        PairRecord(
                            id=ids.get((candidate.id, plan.a.name, plan.b.name)),
                            module_path=plan.a.first.module_path,
                            place=plan.a.first.place,
                            session_id=session_id,
                            run_a_id=reference.id,
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
                        )
                    )
                    position += 1
                # the user's word that a tensor may stay unpaired: an unpair (by hand, or a pairing file's), a glob
                refused = {
                    side: {name for o in mine if o.action == "unpair" and (name := getattr(o, f"{side}_name"))}
                    for side in ("a", "b")
                }
                globs = [str(g) for g in session.allow_unmatched or []]
                first = position - len(pairing.pairs)  # this candidate's first pair
                places = PairPlaces(pairing.pairs)
                for side, run_id, other, missing in (
                    ("a", reference.id, candidate.id, pairing.unmatched_a),
                    ("b", candidate.id, reference.id, pairing.unmatched_b),
                ):
                    for n, tensor in enumerate(missing):
                        db.add(
                            UnmatchedRecord(
                                session_id=session_id,
                                run_id=run_id,
                                other_run_id=other,
                                position=n,
                                name=tensor.name,
                                tensor_ids=[s.id for s in tensor.shards],
                                allowed=tensor.name in refused[side]
                                or (side == "a" and any(fnmatchcase(tensor.name, g) for g in globs)),
                                before_position=first + places.before(tensor) if side == "a" else None,
                            )
                        )
        self.refresh(session_id)

    @staticmethod
    def _explored(db: DbSession, session_id: int, run_id: int) -> bool:
        """Whether the session's pairs are an exploration of this run (each pairs two of its own tensors)."""
        sides = db.execute(
            select(PairRecord.run_a_id, PairRecord.run_b_id).where(PairRecord.session_id == session_id).limit(1)
        ).first()
        return sides is not None and tuple(sides) == (run_id, run_id)

    def _refs(self, db: DbSession, run_id: int) -> list[TensorRef]:
        rows = db.scalars(select(TensorRecord).where(TensorRecord.run_id == run_id).order_by(TensorRecord.position))
        return [tensor_ref(t) for t in rows]

    @staticmethod
    def _alignment(a: LogicalTensor, b: LogicalTensor, steps: list[Any] | None) -> tuple[Alignment | None, bool]:
        if steps:
            try:
                return Alignment.from_steps(a.shapes, b.shapes, [Step.from_json(s) for s in steps]), True
            except ValueError:
                pass  # the tensors changed under the override: fall back to the automatic alignment
        return align(a.shapes, b.shapes), False

    # --- verdicts from the cache ------------------------------------------------------------------------

    def tolerance(self, session: SessionRecord, dtype_a: str, dtype_b: str) -> tuple[Tolerance, bool]:
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

    def key(
        self, session: SessionRecord, pair: PairRecord, a: Sequence[TensorRecord], b: Sequence[TensorRecord]
    ) -> tuple[str, Tolerance, bool]:
        """The pair's cache key, tolerance and exactness now."""
        tol, exact = self.tolerance(session, a[0].dtype, b[0].dtype)
        return (
            cache_key([t.digest for t in a], [t.digest for t in b], self.alignment_key(pair), tol, exact, self.top),
            tol,
            exact,
        )

    @staticmethod
    def alignment_key(pair: PairRecord) -> str:
        """The pair's alignment steps as the cache key hashes them (and its result records them)."""
        return Comparisons.alignment_key_of(pair.alignment or {})

    @staticmethod
    def alignment_key_of(alignment_json: dict[str, Any]) -> str:
        """`alignment_key` of an alignment (`Alignment.to_json`)."""
        return json.dumps(alignment_json.get("steps", []), separators=(",", ":"))

    def refresh(self, session_id: int) -> None:
        """Give every comparable pair the verdict cached for its current key, or mark it pending; pairs without
        element values get their verdict on the summary statistics."""
        with self.sessions.begin() as db:
            lock_sessions(db, [session_id])  # a plan between reading the pairs and writing would reuse their ids
            pairs = db.scalars(
                select(PairRecord).where(PairRecord.session_id == session_id, PairRecord.status != "incomparable")
            ).all()
            current = CurrentPairs(self, db, pairs)  # every pair's tensors and session in two queries
            keys: dict[int, str] = {}
            for pair in pairs:
                _, a, b = current.sides(pair.id)
                if all(t.has_values for t in (*a, *b)):
                    keys[pair.id] = current.keyed(pair.id)[0]
                    continue
                tol, _ = self.tolerance(current.session(pair), a[0].dtype, b[0].dtype)
                verdict = sketch_verdict(self.store, a, b, tol) or compare_summaries(
                    tensor_summary(a[0]), tensor_summary(b[0]), tol
                )
                pair.summary, pair.result_id, pair.error = verdict.to_json(), None, None
                pair.status = "pass" if verdict.passed else "fail"
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
                    pair.status = "pass" if PairStats.from_json(found.stats).passed else "fail"

    # --- computing --------------------------------------------------------------------------------------

    def compute_pending(
        self,
        session_id: int | None = None,
        progress: ProgressCallback | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> int:
        """Compute every pending pair (of one session, or all), in execution order; returns how many pairs were
        settled (see `pending_pairs.compute_pending`), on the Dask cluster where the settings name one."""
        if self.cluster is not None:
            from tensor_debugger.compare.dask_pairs import compute_on_dask

            return compute_on_dask(self.cluster, self, session_id, progress, should_stop)
        return compute_pending(self, session_id, progress, should_stop)

    @staticmethod
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

    def views(self, db: DbSession, pair: PairRecord) -> tuple[View, View, Alignment]:
        """Lazy views of both sides in aligned coordinates; reading one reads only the chunks it needs."""
        return self.views_of(pair, *self.tensors_of(db, pair))

    def views_of(
        self, pair: PairRecord, a: Sequence[TensorRecord], b: Sequence[TensorRecord]
    ) -> tuple[View, View, Alignment]:
        """`views`, given the pair's tensors (the reference's shards and the candidate's, in rank order)."""
        if pair.alignment is None:
            raise ValueError("the pair is incomparable: no alignment")
        return self.aligned_views(pair.alignment, a, b)

    def aligned_views(
        self, alignment_json: dict[str, Any], a: Sequence[TensorRecord], b: Sequence[TensorRecord]
    ) -> tuple[View, View, Alignment]:
        """Lazy views of tensors `a` and `b` (rank order) in the coordinates of an alignment (`Alignment.to_json`);
        the tensors need only their store key, digest, dtype and shape (rows not yet written will do)."""
        for tensor in (*a, *b):
            if not tensor.has_values:
                raise InvalidInputError(values_unavailable(tensor))
        steps = [Step.from_json(s) for s in alignment_json["steps"]]
        alignment = Alignment.from_steps([tuple(t.shape) for t in a], [tuple(t.shape) for t in b], steps)

        def sources(side: Sequence[TensorRecord]) -> list[View]:
            return [
                SourceView(
                    self.store.reader(t.store_key, t.digest),
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

    def progress(self, session_id: int) -> Progress:
        with self.sessions() as db:
            total = db.scalar(select(func.count()).where(PairRecord.session_id == session_id)) or 0
            pending = (
                db.scalar(
                    select(func.count()).where(PairRecord.session_id == session_id, PairRecord.status == "pending")
                )
                or 0
            )
        return Progress(total, total - pending)


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
