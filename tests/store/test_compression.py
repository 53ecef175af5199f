"""Compression chosen per tensor from a sample: tensors the codec hardly shrinks are stored raw, the rest with
Blosc; zarr.json says which, and every reader (Zarr, the ChunkReader, the compiled chunk loop) reads both kinds to
the same values and the same statistics."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zarr
from numpy.typing import NDArray
from sqlalchemy import select
from tensor_debugger.compare.compute.chunk_loop import chunk_pairs, loop_name
from tensor_debugger.engine.metrics import PairStats
from tensor_debugger.engine.streaming import PairJob, compare_stream
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.engine.views import SourceView, View
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.runs import Ingestor
from tensor_debugger.services import Services
from tensor_debugger.store.chunk_reader import ChunkReader
from tensor_debugger.store.compression import RAW_BELOW, worth_compressing
from tensor_debugger.store.dtypes import parse_dtype, storage_to_compute
from tensor_debugger.store.models import TensorRecord


def codecs(services: Services, key: str) -> list[str]:
    folder = Path(services.store.url.removeprefix("file://")) / key
    return [c["name"] for c in json.loads((folder / "zarr.json").read_text())["codecs"]]


def test_the_sample_decides() -> None:
    rng = np.random.default_rng(0)
    assert not worth_compressing(rng.standard_normal(1 << 20).astype(np.float32), "lz4", 1, "bitshuffle")
    assert worth_compressing(np.zeros(1 << 20, dtype=np.float32), "lz4", 1, "bitshuffle")
    assert worth_compressing(np.arange(1 << 20, dtype=np.int64), "lz4", 1, "bitshuffle")
    # a tensor padded with zeros at its start: the sample is spread over the block, not only its first bytes
    padded = rng.standard_normal(1 << 20).astype(np.float32)
    padded[:2048] = 0  # 8 KiB of zeros: the first 32 KiB piece alone would shrink by more than RAW_BELOW
    assert not worth_compressing(padded, "lz4", 1, "bitshuffle")
    assert 0 < RAW_BELOW < 1


def test_ingest_stores_each_tensor_as_its_sample_says(services: Services, tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(1)
    tensors = {
        "noise": torch.randn(300, 257, generator=generator),  # float32 noise: lz4 saves ~9%, stored raw
        "mask": (torch.randn(300, 257, generator=generator) > 0).float(),  # compresses well
        "ids": torch.arange(300 * 257).reshape(300, 257),
        "scalar": torch.tensor(3.5),
    }
    for name, tensor in tensors.items():
        torch.save(tensor, tmp_path / f"{name}.pth")
    ingestor: Ingestor = services.ingestor
    result = ingestor.ingest("compression", "run", [InputFile(tmp_path, "run")])
    with services.sessions() as db:
        rows = {r.name: r for r in db.scalars(select(TensorRecord).where(TensorRecord.run_id == result.run_id))}
    assert codecs(services, rows["noise"].store_key) == ["bytes"]
    assert codecs(services, rows["mask"].store_key) == ["bytes", "blosc"]
    assert codecs(services, rows["ids"].store_key) == ["bytes", "blosc"]
    for name, tensor in tensors.items():
        row = rows[name]
        assert torch.equal(services.store.read_whole(row.store_key, parse_dtype(row.dtype)), tensor), name
        reader = services.store.reader(row.store_key, row.digest)
        if tensor.dim():
            assert isinstance(reader, ChunkReader)
            assert np.array_equal(reader[tuple(slice(None) for _ in tensor.shape)], tensor.numpy())
            array = zarr.open_array(services.store.url.removeprefix("file://") + "/" + row.store_key, mode="r")
            assert np.array_equal(array[...], tensor.numpy())


def stored(services: Services, key: str, values: NDArray[Any], chunks: tuple[int, ...], compressed: bool) -> View:
    dtype = parse_dtype(str(values.dtype))
    services.store.create(key, values.shape, dtype, chunks, compressed)[...] = values
    reader = services.store.reader(key)
    assert isinstance(reader, ChunkReader) and reader.raw == (not compressed)
    return SourceView(reader, partial(storage_to_compute, logical=dtype))


@pytest.mark.parametrize(("a_compressed", "b_compressed"), [(False, False), (True, False), (False, True)])
def test_raw_and_blosc_chunks_compare_the_same(services: Services, a_compressed: bool, b_compressed: bool) -> None:
    """The compiled loop, and the views reading blocks, on raw and Blosc sides: the same statistics as two Blosc
    sides."""
    assert loop_name() == "chunk loop", loop_name()
    rng = np.random.default_rng(4)
    reference = rng.standard_normal((400, 37)).astype(np.float32)
    cand = (reference * (1 + 1e-3 * rng.standard_normal(reference.shape))).astype(np.float32)
    cand[321, 5] += 0.5
    tolerance = Tolerance(1.3e-6, 1e-5)
    results = []
    for n, (ca, cb) in enumerate([(True, True), (a_compressed, b_compressed)]):
        a = stored(services, f"runs/1/{n}", reference, (13, 37), ca)
        b = stored(services, f"runs/2/{n}", cand, (7, 37), cb)
        loop = chunk_pairs(a, b, exact=False)
        assert loop is not None
        with ThreadPoolExecutor(2) as pool:
            for fast in (loop, None):
                ((_, stats),) = compare_stream([PairJob(None, a, b, tolerance, False, fast)], pool)
                assert isinstance(stats, PairStats), stats
                results.append(stats)
    want = results[0]
    for got in results[1:]:
        assert got.max_abs_diff == want.max_abs_diff and got.argmax == want.argmax == (321, 5)
        assert got.mismatched == want.mismatched and got.histogram == want.histogram
        assert math.isclose(got.mse, want.mse, rel_tol=1e-12)


def test_a_raw_chunk_of_the_wrong_length_is_an_error_naming_it(services: Services) -> None:
    values = np.arange(64, dtype=np.float32).reshape(8, 8)
    view = stored(services, "runs/1/0", values, (2, 8), compressed=False)
    assert isinstance(view, SourceView)
    chunk = Path(services.store.url.removeprefix("file://")) / "runs/1/0/c.1.0"
    chunk.write_bytes(chunk.read_bytes()[:-4])
    reader = services.store.reader("runs/1/0")
    with pytest.raises(ValueError, match=r"c\.1\.0 is not one raw chunk"):
        reader[slice(0, 8), slice(0, 8)]
