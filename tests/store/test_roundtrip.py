"""Every dtype torch can save, every awkward shape and layout: stored and read back bit for bit."""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tensor_debugger.engine.fused import default_kernel
from tensor_debugger.ingest.block_readers import BufferPool
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.tensor_files import open_tensor_file
from tensor_debugger.ingest.writer import TensorWriter, WritePools
from tensor_debugger.services import Services
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.chunk_reader import ChunkReader
from tensor_debugger.store.chunk_writer import ChunkWriter
from tensor_debugger.store.dtypes import all_dtypes, parse_dtype

from tests.support.dumps import random_bits, seeded
from tests.support.stored import read_back, same_bits, stored

DTYPES = [d.name for d in all_dtypes()]


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_every_dtype_round_trips_bit_exact(services: Services, tmp_path: Path, dtype_name: str) -> None:
    dtype = getattr(torch, dtype_name)
    tensors = {
        "matrix": random_bits((37, 19), dtype, 1),
        "scalar": random_bits((), dtype, 2),
        "empty": random_bits((3, 0, 2), dtype, 3),
        "six_d": random_bits((2, 1, 3, 1, 2, 2), dtype, 4),
    }
    path = tmp_path / f"0_{dtype_name}.pth"
    torch.save(tensors, path)
    result = services.ingestor.ingest("dtypes", "ref", [InputFile(path, path.name)])
    assert result.tensors == 4 and result.problems == []
    records = stored(services, result.run_id)
    for key, original in tensors.items():
        record = records[f"0_{dtype_name}.{key}"]
        assert record.dtype == dtype_name
        assert record.shape == list(original.shape)
        assert same_bits(read_back(services, record), original), key


@pytest.mark.parametrize("suffix", [".pth", ".safetensors", ".npy"])
def test_large_tensor_spans_many_chunks(services: Services, tmp_path: Path, suffix: str) -> None:
    """Many blocks of many chunks, each read into a buffer an earlier block gave back (.safetensors and .npy),
    or a view of the memory-mapped file (.pth): every bit arrives, and the summary covers every value."""
    original = seeded((1100, 1000), seed=5)  # 4.4 MB: five blocks of 16 chunks of 64 KiB, the last one short
    path = tmp_path / f"big{suffix}"
    if suffix == ".pth":
        torch.save(original, path)
    elif suffix == ".safetensors":
        save_file({"big": original}, str(path))
    else:
        np.save(path, original.numpy())
    small_chunks = services.settings.with_overrides(chunk_bytes=64 * 1024)
    from tensor_debugger.ingest.runs import Ingestor

    ingestor = Ingestor(small_chunks, services.sessions, services.store)
    result = ingestor.ingest("chunks", "ref", [InputFile(path, path.name)])
    (record,) = stored(services, result.run_id).values()
    array = services.store.open(record.store_key)
    assert array.chunks == (16, 1000) and record.name.endswith("big")
    assert same_bits(read_back(services, record), original)
    values = original.double().numpy()
    assert record.min == values.min() and record.max == values.max()
    assert record.mean == pytest.approx(values.mean(), rel=1e-12)
    assert record.std == pytest.approx(values.std(), rel=1e-12)


def test_a_file_of_many_tensors_keeps_a_few_buffers(tmp_path: Path) -> None:
    """The readers of one safetensors file share one capped pool: memory stays at a few blocks however many
    tensors the file holds (each tensor kept its own buffers once, and a 5 GB shard needed 5 GB)."""
    path = tmp_path / "many.safetensors"
    save_file({f"t{k}": torch.full((1 << 18,), float(k)) for k in range(40)}, str(path))  # 40 x 1 MiB
    opened = open_tensor_file(path, path.name)
    try:
        for leaf in opened.leaves:
            region = (slice(0, leaf.shape[0]),)
            assert leaf.reader.read(region)[7] == float(leaf.key_path[0][1:])
            leaf.reader.done(region)
        pools = {id(leaf.reader._pool) for leaf in opened.leaves}  # type: ignore[attr-defined]
        assert len(pools) == 1
        assert opened.leaves[0].reader._pool.held <= 4 << 20  # type: ignore[attr-defined]
    finally:
        opened.close()


