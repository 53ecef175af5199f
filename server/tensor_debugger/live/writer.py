"""Writing captured activations off the forward path: bounded host buffers, device copies, background writers.

A hook hands a tensor to `CaptureWriter.submit`, which only copies it into a host buffer taken from a
`HostBufferPool` and queues it; worker threads then compress, hash and write it (`array_writer.write_leaf` into
the array store, or a safetensors file), and give the buffer back.

- A CUDA tensor is copied into a pinned buffer with `copy_(non_blocking=True)` on a side stream of its device
  (which first waits for the model's stream, and owns the tensor's memory until the copy is done through
  `record_stream`); a CUDA event recorded after the copy is what the worker waits for, and what the model's
  stream waits for before its next kernel (so a later in-place change cannot race the copy). The Python side of
  the forward pass is not held up by the copy, nor by compression and writes.
- A CPU tensor is copied too (a memcpy, a small share of the cost of compressing it): the model may change an
  activation in place later (`x += ...`, `relu_`), and what is written must be its value when the hook fired.
- The pool lends at most its budget of bytes at once: when it is spent, the hook waits until a worker gives
  buffers back, so host memory stays bounded however fast the model produces activations.

Nothing here touches CUDA unless a tensor handed over is on a CUDA device.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from numpy.typing import NDArray

from tensor_debugger.engine.chunking import Region
from tensor_debugger.engine.fused import Kernel
from tensor_debugger.ingest.block_readers import Leaf
from tensor_debugger.ingest.writer import StoredTensor, WritePools, write_leaf
from tensor_debugger.settings import Settings
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.dtypes import from_torch, torch_to_storage

DEFAULT_HOST_MEMORY = 1 << 30  # bytes of host buffers a capture may hold at once


def default_workers() -> int:
    """TENSOR_DEBUGGER_WORKERS, else the CPUs this process may use (as for ingest and comparisons)."""
    return Settings.from_environ().threads


class HostBufferPool:
    """Byte buffers (uint8 tensors) lent out for at most `budget` bytes at once, kept for reuse when given back.

    `take` blocks while lending the buffer would pass the budget. A request larger than the whole budget is lent
    once nothing else is out, alone. Buffers kept for reuse count towards the budget too: the pool holds at most
    max(budget, the largest single request) bytes, lent or not. Pinned buffers (for copies from a CUDA device) and
    pageable ones are kept apart."""

    def __init__(self, budget: int, allocate: Callable[[int, bool], torch.Tensor] | None = None) -> None:
        if budget <= 0:
            raise ValueError(f"the host memory budget must be positive, got {budget}")
        self.budget = budget
        self._allocate = allocate or _allocate
        self._cond = threading.Condition()
        self._lent = 0  # bytes of the buffers out
        # kept buffers with their sizes: asking a tensor its size is a torch call, which an op capture's torch
        # function mode intercepts, and a take looks at every kept buffer
        self._free: dict[bool, list[tuple[int, torch.Tensor]]] = {False: [], True: []}
        self._free_bytes = 0
        self.peak_lent = 0  # the most bytes lent at once
        self.waits = 0  # how many takes had to wait for a buffer to come back

    @property
    def lent(self) -> int:
        with self._cond:
            return self._lent

    @property
    def held(self) -> int:
        """Bytes of every buffer the pool owns, lent or kept."""
        with self._cond:
            return self._lent + self._free_bytes

    def take(self, nbytes: int, pinned: bool = False) -> torch.Tensor:
        """A uint8 buffer of at least `nbytes` (> 0) bytes; blocks while the budget is spent."""
        with self._cond:
            if not self._fits(nbytes):
                self.waits += 1
                self._cond.wait_for(lambda: self._fits(nbytes))
            free = self._free[pinned]
            room = self.budget - self._lent if self._lent else max(self.budget, nbytes)
            fitting = [i for i, (size, _) in enumerate(free) if nbytes <= size <= room]
            if fitting:
                size, buffer = free.pop(min(fitting, key=lambda i: free[i][0]))
                self._free_bytes -= size
                self._lend(size)
                return buffer
            # a new buffer: drop kept ones (largest first) until it fits beside what is lent and kept
            for kept in (self._free[False], self._free[True]):
                kept.sort(key=lambda item: item[0])
                while kept and self._lent + self._free_bytes + nbytes > max(self.budget, nbytes):
                    self._free_bytes -= kept.pop()[0]
            self._lend(nbytes)
        try:
            return self._allocate(nbytes, pinned)  # outside the lock: pinning memory takes a while
        except BaseException:
            with self._cond:
                self._lent -= nbytes
                self._cond.notify_all()
            raise

    def give(self, buffer: torch.Tensor, pinned: bool = False) -> None:
        """Return a buffer `take` lent; it is kept for the next `take`."""
        with self._cond:
            size = buffer.numel()
            self._lent -= size
            self._free[pinned].append((size, buffer))
            self._free_bytes += size
            self._cond.notify_all()

    def clear(self) -> None:
        """Let go of the kept buffers."""
        with self._cond:
            self._free = {False: [], True: []}
            self._free_bytes = 0

    def _fits(self, nbytes: int) -> bool:
        return self._lent == 0 or self._lent + nbytes <= self.budget

    def _lend(self, nbytes: int) -> None:
        self._lent += nbytes
        self.peak_lent = max(self.peak_lent, self._lent)


def _allocate(nbytes: int, pinned: bool) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)


class DeviceCopier:
    """Copies from CUDA tensors into pinned host tensors on one side stream per device, without waiting."""

    def __init__(self) -> None:
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def copy(self, source: torch.Tensor, host: torch.Tensor) -> torch.cuda.Event:
        """Start copying `source` (on a CUDA device) into `host` (pinned, same shape and dtype); the event returned
        completes when `host` holds the values `source` had when the model's stream reached this point."""
        device = source.device
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        model = torch.cuda.current_stream(device)
        stream.wait_stream(model)  # the values the model has computed so far
        with torch.cuda.stream(stream):
            host.copy_(source, non_blocking=True)
            source.record_stream(stream)  # the allocator keeps `source`'s memory until the copy is done
            # a worker waiting on the event sleeps rather than spins
            event = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
            event.record(stream)
        model.wait_event(event)  # the model's later kernels (an in-place change of `source`) run after the copy;
        return event  # the host is not held up


