"""Big pairs on a Dask cluster: one task per block, the blocks' partial statistics merged here in block order.

A pair larger than one block (`streaming.BLOCK_BYTES` of float64) is not given whole to one worker: this process
claims it, sets it up (its views, its blocks: `streaming.pair_blocks`, the split a local comparison uses) and
submits one task per block. Each task, in a worker, opens the pair's views (once per worker and comparison) and
computes that block's partial statistics exactly as a local comparison does (`streaming.compare_block`); the
partials come back and are merged in block order, as `compare_stream` merges them, so the statistics are the same
bits as computed here. A block that fails to read (a corrupt chunk) fails its pair, as here; a task that does not
come back (a worker lost) leaves its pair pending, for the rest of the computation to take. A pair that fails is
read again on the workers, a task per block of `where.where_regions`, for where inside it its error is: the
blocks' masses are folded here (this process reads none of the pair).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from numpy.typing import NDArray
from sqlalchemy import select

from tensor_debugger.compare.compute.dask_connection import SchedulerConnection, WaitStopped, result_with_workers
from tensor_debugger.compare.compute.dask_workers import worker_context
from tensor_debugger.compare.compute.pending import PendingPair, ResultWriter, pair_job, set_up
from tensor_debugger.compare.context import CompareContext
from tensor_debugger.compare.planning.current import CurrentPairs
from tensor_debugger.engine.chunking import Region
from tensor_debugger.engine.metrics import PairStats
from tensor_debugger.engine.pair_accumulator import PairAccumulator
from tensor_debugger.engine.streaming import BLOCK_BYTES, PairJob, compare_block, pair_blocks
from tensor_debugger.engine.where import WhereAccumulator, block_masses, where_regions
from tensor_debugger.errors import NoDaskWorkerError
from tensor_debugger.store.models import PairRecord, TensorRecord

if TYPE_CHECKING:
    from distributed import Client

    from tensor_debugger.settings import Settings

log = logging.getLogger(__name__)
SPLIT_ELEMENTS = BLOCK_BYTES // 8  # a pair of more elements spans several blocks: one task each
_QUERY_IDS = 500  # ids per IN (...) when sizing pairs
_JOBS_KEPT = 16  # pairs whose views a worker keeps open for their next blocks

Part = PairAccumulator | Exception | None  # a block's partials, the error reading it, or None: the pair changed
Masses = tuple[list[NDArray[Any]], list[NDArray[Any]]] | Exception | None  # a block's `where.block_masses`, likewise

_jobs: OrderedDict[tuple[Settings, str], PairJob[PendingPair]] = OrderedDict()  # a worker's open pairs
_jobs_lock = threading.Lock()


def big_pairs(context: CompareContext, pair_ids: Sequence[int]) -> set[int]:
    """Those of `pair_ids` whose reference side holds more than `SPLIT_ELEMENTS` values: split into blocks."""
    big: set[int] = set()
    with context.sessions() as db:
        for start in range(0, len(pair_ids), _QUERY_IDS):
            some = pair_ids[start : start + _QUERY_IDS]
            sides: dict[int, list[int]] = {
                pair: list(ids)
                for pair, ids in db.execute(
                    select(PairRecord.id, PairRecord.a_tensor_ids).where(PairRecord.id.in_(some))
                )
            }
            tensors = {i for ids in sides.values() for i in ids}
            shapes: dict[int, list[int]] = {
                tensor: list(shape)
                for tensor, shape in db.execute(
                    select(TensorRecord.id, TensorRecord.shape).where(TensorRecord.id.in_(tensors))
                )
            }
            for pair, ids in sides.items():
                if sum(_elements(shapes.get(i, [])) for i in ids) > SPLIT_ELEMENTS:
                    big.add(pair)
    return big


def _elements(shape: Sequence[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


@dataclass
class SplitPair:
    """A big pair being computed on the cluster: its job here, its blocks' tasks in order."""

    job: PairJob[PendingPair]
    same: list[int] = field(default_factory=list)  # pairs settled with the same result (the same cache key)
    tasks: list[Any] = field(default_factory=list)  # distributed Futures, one per block, in merge order
    error: Exception | None = None  # the views disagree in shape: the pair's result


def task_key(function: str, cache_key: str) -> str:
    """A block's task's Dask key: the function's name, the first 8 hex digits of the comparison's cache key (so that
    one comparison's blocks can be told from another's in the task stream: the dashboard's, a test's), and a token
    of its own. Dask still groups the tasks under the function's name: it reads a word of 8 hex digits as a hash."""
    return f"{function}-{cache_key.rpartition(':')[2][:8]}-{uuid.uuid4().hex}"


def submit_split(
    client: Client, settings: Settings, context: CompareContext, pair_ids: Sequence[int]
) -> tuple[list[SplitPair], int]:
    """Claim those of `pair_ids` nobody holds, set them up and submit their blocks; the pairs being computed and how
    many others were settled at set-up (cached, or failing to open)."""
    claimed = context.claims.claim_pairs(None, len(pair_ids), pair_ids) if pair_ids else []
    if not claimed:
        return [], 0
    jobs, finished = set_up(context, claimed)
    splits: dict[str, SplitPair] = {}
    for job in jobs:
        if job.key.key in splits:  # the same comparison: computed once
            splits[job.key.key].same.append(job.key.pair_id)
            continue
        split = splits[job.key.key] = SplitPair(job)
        try:
            regions = list(pair_blocks(job))
        except ValueError as exc:
            split.error = exc
            continue
        work = job.key
        split.tasks = [
            client.submit(
                compute_block, settings, work.pair_id, work.key, region, key=task_key("compute_block", work.key)
            )
            for region in regions
        ]
    return list(splits.values()), finished