@pytest.mark.parametrize("beside", [False, True])
def test_a_run_holds_one_read_buffer_more_than_its_blocks_in_flight(tmp_path: Path, beside: bool) -> None:
    """However many blocks its files hold, a run's ingest allocates as many read buffers as the writer keeps blocks
    in flight, and one more being read: with 2 threads, 4 on its own, 3 beside another run's ingest (`compare A B`
    reads both at once). Counted by the pool; the stored values are the file's."""
    chunk_bytes = 64 * 1024  # blocks of 16 chunks: 1 MiB
    files = [tmp_path / f"{k}.pth" for k in range(3)]
    values = [torch.randn(768, 1024, generator=torch.Generator().manual_seed(k)) for k in range(3)]  # 3 blocks each
    for path, tensor in zip(files, values, strict=True):
        torch.save(tensor, path)
    store = ArrayStore((tmp_path / "arrays").as_uri())
    pools = WritePools.open(2, beside=beside)
    buffers = BufferPool(pools.buffers)
    opened = [open_tensor_file(path, path.name, buffers) for path in files]  # sharing the pool, as a run's files do
    try:
        with TensorWriter(store, chunk_bytes, pools, default_kernel()) as writer:
            results = [writer.add(f"t{k}", leaf) for k, file in enumerate(opened) for leaf in file.leaves]
            writer.finish()
    finally:
        pools.close()
        for file in opened:
            file.close()
    assert pools.in_flight == (2 if beside else 3)
    assert buffers.made == pools.in_flight + 1  # 9 blocks of 1 MiB, 4 (3) buffers
    for result, tensor in zip(results, values, strict=True):
        stored_values = store.open(result().store_key)[...]
        assert np.array_equal(stored_values, tensor.numpy())


def test_buffer_pool_lends_the_smallest_fitting_buffer_and_keeps_a_few() -> None:
    pool = BufferPool(keep=2)
    small, large = pool.take(16), pool.take(1000)
    pool.give(large)
    pool.give(small)
    assert pool.take(10) is small  # the smallest that fits
    assert pool.take(500) is large
    assert pool.take(10).size == 10 and pool.held == 0  # none left: a new one
    for size in (100, 200, 300):
        pool.give(np.empty(size, dtype=np.uint8))
    assert pool.held == 500  # the smallest is dropped past `keep`


def test_non_contiguous_and_shared_storage(services: Services, tmp_path: Path) -> None:
    base = seeded((6, 8), seed=3)
    payload = {"base": base, "transposed": base.t(), "strided": base[::2, 1::3], "row": base[4]}
    path = tmp_path / "views.pth"
    torch.save(payload, path)
    result = services.ingestor.ingest("views", "ref", [InputFile(path, path.name)])
    records = stored(services, result.run_id)
    for key, original in payload.items():
        assert same_bits(read_back(services, records[f"views.{key}"]), original), key
    # the digest is of values, not layout: a transposed view equals its contiguous copy
    path2 = tmp_path / "copy.pth"
    torch.save({"transposed": base.t().contiguous()}, path2)
    other = services.ingestor.ingest("views", "copy", [InputFile(path2, path2.name)])
    assert stored(services, other.run_id)["copy.transposed"].digest == records["views.transposed"].digest
    assert records["views.base"].digest != records["views.transposed"].digest


def test_nested_containers_and_python_scalars(services: Services, tmp_path: Path) -> None:
    payload = OrderedDict(
        hidden=seeded((2, 3), 1),
        outputs=(seeded((4,), 2), [7, 2.5, True, None]),
        meta={"step": 3, "inner": {"deep": seeded((1,), 3)}},
    )
    path = tmp_path / "3_post_mlp.pth"
    torch.save(payload, path)
    result = services.ingestor.ingest("nest", "ref", [InputFile(path, path.name)])
    records = stored(services, result.run_id)
    assert sorted(records) == sorted(
        [
            "3_post_mlp.hidden",
            "3_post_mlp.outputs.0",
            "3_post_mlp.outputs.1.0",
            "3_post_mlp.outputs.1.1",
            "3_post_mlp.outputs.1.2",
            "3_post_mlp.meta.step",
            "3_post_mlp.meta.inner.deep",
        ]
    )
    assert records["3_post_mlp.outputs.1.1"].dtype == "float64"
    assert read_back(services, records["3_post_mlp.outputs.1.1"]).item() == 2.5
    assert records["3_post_mlp.outputs.1.0"].dtype == "int64"
    assert records["3_post_mlp.outputs.1.2"].dtype == "bool"
    assert records["3_post_mlp.meta.inner.deep"].key_path == ["meta", "inner", "deep"]
    assert {r.layer for r in records.values()} == {3} and {r.stage for r in records.values()} == {"post_mlp"}


def test_summary_statistics_count_nan_and_inf(services: Services, tmp_path: Path) -> None:
    values = torch.tensor([1.0, float("nan"), -2.0, float("inf"), 4.0, float("-inf"), float("nan")])
    path = tmp_path / "stats.pth"
    torch.save(values, path)
    result = services.ingestor.ingest("stats", "ref", [InputFile(path, path.name)])
    record = stored(services, result.run_id)["stats"]
    assert (record.nan_count, record.inf_count, record.numel) == (2, 2, 7)
    assert (record.min, record.max) == (-2.0, 4.0)
    assert record.mean == pytest.approx(1.0)
    assert record.std == pytest.approx(float(np.std([1.0, -2.0, 4.0])))


