"""Copy one tensor into the array store block by block, hashing and summarising it on the way.

A tensor's digest is BLAKE3 (`DIGEST_ALGORITHM`) of a header naming its dtype and shape, then its C-order bytes,
spelled "blake3:<hex>". BLAKE3 hashes one update on every core (`max_threads=AUTO`), at memory speed, where
sha256 ran at about 1.1-1.7 GB/s on one. Data dirs written before hold "sha256:<hex>" digests (the same header
and bytes): the prefix says which, equal digests still mean bit-identical tensors, and a digest of one algorithm
never equals one of the other (a tensor stored under both is kept twice, and compared again once).

Whether a tensor's chunks are compressed is chosen from a sample of its first block (`store.compression`).

Every tensor also gets its summary (`StoredTensor.sketch`, stored_sketches.py) from the same blocks: the digest,
the folded statistics, and the sampled elements picked from each block as it is read; and besides the digest, the
"fold64" hash of the same bytes (ingest/fold64.py, computed with the digest), which a CPU summary capture's hash is
compared with.
"""

from __future__ import annotations

import json
import math
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import blake3
import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.chunking import Region, iter_blocks, plan_chunks
from tensor_debugger.engine.fused import Kernel
from tensor_debugger.ingest.block_readers import Leaf
from tensor_debugger.ingest.fold64 import Fold64
from tensor_debugger.ingest.stored_sketches import CHUNKS_PER_BLOCK, SketchSample
from tensor_debugger.ingest.summary import BlockSummary, SummaryAccumulator, TensorSummary, summarise_stored
from tensor_debugger.ingest.taps import RunTap, TensorTap
from tensor_debugger.store.arrays import ArrayStore, worth_compressing
from tensor_debugger.store.dtypes import LogicalDtype

DIGEST_ALGORITHM = "blake3"  # the prefix of every digest this version writes; older data dirs hold "sha256"


@dataclass(frozen=True)
class StoredTensor:
    store_key: str
    shape: tuple[int, ...]
    dtype: LogicalDtype
    nbytes: int
    digest: str  # "blake3:<hex>" of dtype, shape and C-order bytes (older data dirs: "sha256:<hex>")
    summary: TensorSummary
    # its summary as a capture with values="summary" keeps one, the hash being `digest`, as its row stores it
    # (`Sketch.to_json(compact=True)`; `Sketch.from_json` reads it)
    sketch: dict[str, Any]


def digest_header(dtype: LogicalDtype, shape: tuple[int, ...]) -> bytes:
    return json.dumps({"dtype": dtype.name, "shape": list(shape)}).encode() + b"\0"


def new_hasher(dtype: LogicalDtype, shape: tuple[int, ...], threads: int = blake3.blake3.AUTO) -> Any:
    """A BLAKE3 hasher that has taken the tensor's header: feed it the C-order bytes. (Its type is blake3's.) It
    hashes on up to `threads` threads (default: as many as blake3 sees fit); the digest is the same for any."""
    return blake3.blake3(digest_header(dtype, shape), max_threads=threads)


@dataclass(frozen=True)
class WritePools:
    """The threads an ingest shares: they write (compress and store) blocks, summarise them and hash them."""

    pool: ThreadPoolExecutor
    in_flight: int  # blocks handed to the pool at once: one per thread, and one ready for the first to free

    @classmethod
    def open(cls, threads: int, beside: bool = False) -> WritePools:
        """`beside`: another run's ingest in this process runs at the same time (`compare A B` reads both runs at
        once), its blocks there for a thread that is free first; then a run keeps one block per thread in flight, not
        one more (two at least: a lockstep's side ahead keeps two, `compute/lockstep_pairs.kept_limit`). Each block is
        a read buffer of up to 16 MiB held (`BufferPool`): two runs of a compare held 8 with 2 threads, now 6."""
        if threads < 1:
            raise ValueError(f"an ingest needs at least one worker thread, got {threads}")
        return cls(ThreadPoolExecutor(threads, thread_name_prefix="ingest"), max(2, threads + (0 if beside else 1)))

    @property
    def buffers(self) -> int:
        """Read buffers worth keeping for later blocks: every block in flight, and the one being read."""
        return self.in_flight + 1

    def close(self) -> None:
        self.pool.shutdown()


