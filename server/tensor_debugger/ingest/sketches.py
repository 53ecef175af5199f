"""A tensor's summary (`engine.summary_compare.Sketch`), computed with torch on the tensor's own device.

A capture with `values="summary"` computes it as each hook fires, on the GPU for a GPU tensor: only the dozen
numbers and the sampled values come back to the host, never the tensor. A stored tensor (a full capture, a dump)
gets the same summary from its values read back, so either side of a pair may be a summary.

- A CPU tensor's content hash is the BLAKE3 digest ingest gives a stored tensor ("blake3:<hex>", over a header
  naming dtype and shape, then the bytes), computed on the host where the tensor already is.
- Another device's ("fold64:<hex>") reads the bytes as little-endian 64-bit words (the last one padded with zeros),
  mixes each with its index (multiply, xor-shift; int64 arithmetic, which wraps the same on every device) and adds
  them up; blake2b of the dtype, the shape, the byte count and that sum is the hash. Equal tensors hash equal; a
  tensor differing in one word always hashes differently; in more, by chance with probability about 2^-64.
- count, sum, sum of squares, min and max are over the finite values, in float64; NaN and Inf are counted.
- The sample: the values at `sample_positions(numel)` (float64; complex tensors: their magnitudes, as ingest's
  statistics).
Work goes `CHUNK` elements at a time, so the float64 temporaries stay bounded on the device.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tensor_debugger.engine.summary_compare import Sketch, SketchVerdict, compare_sketches, sample_positions
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.store.dtypes import parse_dtype

if TYPE_CHECKING:
    import numpy as np
    import torch

    from tensor_debugger.store.arrays import ArrayStore
    from tensor_debugger.store.models import TensorRecord

CHUNK = 1 << 22  # elements (and words) per step
# A summary's BLAKE3 runs on the thread that asks for it. Hashing on blake3's own threads as well was 5x slower
# per byte inside a CPU forward pass (torch's threads, between its kernels, hold the cores), and no faster alone
# on 2 cores: bench/RESULTS.md, 2026-11-27.
HASH_THREADS = 1
_K1 = 0x1F3D5B79A3C1E2F7  # odd 64-bit constants, below 2^63 so that they are int64s
_K2 = 0x2545F4914F6CDD1D
_K3 = 0x3C6EF372FE94F82B
_MASK = (1 << 64) - 1


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def content_hash(tensor: torch.Tensor) -> str:
    """ "fold64:<hex>" of the tensor's dtype, shape and bytes (see the module docstring)."""
    import torch

    t = tensor.detach().contiguous().reshape(-1)
    data = t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8, device=t.device)
    if data.storage_offset() % 8:
        data = data.clone()
    nbytes = data.numel()
    whole = nbytes // 8 * 8
    total = torch.zeros((), dtype=torch.int64, device=data.device)
    words = data[:whole].view(torch.int64)
    for start in range(0, words.numel(), CHUNK):
        total += _mixed(words[start : start + CHUNK], start)
    if whole < nbytes:
        tail = torch.zeros(8, dtype=torch.uint8, device=data.device)
        tail[: nbytes - whole] = data[whole:]
        total += _mixed(tail.view(torch.int64), whole // 8)
    folded = int(total.item()) & _MASK
    header = f"{dtype_name(tensor.dtype)}|{list(tensor.shape)}|{nbytes}|{folded:016x}".encode()
    return "fold64:" + hashlib.blake2b(header, digest_size=16).hexdigest()


def _mixed(words: torch.Tensor, first: int) -> torch.Tensor:
    import torch

    index = torch.arange(first + 1, first + 1 + words.numel(), dtype=torch.int64, device=words.device)
    x = words * _K1 + index * _K2
    x ^= x >> 31
    x *= _K3
    x ^= x >> 29
    return x.sum()


def sketch(tensor: torch.Tensor, hash_kind: str | None = None) -> Sketch:
    """The summary of `tensor` (see the module docstring), computed where it lives. A CPU tensor's is computed by
    ingest's compiled passes, its hash the BLAKE3 digest ingest gives its bytes (`writer.new_hasher`), unless
    `hash_kind` is "fold64" (the hash of another device's summary, to compare with)."""
    import torch

    t = tensor.detach()
    kind = hash_kind or ("blake3" if t.device.type == "cpu" else "fold64")
    if t.device.type == "cpu" and not t.is_complex() and t.dtype != torch.bool:
        return _host_sketch(t, kind)
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


def _blake3_of(array: np.ndarray, t: torch.Tensor) -> str:
    """`_blake3(t)` where `array` is `torch_to_storage(t)`, already made."""
    from tensor_debugger.ingest.writer import DIGEST_ALGORITHM, new_hasher
    from tensor_debugger.store.dtypes import from_torch

    hasher = new_hasher(from_torch(t.dtype), tuple(t.shape), HASH_THREADS)
    hasher.update(array.reshape(-1).view("uint8") if array.size else b"")
    return f"{DIGEST_ALGORITHM}:{hasher.hexdigest()}"


def _host_sketch(t: torch.Tensor, kind: str) -> Sketch:
    """A CPU tensor's summary through ingest's compiled summary pass (one pass, no float64 copy); sum and sum of
    squares from its count, mean and sum of squared deviations. A tensor that is not contiguous is copied once,
    and its copy is what the hash, the statistics and the sample read."""
    import torch

    from tensor_debugger.ingest.summary import SummaryAccumulator
    from tensor_debugger.store.dtypes import from_torch, torch_to_storage

    t = _contiguous(t)
    logical = from_torch(t.dtype)
    array = torch_to_storage(t)  # shares `t`'s memory: no second copy
    totals = SummaryAccumulator()
    if array.size:
        totals.add_stored(array.reshape(-1), logical)
    count, mean = totals.count, totals.mean
    flat = t.reshape(-1)
    index = _sample_index(flat.numel())
    values = flat[index].to(torch.float64).tolist() if index is not None else []
    return Sketch(
        tuple(t.shape),
        dtype_name(t.dtype),
        content_hash(t) if kind == "fold64" else _blake3_of(array, t),
        flat.numel(),
        count,
        mean * count if count else 0.0,
        totals.m2 + count * mean * mean if count else 0.0,
        float(totals.lo) if count else None,
        float(totals.hi) if count else None,
        totals.nan,
        totals.inf,
        tuple(values),
    )


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    """`t` itself where it is contiguous, else a C-order copy of its bits made by numpy on this thread: torch's
    copy spreads a strided tensor over its threads, which on a busy machine wait for each other (a 5 MB transposed
    tensor took 5 to 12 ms that way, 1 ms on one thread)."""
    import numpy as np
    import torch

    if t.is_contiguous():
        return t
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return torch.from_numpy(np.ascontiguousarray(t.view(bits).numpy())).view(t.dtype)


@functools.lru_cache(maxsize=256)
def _sample_index(numel: int) -> torch.Tensor | None:
    """`sample_positions(numel)` as a CPU index tensor (None where there are none), made once per size."""
    import torch

    positions = sample_positions(numel)
    return torch.tensor(positions, dtype=torch.int64) if positions else None


def record_sketch(store: ArrayStore, record: TensorRecord, hash_kind: str | None = None) -> Sketch | None:
    """A stored tensor's summary: the one a summary capture kept, else computed from its values (its hash of
    `hash_kind`, "blake3" or "fold64": the other side's, to compare with); None for a tensor with neither (a trace
    written with use_repr=True)."""
    if record.sketch is not None:
        return Sketch.from_json(record.sketch)
    if not record.has_values:
        return None
    return sketch(store.read_whole(record.store_key, parse_dtype(record.dtype)), hash_kind or "blake3")


def sketch_verdict(
    store: ArrayStore, a: Sequence[TensorRecord], b: Sequence[TensorRecord], tolerance: Tolerance
) -> SketchVerdict | None:
    """The verdict on a pair of one tensor a side where a side is known by its summary alone (`compare_sketches`,
    against the other side's summary, kept or computed from its values); None where neither side has a summary or a
    side is sharded."""
    if len(a) != 1 or len(b) != 1 or (a[0].sketch is None and b[0].sketch is None):
        return None
    kept = a[0].sketch or b[0].sketch or {}
    kind = str(kept.get("hash", "blake3:")).partition(":")[0]
    left, right = record_sketch(store, a[0], kind), record_sketch(store, b[0], kind)
    if left is None or right is None:
        return None
    return compare_sketches(left, right, tolerance)
