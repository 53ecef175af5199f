"""Summaries of a tensor held as several stored tensors (the shards or the replicas of ranks), for a pair whose other
side is known by its summary alone (a capture with `values="summary"`).

- Replicas: each rank holds the whole tensor, so each copy's own summary (kept at ingest, `record_sketch`) is
  compared with the other side's, and the pair's verdict is the worst copy's: a replica that differs fails the
  pair and is named.
- Shards concatenated along one dim: a summary is of one whole tensor, so the shards' values are read again, block
  by block as ingest wrote them, into one summary of the merged tensor: the totals (count, NaN, Inf, sum, sum of
  squares, min, max) fold across shards, and the sample is taken at the merged tensor's `sample_positions`, each
  mapped to its shard and read as that shard's block passes. Its hash is of the shards' digests, not of the merged
  bytes, so it equals no single tensor's: such a pair is never called bit-identical, and its verdict says so.
  Shards held only as summaries cannot be merged (each one's sample is at its own positions): no verdict then.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from tensor_debugger.engine.alignment import Step
from tensor_debugger.engine.chunking import iter_blocks
from tensor_debugger.engine.fused import Kernel
from tensor_debugger.engine.summary_compare import Sketch, SketchVerdict, compare_sketches, sample_positions
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.ingest.sketches import record_sketch
from tensor_debugger.ingest.stored_sketches import CHUNKS_PER_BLOCK, sampled_values, sketch_of, stored_layout
from tensor_debugger.ingest.summary import SummaryAccumulator, summarise_stored
from tensor_debugger.store.dtypes import parse_dtype

if TYPE_CHECKING:
    from tensor_debugger.store.arrays import ArrayStore
    from tensor_debugger.store.models import TensorRecord


def split_sketch_verdict(
    store: ArrayStore,
    a: Sequence[TensorRecord],
    b: Sequence[TensorRecord],
    steps: Sequence[Step],
    tolerance: Tolerance,
    kernel: Kernel | None = None,
) -> SketchVerdict | None:
    """The verdict on a pair with one side held as several tensors and the other as one tensor, some side known by
    its summary alone, aligned by `steps` (see the module docstring); None where no summary comparison is sound
    (shards without values, or an alignment other than plain concatenation or replicas)."""
    if (len(a) > 1) == (len(b) > 1):
        return None
    split_side = "a" if len(a) > 1 else "b"
    split, other = (a, b[0]) if split_side == "a" else (b, a[0])
    mine = [s for s in steps if s.side == split_side]
    theirs = [s for s in steps if s.side != split_side]
    who = "reference" if split_side == "a" else "candidate"
    kind = _hash_kind(other)
    if [s.kind for s in mine] == ["stack"] and [s.kind for s in theirs] in ([], ["repeat"]):
        return _replicas_verdict(store, split, other, split_side, who, kind, tolerance, kernel)
    if [s.kind for s in mine] == ["concat"] and not theirs and all(t.has_values for t in split):
        merged = merged_sketch(store, split, mine[0].axis, kernel)
        found = record_sketch(store, other, kind, kernel)
        if merged is None or found is None:
            return None
        left, right = (merged, found) if split_side == "a" else (found, merged)
        verdict = compare_sketches(left, right, tolerance)
        note = (
            f"; the {who} is held as {len(split)} shards (concatenated along dim {mine[0].axis}), summarised "
            "together: bit-identity is not checked"
        )
        return dataclasses.replace(verdict, reason=verdict.reason + note)
    return None


def _hash_kind(record: TensorRecord) -> str:
    """The hash the other side's summary has ("blake3" or "fold64"), which a computed summary matches."""
    kept = record.sketch or {}
    return str(kept.get("hash", "blake3:")).partition(":")[0] or "blake3"


