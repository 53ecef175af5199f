"""A `Lockstep`'s (`lockstep.py`) block scheduling: each pair set up once both its tensors are begun (the chunk loop
as `early.guess` makes it), then, in order, every pair block whose values both sides have handed over computed
(its statistics, by the chunk loop from the values in memory: `ChunkPairs.in_memory`) and every block of
`where.locate_error` (where the error is, should the pair fail), and what no later block needs let go of."""

from __future__ import annotations

from typing import Any

from tensor_debugger.compare.compute.chunk_loop import chunk_pairs
from tensor_debugger.compare.compute.kept_values import block_values, chunk_pieces, stretches
from tensor_debugger.compare.compute.lockstep_bounds import LockstepBounds
from tensor_debugger.compare.compute.lockstep_pairs import Half, LockstepPair, PairPlan
from tensor_debugger.compare.context import CompareContext
from tensor_debugger.compare.planning.sides import aligned_views, tolerance
from tensor_debugger.engine.alignment import align
from tensor_debugger.engine.streaming import PairJob, pair_blocks
from tensor_debugger.engine.where import WhereAccumulator, block_masses, where_regions
from tensor_debugger.store.models import SessionRecord, TensorRecord

# The next block to compute: ("stats" or "where", its flat [start, stop), and what it reads of each side's kept blocks)
Task = tuple[str, int, int, list[Any]]


class BlockSchedule:
    """Sets up and computes the pairs of the session `session`, keeping blocks within `bounds`."""

    def __init__(self, context: CompareContext, session: SessionRecord, bounds: LockstepBounds) -> None:
        self._context = context
        self._session = session
        self._bounds = bounds
        self._changed = bounds.changed

    def plan(self, pair: LockstepPair) -> None:
        """Set up the pair once both its tensors are begun: the chunk loop as `early.guess` makes it."""
        a, b = pair.halves
        assert a is not None and b is not None
        why: str | None = None
        plan: PairPlan | None = None
        try:
            plan = self._planned(a, b)
        except Exception as exc:  # the pair is simply read from the store, where it says what is wrong
            why = f"could not be set up in memory ({type(exc).__name__})"
        if plan is None and why is None:
            why = "not read by the chunk loop (integers, bools, ULPs or shapes that differ)"
        with self._changed:
            if why is not None:
                self._bounds.give_up(pair, why)
                return
            pair.plan = plan
            self._changed.notify_all()
        self.compute(pair)

    def compute(self, pair: LockstepPair) -> None:
        """Compute, in order, every pair block whose values both sides have handed over (its statistics), and
        every block of `where.locate_error` (where the error is, should the pair fail: the squared differences per
        index of each dimension), and drop what no later block needs."""
        with pair.computing:
            while True:
                with self._changed:
                    task = self._next_task(pair)
                if task is None:
                    return
                self._run(pair, *task)

    def _planned(self, a: Half, b: Half) -> PairPlan | None:
        if a.shape != b.shape:
            return None
        alignment = align([a.shape], [b.shape])
        if alignment is None:
            return None
        steps = alignment.to_json()
        tol, exact = tolerance(self._session, a.dtype.name, b.dtype.name)
        if tol.ulp or exact:
            return None
        rows = [_record(h) for h in (a, b)]
        view_a, view_b, _ = aligned_views(self._context.store, steps, rows[:1], rows[1:])
        top, kernel = self._context.top, self._context.kernel
        loop = chunk_pairs(view_a, view_b, exact, top, kernel)
        if loop is None:
            return None
        job = PairJob(None, view_a, view_b, tol, exact, loop, top, kernel)
        regions = tuple(loop.flat_range(r) for r in pair_blocks(job))
        where = tuple(where_regions(loop.shape))
        return PairPlan(loop, tol, regions, where, tuple(loop.flat_range(r) for r in where))

    def _next_task(self, pair: LockstepPair) -> Task | None:
        """(under the lock) The next block to compute, the one that ends first, or None while none has both sides'
        values."""
        plan = pair.plan
        if pair.why is not None or plan is None:
            return None
        halves = [h for h in pair.halves if h is not None]
        upto = min(h.upto for h in halves)
        tasks: list[tuple[int, str, int]] = []
        if pair.done < len(plan.regions):
            tasks.append((plan.regions[pair.done][1], "stats", plan.regions[pair.done][0]))
        if pair.where_done < len(plan.where):
            start, stop = plan.where_ranges[pair.where_done]
            tasks.append((stop, "where", start))
        if not tasks:
            return None
        stop, kind, start = min(tasks)
        if upto < stop:
            return None
        try:
            if kind == "stats":
                readers = (plan.loop.a, plan.loop.b)
                return (
                    kind,
                    start,
                    stop,
                    [chunk_pieces(h, r, start, stop) for h, r in zip(halves, readers, strict=True)],
                )
            return kind, start, stop, [stretches(h, start, stop) for h in halves]
        except ValueError:
            self._bounds.give_up(pair, "its chunks are not where its blocks are")
            return None

    def _run(self, pair: LockstepPair, kind: str, start: int, stop: int, held: list[Any]) -> None:
        plan = pair.plan
        assert plan is not None
        if kind == "stats":
            partial = plan.loop.in_memory((held[0][0], held[1][0]), (held[0][1], held[1][1]), plan.tolerance)
        else:
            region = plan.where[pair.where_done]
            shape = tuple(s.stop - s.start for s in region)
            a, b = (block_values(h, parts, shape) for h, parts in zip(pair.halves, held, strict=True) if h is not None)
            squares, nonfinite = block_masses(a, b, self._context.kernel)
        del held
        with self._changed:
            if kind == "stats":
                pair.partials[start] = partial
                pair.done += 1
            else:
                if pair.masses is None:
                    pair.masses = WhereAccumulator(plan.loop.shape)
                pair.masses.fold(squares, nonfinite, [s.start for s in plan.where[pair.where_done]])
                pair.where_done += 1
            done_upto = min(
                plan.regions[pair.done - 1][1] if pair.done else 0,
                plan.where_ranges[pair.where_done - 1][1] if pair.where_done else 0,
            )
            self._bounds.drop_computed(pair, done_upto)
            self._changed.notify_all()


def _record(half: Half) -> TensorRecord:
    """A row for `aligned_views` (store key, dtype and shape; no digest is known yet)."""
    record = TensorRecord(name="", store_key=half.key, digest="", dtype=half.dtype.name, has_values=True)
    record.shape = list(half.shape)
    return record
