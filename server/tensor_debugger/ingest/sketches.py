"""A tensor's summary (`engine.summary_compare.Sketch`), computed with torch on the tensor's own device.

A capture with `values="summary"` computes it as each hook fires, on the GPU for a GPU tensor: only the dozen
numbers and the sampled values come back to the host, never the tensor. A stored tensor (a full capture, a dump)
gets the same summary at ingest, from the blocks it is written in (stored_sketches.py), and keeps it in its row, so
either side of a pair may be a summary and the judge reads no stored values for it. Only a row stored before ingest
kept summaries, or before it kept "fold64" hashes and paired with a fold64 summary, has its values read back
(`record_sketch`).

- The content hash: a summary capture's is "fold64:<hex>" on every device (ingest/fold64.py): on the CPU summed by
  the compiled kernel in the same pass as the statistics (`fold64_sketch`), elsewhere with torch ops there
  (`fold64.content_hash`). `sketch(..., "blake3")` of a CPU tensor gives instead the BLAKE3 digest ingest gives a
  stored tensor ("blake3:<hex>", over a header naming dtype and shape, then the bytes); ingest keeps both.
- count, sum, sum of squares, min and max are over the finite values, in float64; NaN and Inf are counted.
- The sample: the values at `sample_positions(numel)` (float64; complex tensors: their magnitudes, as ingest's
  statistics).
Work goes `CHUNK` elements at a time, so the float64 temporaries stay bounded on the device.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.chunking import iter_blocks
from tensor_debugger.engine.fused import Kernel, default_kernel
from tensor_debugger.engine.summary_compare import Sketch, SketchVerdict, compare_sketches, sample_positions
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.ingest.fold64 import Fold64, content_hash, dtype_name, fold64_digest
from tensor_debugger.ingest.stored_sketches import (
    CHUNKS_PER_BLOCK,
    SketchSample,
    sampled_values,
    sketch_of,
    stored_layout,
)
from tensor_debugger.ingest.summary import SummaryAccumulator, summarise_folded, summarise_stored
from tensor_debugger.store.dtypes import LogicalDtype, from_torch, parse_dtype, torch_to_storage

if TYPE_CHECKING:
    import torch

    from tensor_debugger.store.arrays import ArrayStore
    from tensor_debugger.store.models import TensorRecord

CHUNK = 1 << 22  # elements (and words) per step
# A summary's BLAKE3 runs on the thread that asks for it. Hashing on blake3's own threads as well was 5x slower
# per byte inside a CPU forward pass (torch's threads, between its kernels, hold the cores), and no faster alone
# on 2 cores: bench/RESULTS.md, 2026-11-27.
HASH_THREADS = 1


def sketch(tensor: torch.Tensor, hash_kind: str | None = None, kernel: Kernel | None = None) -> Sketch:
    """The summary of `tensor` (see the module docstring), computed where it lives. A CPU tensor's is computed by
    ingest's passes, `kernel`'s (the engine instance's statistics path; where None, `fused.default_kernel()`, whose
    family is resolved once): the summary ingest keeps of the same tensor stored has the same hash, counts, extremes
    and sampled values. Its hash is of `hash_kind`, "blake3" (the digest ingest gives its bytes, `writer.new_hasher`:
    a CPU tensor's default) or "fold64" (another device's default)."""
    import torch

    t = _resolved(tensor.detach())
    kind = hash_kind or ("blake3" if t.device.type == "cpu" else "fold64")
    if t.device.type == "cpu":
        return _host_sketch(t, kind, kernel if kernel is not None else default_kernel())
    flat = t.reshape(-1)
    if flat.is_complex():
        flat = flat.abs()
    numel = flat.numel()
    count = nan = inf = 0
    total = squares = 0.0
    lo, hi = math.inf, -math.inf
    for start in range(0, numel, CHUNK):
        x = flat[start : start + CHUNK].to(torch.float64)
        stats = torch.stack([x.sum(), (x * x).sum()])
        if not bool(torch.isfinite(stats).all()):  # NaN or Inf present (or squares overflow): look closer
            finite = torch.isfinite(x)
            nan += int(torch.isnan(x).sum().item())
            inf += int(torch.isinf(x).sum().item())
            x = x[finite]
            if not x.numel():
                continue
            stats = torch.stack([x.sum(), (x * x).sum()])
        extremes = torch.stack([x.min(), x.max()])
        s, q = stats.tolist()
        low, high = extremes.tolist()
        count += x.numel()
        total += s
        squares += q
        lo, hi = min(lo, low), max(hi, high)
    positions = sample_positions(numel)
    if positions:
        index = torch.tensor(positions, dtype=torch.int64, device=flat.device)
        sample = tuple(float(v) for v in flat[index].to(torch.float64).tolist())
    else:
        sample = ()
    return Sketch(
        tuple(t.shape),
        dtype_name(tensor.dtype),
        content_hash(t) if kind == "fold64" else _blake3(t),
        numel,
        count,
        total,
        squares,
        lo if count else None,
        hi if count else None,
        nan,
        inf,
        sample,
    )


def _blake3(t: torch.Tensor) -> str:
    """The digest ingest gives the tensor's bytes (`writer.new_hasher`): equal to a stored tensor's `digest`."""
    from tensor_debugger.store.dtypes import torch_to_storage

    return _blake3_of(torch_to_storage(t), t)


def _blake3_of(array: NDArray[Any], t: torch.Tensor) -> str:
    """`_blake3(t)` where `array` is `torch_to_storage(t)`, already made."""
    from tensor_debugger.ingest.writer import DIGEST_ALGORITHM, new_hasher
    from tensor_debugger.store.dtypes import from_torch

    hasher = new_hasher(from_torch(t.dtype), tuple(t.shape), HASH_THREADS)
    hasher.update(array.reshape(-1).view("uint8") if array.size else b"")
    return f"{DIGEST_ALGORITHM}:{hasher.hexdigest()}"


def _host_sketch(t: torch.Tensor, kind: str, kernel: Kernel) -> Sketch:
    """A CPU tensor's summary through ingest's summary pass (`kernel`'s, compiled where it can be: one pass, no
    float64 copy) and its sampled values as ingest takes them (`stored_sketches.sampled_values`); sum and sum of
    squares from its count, mean and sum of squared deviations. A tensor that is not contiguous is copied once, and
    its copy is what the hash, the statistics and the sample read. With `kind` "fold64", the kernel computes the
    hash's sum in the same pass as the statistics (`summary.summarise_folded`)."""
    return _host_sketch_folded(t, kind, kernel)[0]