def _replicas_verdict(
    store: ArrayStore,
    copies: Sequence[TensorRecord],
    other: TensorRecord,
    side: str,
    who: str,
    kind: str,
    tolerance: Tolerance,
    kernel: Kernel | None,
) -> SketchVerdict | None:
    """Each copy against `other`: the first that fails, named; else the first's, saying every copy was compared."""
    found = record_sketch(store, other, kind, kernel)
    if found is None:
        return None
    verdicts: list[SketchVerdict] = []
    for copy in copies:
        mine = record_sketch(store, copy, kind, kernel)
        if mine is None:
            return None
        verdicts.append(
            compare_sketches(mine, found, tolerance) if side == "a" else compare_sketches(found, mine, tolerance)
        )
    failing = [rank for rank, v in enumerate(verdicts) if not v.passed]
    if failing:
        rank = failing[0]
        others = f"; {len(failing) - 1} more of the {len(copies)} replicas differ" if len(failing) > 1 else ""
        note = f" (rank {rank}'s replica of the {who}, one of {len(copies)}{others})"
        return dataclasses.replace(verdicts[rank], reason=verdicts[rank].reason + note)
    identical = all(v.identical for v in verdicts)
    note = f" (each of the {who}'s {len(copies)} replicas compared)"
    return dataclasses.replace(verdicts[0], identical=identical, reason=verdicts[0].reason + note)


def merged_sketch(
    store: ArrayStore, shards: Sequence[TensorRecord], axis: int, kernel: Kernel | None = None
) -> Sketch | None:
    """The summary of `shards` (stored tensors of one dtype, in rank order) concatenated along `axis`, read block by
    block (see the module docstring); None where their dtypes or shapes do not concatenate."""
    shapes = [tuple(int(d) for d in s.shape) for s in shards]
    if len({s.dtype for s in shards}) != 1 or not shapes[0] or not 0 <= axis < len(shapes[0]):
        return None
    if any(
        len(s) != len(shapes[0]) or s[:axis] + s[axis + 1 :] != shapes[0][:axis] + shapes[0][axis + 1 :] for s in shapes
    ):
        return None
    logical = parse_dtype(shards[0].dtype)
    kernel = kernel if kernel is not None else Kernel()
    merged = list(shapes[0])
    merged[axis] = sum(s[axis] for s in shapes)
    numel = math.prod(merged)
    positions = np.asarray(sample_positions(numel), dtype=np.int64)
    coords = np.unravel_index(positions, merged) if positions.size else tuple(np.empty(0, np.int64) for _ in merged)
    starts = np.cumsum([0] + [s[axis] for s in shapes])
    owner = np.searchsorted(starts, coords[axis], side="right") - 1
    sample = np.full(positions.size, np.nan, dtype=np.float64)
    taken = np.zeros(positions.size, dtype=bool)
    totals = SummaryAccumulator()
    for rank, (record, shape) in enumerate(zip(shards, shapes, strict=True)):
        slots = np.nonzero(owner == rank)[0]
        local = [c[slots] for c in coords]
        local[axis] = local[axis] - starts[rank]
        flat = np.ravel_multi_index(tuple(local), shape) if slots.size else np.empty(0, np.int64)
        order = np.argsort(flat, kind="stable")
        flat, slots = flat[order], slots[order]
        array = store.open(record.store_key, record.digest)
        try:
            regions = list(iter_blocks(stored_layout(shape, tuple(array.chunks)), CHUNKS_PER_BLOCK))
        except ValueError:  # not chunked as ingest chunks: read whole
            regions = [tuple(slice(0, d) for d in shape)]
        offset = 0
        for region in regions:
            block = np.asarray(array[region if region else ()])
            totals.fold(summarise_stored(block, logical, kernel))
            first, last = np.searchsorted(flat, [offset, offset + block.size])
            if last > first:
                picked = block.reshape(-1)[flat[first:last] - offset]
                sample[slots[first:last]] = sampled_values(picked, logical)
                taken[slots[first:last]] = True
            offset += block.size
    if not taken.all():
        raise ValueError(f"{int((~taken).sum())} sampled elements of {shards[0].name}'s shards were not read")
    identity = hashlib.blake2b(repr((axis, [s.digest for s in shards])).encode(), digest_size=16).hexdigest()
    return sketch_of(tuple(merged), logical.name, f"shards:{identity}", totals, [float(v) for v in sample])
