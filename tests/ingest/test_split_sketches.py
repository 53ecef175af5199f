"""The summary of a tensor held as shards of ranks (`split_sketches.merged_sketch`): the shards, as ingest stored
them, read into the summary the whole tensor would have, so a summary capture of the other side compares with it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tensor_debugger.engine.summary_compare import compare_sketches
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.sketches import sketch
from tensor_debugger.ingest.split_sketches import merged_sketch
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings

from tests.support.dumps import make_zip, seeded
from tests.support.stored import stored


@pytest.mark.parametrize(
    ("dtype", "shape", "axis", "sizes"),
    [
        (torch.float32, (3, 40, 0), 2, (150, 90)),  # hidden split unevenly, as column-parallel outputs are
        (torch.bfloat16, (7, 0, 5), 1, (33, 60, 11)),  # three ranks, along a middle dim
        (torch.float16, (0, 64), 0, (100, 20)),  # along dim 0: the shards' bytes follow each other
        (torch.float32, (2, 0), 1, (50, 70)),  # 240 elements: every one of them sampled
    ],
)
def test_shards_merge_into_the_whole_tensors_summary(
    tmp_path: Path, dtype: torch.dtype, shape: tuple[int, ...], axis: int, sizes: tuple[int, ...]
) -> None:
    full_shape = tuple(sum(sizes) if d == axis else n for d, n in enumerate(shape))
    whole = seeded(full_shape, 3).to(dtype)
    flat = whole.view(-1)
    flat[5], flat[17], flat[-3] = math.nan, math.inf, -math.inf  # counted, not summed
    inputs = []
    for rank, piece in enumerate(torch.split(whole, list(sizes), dim=axis)):
        folder = tmp_path / f"r{rank}"
        folder.mkdir()
        torch.save(piece.clone(), folder / "0_query.pth")
        inputs.append(InputFile(make_zip(folder, tmp_path / f"rank{rank}.zip"), f"rank{rank}.zip"))
    # chunks of 512 bytes: every shard is stored in several blocks, so samples are picked across block edges
    services = open_services(Settings(data_dir=tmp_path / "data", demo=False, chunk_bytes=512))
    try:
        result = services.ingestor.ingest("tp", "ranks", inputs)
        records = stored(services, result.run_id)
        shards = [records[f"rank{rank}/0_query"] for rank in range(len(sizes))]
        merged = merged_sketch(services.store, shards, axis)
    finally:
        services.close()
    expected = sketch(whole)  # the summary a capture of the whole tensor gives
    assert merged is not None
    assert (merged.shape, merged.dtype, merged.numel) == (expected.shape, expected.dtype, expected.numel)
    assert (merged.count, merged.nan, merged.inf, merged.min, merged.max) == (
        expected.count,
        expected.nan,
        expected.inf,
        expected.min,
        expected.max,
    )
    assert merged.sum == pytest.approx(expected.sum, rel=1e-12, abs=1e-9)
    assert merged.sumsq == pytest.approx(expected.sumsq, rel=1e-12)
    assert len(merged.sample) == len(expected.sample)
    assert all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(merged.sample, expected.sample, strict=True))
    assert merged.hash.startswith("shards:") and merged.hash != expected.hash  # never called bit-identical
    tolerance = Tolerance(rtol=1e-6, atol=1e-6)
    same = compare_sketches(expected, merged, tolerance)
    # the NaN is a mismatch (NaN against NaN too, as full values are judged), and nothing else differs
    assert not same.passed and "1 NaN elements: a NaN is a mismatch" in same.reason, same.reason
    assert "norms" not in same.reason and "means" not in same.reason
    assert same.sampled_mismatched == sum(1 for v in expected.sample if math.isnan(v))
    finite = sketch(torch.nan_to_num(whole, nan=0.0, posinf=math.inf, neginf=-math.inf))
    assert compare_sketches(finite, finite, tolerance).passed
    shifted = sketch(torch.where(torch.isfinite(whole), whole + 0.5, whole))
    assert not compare_sketches(shifted, merged, tolerance).passed


def test_shards_that_do_not_concatenate_have_no_merged_summary(tmp_path: Path) -> None:
    inputs = []
    for rank, shape in enumerate(((4, 6), (5, 7))):
        folder = tmp_path / f"r{rank}"
        folder.mkdir()
        torch.save(seeded(shape, rank), folder / "0_query.pth")
        inputs.append(InputFile(make_zip(folder, tmp_path / f"rank{rank}.zip"), f"rank{rank}.zip"))
    services = open_services(Settings(data_dir=tmp_path / "data", demo=False))
    try:
        result = services.ingestor.ingest("tp", "ranks", inputs)
        records = stored(services, result.run_id)
        shards = [records["rank0/0_query"], records["rank1/0_query"]]
        assert merged_sketch(services.store, shards, 1) is None  # dim 0 differs: no tensor is their concatenation
        assert merged_sketch(services.store, shards, 5) is None
    finally:
        services.close()