def collect_split(
    context: CompareContext,
    splits: Sequence[SplitPair],
    settled: Callable[[int], None],
    should_stop: Callable[[], bool],
    cluster: Cluster,
) -> None:
    """Merge each pair's blocks in order as they come back and write its result; the claims of pairs left
    unsettled (a task lost, stopped) are given back."""
    if not splits:
        return
    writer = ResultWriter(context)
    try:
        for split in splits:
            if should_stop():
                break
            result = split.error or merged(split, cluster)
            if result is None:
                continue
            if isinstance(result, PairStats) and not result.passed:
                result = located_on_cluster(cluster, split, result)
            writer.add(split.job.key, result, [split.job.key.pair_id, *split.same])
            settled(1 + len(split.same))
    finally:
        writer.flush()
        context.claims.release_pairs()


def merged(split: SplitPair, cluster: Cluster) -> PairStats | Exception | None:
    """The pair's statistics from its blocks' partials, merged in block order (the first failed block's error);
    None where a task did not come back or found the pair changed. NoDaskWorkerError where the cluster has had no
    worker for too long, WaitStopped where the process stops (`dask_connection.result_with_workers`)."""
    job = split.job
    total = job.accumulator()
    for task in split.tasks:
        try:
            part: Part = cluster.result(task)
        except (NoDaskWorkerError, WaitStopped):
            raise
        except Exception:  # the task was lost (a worker died, the cluster went away): the pair stays pending
            log.exception("a block of pair %d was not computed on the cluster", job.key.pair_id)
            return None
        if part is None or isinstance(part, Exception):
            return part
        total.merge(part)
    return total.result()


@dataclass(frozen=True)
class Cluster:
    """Where a process sends a big pair's tasks: the client (of `connection`), what its workers open the pair with,
    and whether the process is stopping (which ends a wait for a result)."""

    connection: SchedulerConnection
    client: Client
    settings: Settings
    should_stop: Callable[[], bool]

    def result(self, task: Any) -> Any:
        """The task's result, waited for while the cluster has a worker (`dask_connection.result_with_workers`)."""
        no_worker = self.settings.dask_no_worker_seconds
        return result_with_workers(self.connection, self.client, task, no_worker, self.should_stop)


def located_on_cluster(cluster: Cluster, split: SplitPair, stats: PairStats) -> PairStats:
    """A failing big pair's `stats` with `where`, its blocks read again by the workers (a task each); without
    `where` (unknown) where a task fails or does not come back."""
    work = split.job.key
    shape = tuple(split.job.a.shape)
    regions = where_regions(shape)
    submit = cluster.client.submit
    tasks = [
        submit(where_block, cluster.settings, work.pair_id, work.key, r, key=task_key("where_block", work.key))
        for r in regions
    ]
    accumulator = WhereAccumulator(shape)
    for region, task in zip(regions, tasks, strict=True):
        try:
            part: Masses = cluster.result(task)
        except (NoDaskWorkerError, WaitStopped):
            cluster.client.cancel(tasks)  # type: ignore[no-untyped-call]
            raise
        except Exception:
            log.exception("where inside pair %d its error is was not computed on the cluster", work.pair_id)
            part = None
        if part is None or isinstance(part, Exception):
            cluster.client.cancel(tasks)  # type: ignore[no-untyped-call]
            return stats
        accumulator.fold(*part, [s.start for s in region])
    return replace(stats, where=accumulator.spans())


def where_block(settings: Settings, pair_id: int, key: str, region: Region) -> Masses:
    """In a Dask worker: one block's squared error per index of each dimension (`where.block_masses`); the error
    reading it; None where the pair no longer wants the comparison `key` names."""
    try:
        job = worker_job(worker_context(settings), settings, pair_id, key)
        return None if job is None else block_masses(job.a.read(region), job.b.read(region), job.kernel)
    except Exception as exc:
        return exc


def compute_block(settings: Settings, pair_id: int, key: str, region: Region) -> Part:
    """In a Dask worker: the partial statistics of one block of a pair, as computed locally; the error reading it;
    or None where the pair no longer wants the comparison `key` names."""
    try:
        job = worker_job(worker_context(settings), settings, pair_id, key)
        return None if job is None else compare_block(job, region)
    except Exception as exc:  # a corrupt chunk, a missing array: the pair's result, as locally
        return exc


def worker_job(context: CompareContext, settings: Settings, pair_id: int, key: str) -> PairJob[PendingPair] | None:
    """The pair's job with its views, opened once for its blocks; None unless the pair still wants `key`."""
    with _jobs_lock:
        found = _jobs.get((settings, key))
        if found is not None:
            _jobs.move_to_end((settings, key))
            return found
    with context.sessions() as db:
        current = CurrentPairs.by_id(context, db, [pair_id])
        wanted = current.wanted(pair_id)
        if wanted is None or wanted[0] != key:
            return None
        job = pair_job(context, current, pair_id, *wanted)
    with _jobs_lock:
        _jobs[(settings, key)] = job
        while len(_jobs) > _JOBS_KEPT:
            _jobs.popitem(last=False)
    return job