class SerialLane:
    """Tasks run one after another in the order they were submitted, on the threads of a shared pool, and no
    thread waits for its turn: a lane holds at most one of the pool's threads, while other lanes and tasks use
    the rest. Hashing needs this: a digest takes its bytes in order, but the digests of several tensors may grow
    at once."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._queue: deque[tuple[Future[None], Callable[[], None]]] = deque()
        self._draining = False

    def submit(self, task: Callable[[], None]) -> Future[None]:
        future: Future[None] = Future()
        with self._lock:
            self._queue.append((future, task))
            if self._draining:
                return future
            self._draining = True
        try:
            self._pool.submit(self._drain)
        except BaseException:
            with self._lock:
                self._draining = False
            raise
        return future

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._draining = False
                    return
                future, task = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while it waited
            try:
                task()
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(None)


@dataclass
class _Tensor:
    key: str
    leaf: Leaf
    hasher: Any  # from `new_hasher`
    fold: Fold64  # the "fold64" hash of the same bytes, fed with the hasher
    lane: SerialLane
    sample: SketchSample
    summary: SummaryAccumulator = field(default_factory=SummaryAccumulator)
    unsettled: int = 0  # blocks handed to the pool and not yet settled
    submitted: bool = False  # every block has been handed over
    result: StoredTensor | None = None

    def finish(self) -> None:
        leaf = self.leaf
        nbytes = math.prod(leaf.shape) * leaf.dtype.itemsize
        digest = f"{DIGEST_ALGORITHM}:{self.hasher.hexdigest()}"
        self.result = StoredTensor(
            self.key,
            leaf.shape,
            leaf.dtype,
            nbytes,
            digest,
            self.summary.result(),
            self.sample.kept(leaf.shape, digest, self.summary, self.fold.digest(leaf.dtype.name, leaf.shape, nbytes)),
        )


@dataclass(frozen=True)
class _Block:
    tensor: _Tensor
    region: Region
    written: Future[Future[None] | None]  # the write, or the start of uploads: their future
    summarised: Future[BlockSummary]
    hashed: Future[None]
    number: int  # in the order blocks were handed over (`TensorWriter.handed_over`)
    tap: TensorTap | None  # lent the block as well: told before the block goes back to its reader


class PageCacheBudget:
    """How much more of a run goes through the page cache before its chunk files are written around it (the
    `direct_writes` setting, store/direct_writes.py): the first `buffered_run_bytes` of each run, tensor by tensor.
    A small run is written faster through the cache (the kernel writes it back after the ingest, and its comparison
    reads it from there); past a few hundred MB, filling the cache costs more than the disk's time."""

    def __init__(self, nbytes: int) -> None:
        self._left = nbytes
        self._lock = threading.Lock()

    def direct(self, nbytes: int) -> bool:
        """Whether a tensor of `nbytes` bytes, the run's next, goes around the page cache."""
        with self._lock:
            if nbytes <= self._left:
                self._left -= nbytes
                return False
            self._left = 0
            return True