def fold64_sketch(tensor: torch.Tensor, kernel: Kernel | None = None) -> tuple[Sketch, int | None]:
    """`sketch(tensor, "fold64", kernel)`, and for a CPU tensor whose hash the compiled kernel summed, that sum
    (`fold64.fold64_digest`'s `total`; else None): a tensor of the same bytes in the same order has the same sum,
    whatever its shape (`reshaped`)."""
    t = _resolved(tensor.detach())
    if t.device.type != "cpu":
        return sketch(t, "fold64", kernel), None
    return _host_sketch_folded(t, "fold64", kernel if kernel is not None else default_kernel())


def reshaped(summary: Sketch, total: int, shape: tuple[int, ...], itemsize: int) -> Sketch:
    """The summary of a tensor of `shape` holding the same bytes, in the same order, as the one `summary` (a
    "fold64" one, whose hash's sum is `total`) is of: the same statistics and sample (the same elements at the same
    flat positions), the hash of the new shape."""
    numel = math.prod(shape)
    if numel != summary.numel or not summary.hash.startswith("fold64:"):
        raise ValueError(f"a summary of {summary.numel} elements cannot be of shape {list(shape)}")
    digest = fold64_digest(summary.dtype, shape, numel * itemsize, total)
    return dataclasses.replace(summary, shape=shape, hash=digest)


def _host_sketch_folded(t: torch.Tensor, kind: str, kernel: Kernel) -> tuple[Sketch, int | None]:
    """`t`: detached, on the CPU, neither a lazy conjugate nor a negation (`fold64_sketch`, `sketch`)."""
    t = _contiguous(t)
    logical = from_torch(t.dtype)
    # `torch_to_storage(t)` of a detached contiguous CPU tensor, without its detach, copy and layout checks (a summary
    # capture makes hundreds): shares `t`'s memory, no second copy
    array = t.numpy() if not logical.raw_bits else torch_to_storage(t)
    flat = array.reshape(-1)
    totals = SummaryAccumulator()
    fold: int | None = None
    if kind == "fold64":  # the statistics and the hash's sum in one compiled pass where the kernel has one
        block, fold = summarise_folded(flat, logical, kernel)
        totals.fold(block)
        shape, nbytes = tuple(t.shape), t.numel() * t.element_size()
        digest = content_hash(t) if fold is None else fold64_digest(dtype_name(t.dtype), shape, nbytes, fold)
    else:
        if array.size:
            totals.add_stored(flat, logical, kernel)
        digest = _blake3_of(array, t)
    positions = _sample_index(array.size)
    values = sampled_values(flat[positions], logical) if positions.size else []
    return sketch_of(tuple(t.shape), dtype_name(t.dtype), digest, totals, values), fold


def _resolved(t: torch.Tensor) -> torch.Tensor:
    """`t` with a lazy conjugation or negation applied (`x.H`, `x.mH`, `x.conj()` of a complex tensor: views whose
    memory holds the values before it, which torch conjugates as it reads them), a copy; `t` itself otherwise."""
    return t.resolve_conj().resolve_neg() if t.is_conj() or t.is_neg() else t


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    """`t` itself where it is contiguous, else a C-order copy of its bits made by numpy on this thread: torch's
    copy spreads a strided tensor over its threads, which on a busy machine wait for each other (a 5 MB transposed
    tensor took 5 to 12 ms that way, 1 ms on one thread). Elements of 16 bytes (complex128), which no integer
    dtype views, are copied by torch."""
    import torch

    if t.is_contiguous():
        return t
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(t.element_size())
    if bits is None:
        return t.contiguous()
    return torch.from_numpy(np.ascontiguousarray(t.view(bits).numpy())).view(t.dtype)