@pytest.mark.parametrize("dtype_name", ["float32", "int16", "bool", "complex64", "uint8", "bfloat16"])
def test_chunk_reader_reads_what_zarr_reads(services: Services, dtype_name: str) -> None:
    """Comparisons read through `ChunkReader`: any region, edge chunks included, bit for bit and chunk for chunk."""
    dtype = parse_dtype(dtype_name)
    rng = np.random.default_rng(7)
    store = services.store
    for n, (shape, chunks) in enumerate([((100, 37), (7, 37)), ((5, 6, 7), (1, 4, 7)), ((1000,), (64,))]):
        storage = np.dtype(dtype.numpy_storage)
        raw = rng.integers(0, 256, math.prod(shape) * storage.itemsize, dtype=np.uint8)  # every bit pattern
        values = (raw % 2).astype(bool) if storage == np.bool_ else raw.view(storage)
        array = store.create(f"runs/9/{n}", shape, dtype, chunks)
        array[...] = values.reshape(shape)
        reader = store.reader(f"runs/9/{n}")
        assert isinstance(reader, ChunkReader)
        regions = [tuple(slice(0, d) for d in shape), tuple(slice(0, 0) for _ in shape)]
        for _ in range(60):
            bounds = [sorted(int(x) for x in rng.integers(0, d + 1, 2)) for d in shape]
            regions.append(tuple(slice(lo, hi) for lo, hi in bounds))
        for region in regions:
            before = store.chunk_reads
            got = reader[region]
            reads = store.chunk_reads - before
            want = np.asarray(array[region])
            assert store.chunk_reads - before - reads == reads, region  # as many chunks as Zarr reads
            assert got.dtype == want.dtype and got.shape == want.shape, region
            assert got.tobytes() == want.tobytes(), region
        stepped = tuple(slice(0, d, 2) for d in shape)  # left to Zarr, opened on demand
        assert reader[stepped].tobytes() == np.asarray(array[stepped]).tobytes()
    with pytest.raises(FileNotFoundError, match="runs/9/404"):
        store.reader("runs/9/404", "sha256:0")


@pytest.mark.parametrize("compressed", [True, False])
@pytest.mark.parametrize("dtype_name", ["float32", "int16", "bool", "complex64", "uint8", "bfloat16"])
def test_chunk_writer_writes_what_zarr_writes(services: Services, dtype_name: str, compressed: bool) -> None:
    """Ingest writes through `ChunkWriter`: the same chunk files, byte for byte, as Zarr writes for the same
    values, edge chunks included (raw ones short in their first dimension are extended with zeros by the file's
    end), and Zarr reads them back."""
    dtype = parse_dtype(dtype_name)
    rng = np.random.default_rng(11)
    store = services.store
    root = Path(store.url.removeprefix("file://"))
    for n, (shape, chunks, per_block) in enumerate(
        [((100, 37), (7, 37), 3), ((5, 6, 7), (1, 4, 7), 1), ((1000,), (64,), 5)]
    ):
        storage = np.dtype(dtype.numpy_storage)
        raw = rng.integers(0, 256, math.prod(shape) * storage.itemsize, dtype=np.uint8)
        values = ((raw % 2).astype(bool) if storage == np.bool_ else raw.view(storage)).reshape(shape)
        by_zarr = store.create(f"runs/8/{n}", shape, dtype, chunks, compressed)
        by_zarr[...] = values
        writer = store.writer(f"runs/7/{n}", shape, dtype, chunks, compressed)
        assert isinstance(writer, ChunkWriter)
        axis = next(i for i, c in enumerate(chunks) if c != 1 or i == len(shape) - 1)
        for lead in np.ndindex(*shape[:axis]):
            for start in range(0, shape[axis], chunks[axis] * per_block):  # blocks of chunks, the last one short
                region = tuple(slice(i, i + 1) for i in lead) + (slice(start, start + chunks[axis] * per_block),)
                region += tuple(slice(0, d) for d in shape[axis + 1 :])
                writer[region] = values[region]
        written, expected = (
            sorted(p.relative_to(root / f"runs/{k}/{n}") for p in (root / f"runs/{k}/{n}").rglob("c*") if p.is_file())
            for k in (7, 8)
        )
        assert written == expected and written
        for name in written:
            assert (root / f"runs/7/{n}" / name).read_bytes() == (root / f"runs/8/{n}" / name).read_bytes(), name
        assert same_bits(store.read_whole(f"runs/7/{n}", dtype), store.read_whole(f"runs/8/{n}", dtype))


def test_chunk_writer_refuses_a_region_off_the_chunk_grid(services: Services) -> None:
    writer = services.store.writer("runs/7/0", (10, 4), parse_dtype("float32"), (3, 4))
    assert isinstance(writer, ChunkWriter)
    with pytest.raises(ValueError, match="chunk boundary"):
        writer[(slice(1, 4), slice(0, 4))] = np.zeros((3, 4), dtype=np.float32)