class TensorWriter:
    """Copies tensors into the array store as one stream of blocks: each block is written, summarised and hashed
    on the pool's threads while the next blocks are read, and the next tensor's blocks start while the last ones
    of the tensor before are still hashing, so the digests of neighbouring tensors grow at once. Memory stays at
    `pools.in_flight` blocks (and the one being read) whatever the tensors' sizes. Every tensor's digest, summary
    and stored chunks are the same whatever the number of threads: blocks are cut the same way, hashed in order,
    and their summaries folded in order.

    Use as a context manager: leaving it early (an error) cancels and waits for what is in flight, so that no
    thread touches a block after its file is closed."""

    def __init__(
        self,
        store: ArrayStore,
        chunk_bytes: int,
        pools: WritePools,
        kernel: Kernel,
        on_bytes: Callable[[int], None] | None = None,
        budget: PageCacheBudget | None = None,
    ) -> None:
        """`kernel`: the statistics path of the tensors' summaries; `budget`: the run's, shared by the writers of its
        files; without one, every tensor may go direct."""
        self.kernel = kernel
        self.store = store
        self.chunk_bytes = chunk_bytes
        self.pools = pools
        self.on_bytes = on_bytes
        self.budget = budget
        self._window: deque[_Block] = deque()
        self._handed_over = 0  # blocks handed to the pool so far, each numbered in that order
        # told of the oldest block's number when `add` must wait for it to hand over another (the window is full):
        # a caller whose blocks of an earlier file are in flight settles that file there (`settle_to`)
        self.making_room: Callable[[int], None] | None = None

    @property
    def handed_over(self) -> int:
        """How many blocks were handed over so far: `settle_to` and `abandon` take such a count as a mark."""
        return self._handed_over

    def __enter__(self) -> TensorWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abandon()

    def add(
        self, key: str, leaf: Leaf, name: str | None = None, tap: RunTap | None = None
    ) -> Callable[[], StoredTensor]:
        """Start storing `leaf` at `key`; the returned function gives its StoredTensor once `finish` returned.
        `tap` (with the tensor's `name`) is handed each block as it is read (ingest/taps.py)."""
        layout = plan_chunks(leaf.shape, leaf.dtype.itemsize, self.chunk_bytes)
        regions = iter_blocks(layout, CHUNKS_PER_BLOCK)
        first = next(regions, None)
        first_block = leaf.reader.read(first) if first is not None else None  # may be a view of a mapped file
        compressed = first_block is None or worth_compressing(first_block)
        direct = self.budget is None or self.budget.direct(math.prod(leaf.shape) * leaf.dtype.itemsize)
        array = self.store.writer(key, leaf.shape, leaf.dtype, layout.chunks, compressed, direct)
        tensor = _Tensor(
            key,
            leaf,
            new_hasher(leaf.dtype, leaf.shape),
            Fold64(self.kernel),
            SerialLane(self.pools.pool),
            SketchSample(leaf.dtype, math.prod(leaf.shape)),
        )

        start_write = getattr(array, "start_write", None)  # an `ObjectChunkWriter`'s, its uploads under way after

        def store_block(region: Region, block: NDArray[Any]) -> Future[None] | None:
            """Write `block`; where the array's store uploads it, the uploads' future (the block settles once that
            is done), so that this thread goes on encoding, summarising and hashing other blocks meanwhile."""
            if start_write is not None:
                uploads: Future[None] = start_write(region if region else (), block)
                return uploads
            array[region if region else ()] = block
            return None

        def hash_block(block: NDArray[Any]) -> Callable[[], None]:
            def hashed() -> None:
                data = block.reshape(-1).view(np.uint8)
                tensor.hasher.update(data.data)
                tensor.fold.update(data)

            return hashed

        def blocks() -> Iterator[tuple[Region, NDArray[Any]]]:
            if first is None or first_block is None:
                return
            yield first, first_block
            for region in regions:
                yield region, leaf.reader.read(region)

        tensor_tap: TensorTap | None = None
        if tap is not None and name is not None:
            tensor_tap = tap.tensor(name, key, leaf.shape, leaf.dtype, layout.chunks)
        try:
            self._blocks(tensor, blocks(), store_block, hash_block, tensor_tap)
        except BaseException:
            if tensor_tap is not None:
                tensor_tap.end(False)
            raise
        if tensor_tap is not None:
            tensor_tap.end(True)
        tensor.submitted = True
        if tensor.unsettled == 0:  # no block at all
            tensor.finish()

        def result() -> StoredTensor:
            if tensor.result is None:
                raise RuntimeError(f"tensor {key} is not finished: call finish() first")
            return tensor.result

        return result

    def _blocks(
        self,
        tensor: _Tensor,
        blocks: Iterator[tuple[Region, NDArray[Any]]],
        store_block: Callable[[Region, NDArray[Any]], Future[None] | None],
        hash_block: Callable[[NDArray[Any]], Callable[[], None]],
        tap: TensorTap | None,
    ) -> None:
        """Hand each of a tensor's blocks to the pool (written, summarised, hashed) and to `tap`, keeping at most
        `pools.in_flight` in flight."""
        pool = self.pools.pool
        for region, block in blocks:
            tensor.sample.take(block)  # the few sampled elements, in order, while the block is at hand
            self._window.append(
                _Block(
                    tensor,
                    region,
                    pool.submit(store_block, region, block),
                    pool.submit(summarise_stored, block, tensor.leaf.dtype, self.kernel),
                    tensor.lane.submit(hash_block(block)),
                    self._handed_over,
                    tap,
                )
            )
            self._handed_over += 1
            tensor.unsettled += 1
            if tap is not None:  # while the pool writes it (lent to the tap until `_settle` releases it)
                tap.put(region, block)
            if self.on_bytes is not None:
                self.on_bytes(block.nbytes)
            if len(self._window) > self.pools.in_flight and self.making_room is not None:
                self.making_room(self._window[0].number)
            while len(self._window) > self.pools.in_flight:
                self._settle()

    def finish(self) -> None:
        """Wait for every block handed over; raises what writing, summarising or hashing one raised."""
        while self._window:
            self._settle()

    def settle_to(self, mark: int) -> None:
        """Wait for the blocks handed over before `mark` (a `handed_over` count: the tensors added by then are
        finished once this returns), leaving the later ones in flight; raises as `finish` does."""
        while self._window and self._window[0].number < mark:
            self._settle()

    def abandon(self, mark: int | None = None) -> None:
        """Cancel the blocks not yet started and wait for the others (after a failure; a no-op after `finish`);
        with `mark`, only those handed over before it (the blocks of a file that failed while the next file's are in
        flight)."""
        while self._window and (mark is None or self._window[0].number < mark):
            block = self._window.popleft()
            futures: list[Future[Any]] = [block.written, block.summarised, block.hashed]
            for future in futures:
                future.cancel()
            wait(futures)
            if not block.written.cancelled() and block.written.exception() is None:
                uploads = block.written.result()
                if uploads is not None:
                    wait([uploads])
            if block.tap is not None:
                block.tap.release(block.region)

    def _settle(self) -> None:
        block = self._window.popleft()
        try:
            uploads = block.written.result()
            if uploads is not None:
                uploads.result()
            part = block.summarised.result()
            block.hashed.result()
        except BaseException:
            self._window.appendleft(block)  # for `abandon`, which waits for its other futures
            raise
        tensor = block.tensor
        tensor.summary.fold(part)  # in block order: the same floats whatever thread computed each part
        if block.tap is not None:
            block.tap.release(block.region)  # the tap copies what it still keeps of it
        tensor.leaf.reader.done(block.region)  # only now may its pages go: nothing touches the block any more
        tensor.unsettled -= 1
        if tensor.submitted and tensor.unsettled == 0:
            tensor.finish()


def write_leaf(
    store: ArrayStore,
    key: str,
    leaf: Leaf,
    chunk_bytes: int,
    pools: WritePools,
    kernel: Kernel,
    on_bytes: Callable[[int], None] | None = None,
) -> StoredTensor:
    """Store `leaf` at `key` on its own (see `TensorWriter`, which overlaps tensors)."""
    with TensorWriter(store, chunk_bytes, pools, kernel, on_bytes) as writer:
        result = writer.add(key, leaf)
        writer.finish()
    return result()