@dataclass
class Job:
    index: int  # call order
    name: str
    host: torch.Tensor  # the values, on the host (a view of `buffer`)
    buffer: torch.Tensor | None  # from the pool; None for an empty tensor
    pinned: bool
    ready: torch.cuda.Event | None  # a device copy still under way until it completes


class Sink:
    """Where a worker writes a captured tensor. `write` runs on worker threads, several at once."""

    def write(self, job: Job, pools: WritePools) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Every write has returned; release what the sink holds."""


class StoreSink(Sink):
    """Writes each tensor straight into the array store at `{prefix}/{index}`, compressed and hashed on the way
    (`write_leaf`, as ingest does)."""

    def __init__(self, store: ArrayStore, prefix: str, chunk_bytes: int, kernel: Kernel) -> None:
        """`kernel`: the statistics path of the tensors' summaries (the local services')."""
        self.store = store
        self.kernel = kernel
        self.prefix = prefix
        self.chunk_bytes = chunk_bytes
        self.stored: dict[int, StoredTensor] = {}  # by call order
        self._lock = threading.Lock()

    def write(self, job: Job, pools: WritePools) -> None:
        array = torch_to_storage(job.host)  # shares the buffer's memory
        leaf = Leaf(("data",), tuple(job.host.shape), from_torch(job.host.dtype), _ArrayReader(array))
        stored = write_leaf(self.store, f"{self.prefix}/{job.index}", leaf, self.chunk_bytes, pools, self.kernel)
        with self._lock:
            self.stored[job.index] = stored


class _ArrayReader:
    """A `BlockReader` over an array already in memory."""

    def __init__(self, array: NDArray[Any]) -> None:
        self._array = array

    def read(self, region: Region) -> NDArray[Any]:
        block = self._array[region] if region else self._array
        return block if block.flags.c_contiguous else block.copy(order="C")  # ascontiguousarray makes 0-d 1-d

    def done(self, region: Region) -> None:
        return None


class CaptureError(RuntimeError):
    """Writing a captured tensor failed (the disk filled, say); raised from the hook that follows or at the end."""


class CaptureWriter:
    """Takes tensors from the hooks and writes them through `sink` on `workers` threads, holding at most
    `host_memory` bytes of host copies (see the module docstring)."""

    def __init__(self, sink: Sink, host_memory: int = DEFAULT_HOST_MEMORY, workers: int | None = None) -> None:
        self.sink = sink
        self.pool = HostBufferPool(host_memory)
        self.copier: DeviceCopier | None = None  # made for the first CUDA tensor
        self.bytes = 0
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._cancelled = False
        count = workers or default_workers()
        # each worker writes one tensor at a time, two blocks of it at once (`write_leaf`), on these threads
        self._writing = ThreadPoolExecutor(2 * count, thread_name_prefix="capture-write")
        self._threads = [threading.Thread(target=self._work, name=f"capture-{i}", daemon=True) for i in range(count)]
        for thread in self._threads:
            thread.start()

    def submit(self, index: int, name: str, tensor: torch.Tensor) -> None:
        """Copy `tensor` to the host (from a CUDA device: started only) and queue it; blocks while the host
        budget is spent. Raises CaptureError when an earlier write failed."""
        self._check()
        source = tensor.detach()
        nbytes = source.numel() * source.element_size()
        pinned = source.is_cuda
        if nbytes == 0:
            self._jobs.put(Job(index, name, torch.empty(source.shape, dtype=source.dtype), None, False, None))
            return
        buffer = self.pool.take(nbytes, pinned)
        host = buffer[:nbytes].view(source.dtype).view(source.shape)
        ready = None
        try:
            if pinned:
                if self.copier is None:
                    self.copier = DeviceCopier()
                ready = self.copier.copy(source, host)
            else:
                host.copy_(source)
        except BaseException:
            self.pool.give(buffer, pinned)
            raise
        self.bytes += nbytes
        self._jobs.put(Job(index, name, host, buffer, pinned, ready))

    def close(self, cancel: bool = False) -> None:
        """Wait for every queued tensor to be written (with `cancel`, drop those not yet begun) and stop the
        workers; raises CaptureError when a write failed (unless cancelled)."""
        self._cancelled = cancel
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()
        self._writing.shutdown()
        self.sink.close()
        self.pool.clear()
        if not cancel:
            self._check()

    def _check(self) -> None:
        if self._error is not None:
            raise CaptureError(f"writing a captured tensor failed: {self._error}") from self._error

    def _work(self) -> None:
        pools = WritePools(self._writing, 2)  # two blocks of a tensor in flight, as `write_leaf` wants
        while (job := self._jobs.get()) is not None:
            try:
                if job.ready is not None:
                    job.ready.synchronize()
                if self._error is None and not self._cancelled:
                    self.sink.write(job, pools)
            except BaseException as exc:  # kept for the hooks and the end of the block to raise
                if self._error is None:
                    self._error = exc
            finally:
                if job.buffer is not None:
                    self.pool.give(job.buffer, job.pinned)