@functools.lru_cache(maxsize=256)
def _sample_index(numel: int) -> NDArray[np.int64]:
    """`sample_positions(numel)` as an index array, made once per size."""
    index = np.asarray(sample_positions(numel), dtype=np.int64)
    index.flags.writeable = False
    return index


def record_sketch(
    store: ArrayStore, record: TensorRecord, hash_kind: str | None = None, kernel: Kernel | None = None
) -> Sketch | None:
    """A tensor's summary, its hash of `hash_kind` ("blake3" or "fold64": the other side's, to compare with; None:
    any): the one its row keeps (a summary capture's, or ingest's of a stored tensor), else computed from its values
    read back (a row stored before ingest kept summaries, or a stored tensor's "fold64" hash); None for a tensor with
    neither (a trace written with use_repr=True)."""
    kept = Sketch.from_json(record.sketch) if record.sketch is not None else None
    if kept is not None and (not record.has_values or hash_kind is None):
        return kept
    alike = kept.with_hash(hash_kind) if kept is not None and hash_kind is not None else None
    if alike is not None:  # its own hash, or ingest's fold64 of a stored tensor
        return alike
    if not record.has_values:
        return None
    logical = parse_dtype(record.dtype)
    array = store.open(record.store_key, record.digest)
    try:
        return read_back_sketch(array, logical, record.digest, hash_kind or "blake3", kernel)
    except ValueError:  # an array not chunked as ingest chunks: summarised whole, as it was before
        return sketch(store.read_whole(record.store_key, logical), hash_kind or "blake3", kernel)


def read_back_sketch(
    array: Any, logical: LogicalDtype, digest: str, hash_kind: str = "blake3", kernel: Kernel | None = None
) -> Sketch:
    """The summary ingest gives a stored array (a Zarr array of `logical` stored values) whose row has `digest`,
    computed again from its blocks read back one at a time, cut, summarised and sampled as ingest cuts, summarises
    and samples them (stored_sketches.py): the same floats, bit for bit. Its hash is `digest` where that is BLAKE3,
    else computed from the blocks: in BLAKE3 (an older data dir's "sha256:" digest), or as `content_hash` computes
    it for `hash_kind` "fold64" (to compare with another device's summary). Raises ValueError for an array not
    chunked as ingest chunks."""
    from tensor_debugger.ingest.writer import DIGEST_ALGORITHM, new_hasher

    shape, chunks = tuple(array.shape), tuple(array.chunks)
    layout = stored_layout(shape, chunks)
    fold = Fold64(kernel) if hash_kind == "fold64" else None
    hasher = None if fold is not None or digest.startswith(f"{DIGEST_ALGORITHM}:") else new_hasher(logical, shape)
    totals = SummaryAccumulator()
    kernel = kernel if kernel is not None else default_kernel()
    sample = SketchSample(logical, math.prod(shape))
    for region in iter_blocks(layout, CHUNKS_PER_BLOCK):
        block = np.asarray(array[region if region else ()])
        totals.fold(summarise_stored(block, logical, kernel))
        sample.take(block)
        if hasher is not None:
            hasher.update(block.reshape(-1).view(np.uint8).data)
        if fold is not None:
            fold.update(block.reshape(-1).view(np.uint8))
    if hasher is not None:
        digest = f"{DIGEST_ALGORITHM}:{hasher.hexdigest()}"
    if fold is not None:
        digest = fold.digest(logical.name, shape, math.prod(shape) * logical.itemsize)
    return sample.sketch(shape, digest, totals)


def sketch_verdict(
    store: ArrayStore,
    a: Sequence[TensorRecord],
    b: Sequence[TensorRecord],
    tolerance: Tolerance,
    kernel: Kernel | None = None,
) -> SketchVerdict | None:
    """The verdict on a pair of one tensor a side where a side is known by its summary alone (`compare_sketches`,
    against the other side's summary, kept or computed from its values); None where neither side has a summary or a
    side is sharded. `kernel`: the statistics path of a summary computed from values (see `sketch`)."""
    if len(a) != 1 or len(b) != 1:
        return None
    sides = (a[0], b[0])
    kept = [r.sketch for r in sides if not r.has_values and r.sketch is not None]  # the summary-only side's hash
    kept = kept or [r.sketch for r in sides if r.sketch is not None]
    if not kept:
        return None
    kind = str(kept[0].get("hash", "blake3:")).partition(":")[0]
    left, right = record_sketch(store, a[0], kind, kernel), record_sketch(store, b[0], kind, kernel)
    if left is None or right is None:
        return None
    return compare_sketches(left, right, tolerance)
