"""The compiled chunk loop (chunk_pairs): a pair compared straight from its chunk files gives what reading the same
blocks into arrays gives, on real Zarr stores on disk, and hands every block it cannot finish back to the views."""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import obstore
import pytest
from numcodecs import Blosc
from numpy.typing import NDArray
from tensor_debugger.compare.compute.chunk_loop import ChunkPairs, chunk_pairs, loop_name, read_chunks
from tensor_debugger.engine import streaming
from tensor_debugger.engine.alignment import align
from tensor_debugger.engine.chunking import Region
from tensor_debugger.engine.fused import FusedPartial, Kernel, configure, default_kernel
from tensor_debugger.engine.metrics import PairStats
from tensor_debugger.engine.streaming import PairJob, compare_stream
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.engine.views import SourceView, View, build_view
from tensor_debugger.services import Services
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.chunk_reader import ChunkReader
from tensor_debugger.store.dtypes import parse_dtype, storage_to_compute
from tensor_debugger.store.layout import EVERY_CHUNK_WRITTEN, MissingChunkError, read_layout
from tensor_debugger.store.object_chunks import ObjectChunkReader

from tests.support.s3 import SeaweedS3

TOLERANCE = Tolerance(1.3e-6, 1e-5)
EXACT_FIELDS = (
    "numel",
    "max_abs_diff",
    "argmax",
    "max_rel_diff",
    "mismatched",
    "histogram",
    "nan_a",
    "nan_b",
    "inf_a",
    "inf_b",
    "nan_one_side",
)
SUMMED_FIELDS = ("mean_abs_diff", "mean_rel_diff", "mse", "rmse", "cosine", "snr_db")


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[ThreadPoolExecutor]:
    """Two threads, and blocks small enough that every pair here has several, with edges inside chunks."""
    assert loop_name() == "chunk loop", loop_name()
    monkeypatch.setattr(streaming, "BLOCK_BYTES", 8 * 1000)
    monkeypatch.setattr(streaming, "REDUCED_BLOCK_BYTES", 8 * 1700)
    with ThreadPoolExecutor(2) as executor:
        yield executor


def stored(
    services: Services | ArrayStore,
    key: str,
    values: NDArray[Any],
    dtype_name: str,
    chunks: tuple[int, ...],
    compressed: bool = True,
    marked: bool = True,
) -> View:
    """`values` stored at `key` as `dtype_name` (bfloat16 as its raw bits; Blosc-compressed chunks, or raw ones) and
    read back as a comparison reads it; not `marked`: its zarr.json without the marker that every chunk was written,
    as arrays stored before the marker are (a chunk missing there is the fill value)."""
    store = services if isinstance(services, ArrayStore) else services.store
    dtype = parse_dtype(dtype_name)
    if dtype_name == "bfloat16":
        storage = (np.asarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    else:
        storage = np.asarray(values, dtype=dtype.numpy_storage)
    array = store.create(key, values.shape, dtype, chunks, compressed)
    array[...] = storage
    if not marked:
        del array.attrs[EVERY_CHUNK_WRITTEN]
    reader = store.reader(key)
    assert isinstance(reader, ChunkReader)
    return SourceView(reader, partial(storage_to_compute, logical=dtype))


def compare(a: View, b: View, pool: ThreadPoolExecutor, loop: ChunkPairs | None) -> tuple[PairStats, int]:
    """The pair's statistics through the loop (or, with None, by reading blocks into arrays), and how many blocks
    the loop finished (a block with a NaN or an Inf it reads, but leaves to the views)."""
    finished = 0

    def counted(region: Region, tolerance: Tolerance) -> FusedPartial | None:
        nonlocal finished
        assert loop is not None
        part = loop(region, tolerance)
        finished += part is not None and math.isfinite(part.norm_a) and math.isfinite(part.norm_b)
        return part

    ((_, result),) = compare_stream([PairJob(None, a, b, TOLERANCE, False, counted if loop else None)], pool)
    assert isinstance(result, PairStats), result
    return result, finished


def assert_same(got: PairStats, want: PairStats) -> None:
    for field in EXACT_FIELDS:
        mine, theirs = getattr(got, field), getattr(want, field)
        assert mine == theirs or (isinstance(mine, float) and math.isnan(mine) and math.isnan(theirs)), field
    for field in SUMMED_FIELDS:  # sums may differ in the last bits: another order
        assert getattr(got, field) == pytest.approx(getattr(want, field), rel=1e-12, nan_ok=True), field


def candidate(reference: NDArray[Any], rng: np.random.Generator) -> NDArray[Any]:
    values: NDArray[Any] = reference * (1 + 1e-3 * rng.standard_normal(reference.shape)) + 1e-7 * rng.standard_normal(
        reference.shape
    )
    values.reshape(-1)[values.size * 2 // 3] += 0.5  # the largest difference, planted
    return values


@pytest.mark.parametrize(
    ("dtype_a", "dtype_b"),
    [
        ("float32", "float32"),
        ("float64", "float32"),
        ("float32", "float64"),
        ("bfloat16", "bfloat16"),
        ("float16", "float16"),
        ("float32", "bfloat16"),
        ("float64", "float16"),
    ],
)
@pytest.mark.parametrize(
    ("shape", "chunks_a", "chunks_b"),
    [((300, 37), (7, 37), (11, 37)), ((5, 6, 70), (1, 4, 70), (1, 6, 70)), ((4999,), (640,), (4999,))],
)
def test_the_loop_gives_what_reading_blocks_gives(
    services: Services,
    pool: ThreadPoolExecutor,
    dtype_a: str,
    dtype_b: str,
    shape: tuple[int, ...],
    chunks_a: tuple[int, ...],
    chunks_b: tuple[int, ...],
) -> None:
    """Every dtype the loop widens, mixed; chunks of different sizes on each side, padded edge chunks, chunks that
    stop short of a dimension (5, 6, 70 in chunks of 1, 4, 70), and blocks whose edges fall inside chunks."""
    rng = np.random.default_rng(3)
    reference = rng.standard_normal(shape) * np.logspace(-3, 1, shape[-1])
    reference.reshape(-1)[17] = 0.0  # a zero reference: relative differences skip it
    a = stored(services, "runs/1/0", reference, dtype_a, chunks_a)
    b = stored(services, "runs/2/0", candidate(reference, rng), dtype_b, chunks_b)
    loop = chunk_pairs(a, b, exact=False)
    assert loop is not None
    before = services.store.chunk_reads
    got, finished = compare(a, b, pool, loop)
    assert finished == math.ceil(math.prod(shape) / 1700)  # every block, none read into arrays
    assert services.store.chunk_reads > before  # the loop counts what it reads, as the reader does
    want, _ = compare(a, b, pool, None)
    assert_same(got, want)
    assert got.argmax == tuple(int(i) for i in np.unravel_index(math.prod(shape) * 2 // 3, shape))


def test_alignments_that_keep_c_order_use_the_loop(services: Services, pool: ThreadPoolExecutor) -> None:
    """Size-1 dimensions dropped, one run's extra rows truncated, flattening: the same values in the same order,
    so the loop reads them; a permutation reorders them, so it does not."""
    rng = np.random.default_rng(5)
    reference = rng.standard_normal((4, 30, 64))
    cases = [
        (reference.reshape(1, 120, 64), reference.reshape(120, 64), False),  # size-1 dimension dropped
        (np.concatenate([reference.reshape(120, 64), reference[0, :10]]), reference.reshape(120, 64), False),
        (reference.reshape(120, 64), reference.reshape(8, 15, 64), False),  # flattened, the last resort
        (reference, reference.transpose(1, 0, 2), True),
    ]  # heads permuted
    for n, (a_values, b_values, permuted) in enumerate(cases):
        alignment = align([a_values.shape], [b_values.shape])
        assert alignment is not None, (a_values.shape, b_values.shape)
        a = build_view(
            [stored(services, f"runs/1/{n}", a_values, "float32", (1, *a_values.shape[1:]))], alignment.side_steps("a")
        )
        b = build_view(
            [stored(services, f"runs/2/{n}", candidate(b_values, rng), "float32", (1, *b_values.shape[1:]))],
            alignment.side_steps("b"),
        )
        loop = chunk_pairs(a, b, exact=False)
        assert (loop is None) == permuted, alignment.words()
        got, finished = compare(a, b, pool, loop)
        assert finished == (0 if permuted else math.ceil(reference.size / 1700)), alignment.words()
        assert_same(got, compare(a, b, pool, None)[0])


def test_no_loop_for_exact_comparisons_other_dtypes_or_when_turned_off(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = np.arange(64.0).reshape(8, 8)
    f32 = stored(services, "runs/1/0", values, "float32", (2, 8))
    assert chunk_pairs(f32, f32, exact=False) is not None
    assert chunk_pairs(f32, f32, exact=True) is None  # integers and bools: the exact path
    ints = stored(services, "runs/1/1", values, "int32", (2, 8))
    assert chunk_pairs(ints, ints, exact=False) is None
    in_memory = SourceView(values.astype(np.float32), lambda v: v)
    assert chunk_pairs(f32, in_memory, exact=False) is None
    for setting in ("blocks", "numpy"):
        configure(kernel=setting)
        assert loop_name() == f"off (TENSOR_DEBUGGER_KERNEL={setting})"
        assert chunk_pairs(f32, f32, exact=False) is None


def test_one_process_compares_a_stored_pair_with_two_kernels_side_by_side(
    services: Services, pool: ThreadPoolExecutor
) -> None:
    """The services' context carries the kernel their settings name; another kernel object beside it computes the
    same stored pair with numpy (no chunk loop), in the same stream, and the statistics agree, with nothing
    process-wide changed."""
    assert services.context.kernel == Kernel(services.settings.kernel, services.settings.kernel_family)
    rng = np.random.default_rng(9)
    reference = rng.standard_normal((300, 37))
    a = stored(services, "runs/1/0", reference, "float32", (7, 37))
    b = stored(services, "runs/2/0", candidate(reference, rng), "float32", (11, 37))
    before = default_kernel()
    compiled, plain = Kernel("compiled"), Kernel("numpy")
    loop = chunk_pairs(a, b, exact=False, kernel=compiled)
    assert loop is not None and chunk_pairs(a, b, exact=False, kernel=plain) is None
    jobs = [
        PairJob("compiled", a, b, TOLERANCE, False, loop, 8, compiled),
        PairJob("numpy", a, b, TOLERANCE, False, None, 8, plain),
    ]
    results = dict(compare_stream(jobs, pool))
    got, want = results["compiled"], results["numpy"]
    assert isinstance(got, PairStats) and isinstance(want, PairStats)
    assert_same(got, want)
    assert got.worst == want.worst and got.mismatched > 0
    assert default_kernel() is before


def chunk_file(services: Services, key: str, coords: str) -> Path:
    """The chunk file at `coords` ("2/0") of the array at `key`, named as its zarr.json's key encoding says."""
    layout = read_layout(Path(services.store.url.removeprefix("file://")) / key, key)
    return Path(services.store.url.removeprefix("file://")) / key / layout.chunk_key(tuple(map(int, coords.split("/"))))


def test_blocks_the_loop_cannot_finish_go_through_the_views(services: Services, pool: ThreadPoolExecutor) -> None:
    """A NaN (which only the views' path counts), a chunk never written in an array from before the marker (the
    fill value) and a broken chunk file (an error that names it): the loop leaves those blocks, and only those, to
    the views."""
    rng = np.random.default_rng(9)
    reference = rng.standard_normal((200, 30))
    cand = candidate(reference, rng)
    cand[150, 3] = np.nan
    a = stored(services, "runs/1/0", reference, "float32", (10, 30), marked=False)
    b = stored(services, "runs/2/0", cand, "float32", (10, 30))
    chunk_file(services, "runs/1/0", "2/0").unlink()  # rows 20 to 29 of the reference: zeros
    loop = chunk_pairs(a, b, exact=False)
    assert loop is not None
    got, finished = compare(a, b, pool, loop)
    blocks = math.ceil(200 * 30 / 1700)
    assert finished == blocks - 2  # the NaN's block and the missing chunk's
    assert got.nan_b == 1 and got.nan_one_side == 1 and math.isnan(got.max_abs_diff) and got.argmax == (150, 3)
    assert_same(got, compare(a, b, pool, None)[0])


@pytest.mark.parametrize("same", [False, True], ids=["differs", "zeros-both-sides"])
def test_a_chunk_file_deleted_from_an_array_written_whole_is_an_error(
    services: Services, pool: ThreadPoolExecutor, same: bool
) -> None:
    """An array whose writer wrote every chunk: a deleted chunk file is the pair's error naming it, through the
    loop and through the views, never values: not a difference (ones read as zeros) and not a match (zeros on both
    sides, where the fill value would have matched)."""
    reference = np.ones((200, 30)) if not same else np.zeros((200, 30))
    a = stored(services, "runs/1/0", reference, "float32", (10, 30))
    b = stored(services, "runs/2/0", np.zeros((200, 30)), "float32", (10, 30))
    chunk_file(services, "runs/1/0", "2/0").unlink()
    name = f"the stored chunk file {chunk_file(services, 'runs/1/0', '2/0')} is missing: the data dir is damaged"
    for loop in (chunk_pairs(a, b, exact=False), None):
        ((_, error),) = compare_stream([PairJob(None, a, b, TOLERANCE, False, loop)], pool)
        assert isinstance(error, MissingChunkError) and name in str(error), error
    reader = services.store.reader("runs/1/0")
    for region in ((slice(15, 25), slice(0, 30)), (slice(0, 200, 7), slice(0, 30, 3))):  # the pages' slices
        with pytest.raises(MissingChunkError, match="is missing"):
            reader[region]
    assert np.shape(reader[(slice(0, 20, 2), slice(0, 30, 3))]) == (10, 10)  # steps that skip the chunk: values


def test_a_broken_chunk_file_is_named(services: Services, pool: ThreadPoolExecutor) -> None:
    """A chunk file cut short, or with a sound header and a broken table of blocks: the loop stops, and the
    error the views raise names the file."""
    reference = np.linspace(0.0, 1.0, 200 * 300).reshape(200, 300)  # smooth: Blosc compresses it, in blocks
    a = stored(services, "runs/1/0", reference, "float32", (40, 300))
    b = stored(services, "runs/2/0", reference + 1e-3, "float32", (40, 300))
    loop = chunk_pairs(a, b, exact=False)
    assert loop is not None
    broken = chunk_file(services, "runs/2/0", "2/0")
    intact = broken.read_bytes()
    assert not intact[2] & 0x02  # compressed, not stored as it is: the frame has a table of blocks
    broken.write_bytes(intact[:-7])  # cut short
    ((_, error),) = compare_stream([PairJob(None, a, b, TOLERANCE, False, loop)], pool)
    assert isinstance(error, ValueError) and "runs/2/0/c.2.0 is cut short" in str(error), error
    broken.write_bytes(intact[:16] + b"\xff" * 8 + intact[24:])
    ((_, error),) = compare_stream([PairJob(None, a, b, TOLERANCE, False, loop)], pool)
    assert isinstance(error, ValueError) and "runs/2/0/c.2.0 could not be decoded" in str(error), error
    broken.write_bytes(intact)
    assert compare(a, b, pool, loop)[1] == 200 // (1700 // 300)  # every block of 5 rows, once mended


def test_a_nan_stops_the_loop_where_it_is_met(services: Services, pool: ThreadPoolExecutor) -> None:
    """The loop reads no chunk past the first NaN or Inf of a block: the views read that block again anyway."""
    reference = np.random.default_rng(4).standard_normal((100, 17))  # one block of 1700 values
    cand = reference.copy()
    cand[2, 0] = np.inf  # in the first of ten chunks
    a = stored(services, "runs/1/0", reference, "float32", (10, 17))
    b = stored(services, "runs/2/0", cand, "float32", (10, 17))
    loop = chunk_pairs(a, b, exact=False)
    assert loop is not None
    before = services.store.chunk_reads
    assert loop((slice(0, 100), slice(0, 17)), TOLERANCE) is None
    assert services.store.chunk_reads == before  # a block it did not finish counts no reads
    stats, finished = compare(a, b, pool, loop)
    assert finished == 0 and stats.inf_b == 1 and stats.argmax == (2, 0) and stats.numel == 1700


def test_flat_pieces_cover_any_flat_range(services: Services) -> None:
    """The pieces of a flat range, decoded and cut as the loop cuts them, are that range of the array."""
    rng = np.random.default_rng(13)
    codec = Blosc()
    for n, (shape, chunks) in enumerate(
        [((100, 37), (7, 37)), ((5, 6, 7), (1, 4, 7)), ((1000,), (64,)), ((3, 1, 5), (1, 1, 5))]
    ):
        values = rng.standard_normal(shape).astype(np.float32)
        stored(services, f"runs/1/{n}", values, "float32", chunks)
        reader = services.store.reader(f"runs/1/{n}")
        assert isinstance(reader, ChunkReader)
        flat = values.reshape(-1)
        for _ in range(40):
            start, stop = sorted(int(x) for x in rng.integers(0, flat.size + 1, 2))
            pieces = reader.flat_pieces(start, stop)
            assert pieces is not None
            parts = [
                np.frombuffer(codec.decode(Path(path.decode()).read_bytes()), dtype=np.float32)[skip : skip + count]
                for path, skip, count in pieces
            ]
            got = np.concatenate(parts) if parts else np.empty(0, dtype=np.float32)
            assert got.tobytes() == flat[start:stop].tobytes(), (shape, start, stop)
            if start < stop:
                read_chunks(reader, start, stop)  # the benchmark's read: decodes the same chunks without error
    chunk_file(services, "runs/1/2", "3").unlink()
    with pytest.raises(OSError, match=r"runs/1/2/c\.3: a chunk file is missing"):
        read_chunks(reader_of(services, "runs/1/2"), 0, 1000)
    odd = services.store.create("runs/1/9", (6, 8), parse_dtype("float32"), (2, 4))  # chunks split every row
    odd[...] = np.zeros((6, 8), dtype=np.float32)
    assert reader_of(services, "runs/1/9").flat_pieces(0, 48) is None


def reader_of(services: Services, key: str) -> ChunkReader:
    reader = services.store.reader(key)
    assert isinstance(reader, ChunkReader)
    return reader


@pytest.mark.parametrize("store_url", ["s3"], indirect=True)
@pytest.mark.parametrize(
    ("dtype_a", "dtype_b", "compressed"),
    [("float32", "float32", True), ("float64", "float64", False), ("bfloat16", "bfloat16", True),
     ("float16", "float16", False), ("float32", "bfloat16", False)],
)  # fmt: skip
def test_the_loop_reads_chunk_objects_as_it_reads_chunk_files(
    services: Services, pool: ThreadPoolExecutor, tmp_path: Path, dtype_a: str, dtype_b: str, compressed: bool
) -> None:
    """The same pair stored in a folder and in S3 (a real SeaweedFS): the loop finishes every block from the fetched
    chunk objects, counts as many chunk reads, and gives the same statistics, bit for bit."""
    rng = np.random.default_rng(11)
    reference = rng.standard_normal((300, 37)) * np.logspace(-3, 1, 37)
    cand = candidate(reference, rng)
    folder = ArrayStore((tmp_path / "arrays").as_uri())
    results, reads, readers = [], [], []
    for store in (folder, services.store):
        a = stored(store, "runs/1/0", reference, dtype_a, (7, 37), compressed)
        b = stored(store, "runs/2/0", cand, dtype_b, (11, 37), compressed)
        loop = chunk_pairs(a, b, exact=False)
        assert loop is not None
        before = store.chunk_reads
        got, finished = compare(a, b, pool, loop)
        assert finished == math.ceil(300 * 37 / 1700)  # every block, none read through the views
        results.append(got)
        reads.append(store.chunk_reads - before)
        readers.append((type(loop.a), type(loop.b)))
    assert readers == [(ChunkReader, ChunkReader), (ObjectChunkReader, ObjectChunkReader)]
    assert results[0] == results[1]
    assert reads[0] == reads[1] >= 300 // 7 + 300 // 11


@pytest.mark.parametrize("store_url", ["s3"], indirect=True)
def test_a_deleted_or_broken_chunk_object_is_read_as_a_chunk_file_would_be(
    services: Services, pool: ThreadPoolExecutor, s3: SeaweedS3
) -> None:
    """A chunk object deleted from an array from before the marker: its blocks are read through the views, which
    fill it; from an array written whole: the pair's error names it; one cut short or with a broken table of
    blocks: the error names the object."""
    reference = np.linspace(0.0, 1.0, 200 * 300).reshape(200, 300)  # smooth: Blosc compresses it, in blocks
    a = stored(services, "runs/1/0", reference, "float32", (40, 300), marked=False)
    b = stored(services, "runs/2/0", reference + 1e-3, "float32", (40, 300))
    loop = chunk_pairs(a, b, exact=False)
    assert loop is not None
    bucket = s3.bucket(services.settings.store_url)
    obstore.delete(bucket, "runs/1/0/c/1/0")  # rows 40 to 79 of the reference: zeros
    got, finished = compare(a, b, pool, loop)
    assert finished == 40 - 8  # blocks of 5 rows: those of rows 40 to 79 went through the views
    assert got.max_abs_diff == pytest.approx(float(np.float32(reference[79, -1] + 1e-3)))
    assert_same(got, compare(a, b, pool, None)[0])
    whole = stored(services, "runs/3/0", reference, "float32", (40, 300))
    obstore.delete(bucket, "runs/3/0/c/1/0")
    ((_, error),) = compare_stream(
        [PairJob(None, whole, b, TOLERANCE, False, chunk_pairs(whole, b, exact=False))], pool
    )
    gone = f"the stored chunk object {services.settings.store_url}/runs/3/0/c/1/0 is missing"
    assert isinstance(error, MissingChunkError) and gone in str(error), error
    with pytest.raises(MissingChunkError, match="c/1/0 is missing"):
        services.store.reader("runs/3/0")[(slice(0, 200, 3), slice(0, 300, 5))]  # steps: Zarr reads it
    intact = bytes(obstore.get(bucket, "runs/2/0/c/2/0").bytes())
    name = f"chunk object {services.settings.store_url}/runs/2/0/c/2/0"
    for broken, says in (
        (intact[:-7], "is cut short"),
        (intact[:16] + b"\xff" * 8 + intact[24:], "could not be decoded"),
    ):
        obstore.put(bucket, "runs/2/0/c/2/0", broken)
        # a comparison's readers keep what they fetched (an array never changes after ingest): a new pair's read it
        fresh_b = SourceView(
            services.store.reader("runs/2/0"), partial(storage_to_compute, logical=parse_dtype("float32"))
        )
        fresh = chunk_pairs(a, fresh_b, exact=False)
        ((_, error),) = compare_stream([PairJob(None, a, fresh_b, TOLERANCE, False, fresh)], pool)
        assert isinstance(error, ValueError) and f"{name} {says}" in str(error), error


def test_blocks_whose_squares_leave_float64_are_left_to_the_views_and_zeros_are_not(
    services: Services, pool: ThreadPoolExecutor
) -> None:
    """float64 of ~1e200 (squares overflow) and ~1e-200 (squares underflow): the loop reads those blocks but leaves
    them to the views, which sum them scaled: x against -x is exactly -1. Blocks of zeros, whose sums are exact, the
    loop finishes; the statistics are those of reading every block."""
    rng = np.random.default_rng(12)
    reference = rng.standard_normal((30, 170))
    reference[:10] *= 1e200
    reference[10:20] = 0.0
    reference[20:] *= 1e-200
    a = stored(services, "runs/1/big", reference, "float64", (5, 170))
    b = stored(services, "runs/2/big", -reference, "float64", (3, 170))
    loop = chunk_pairs(a, b, exact=False)
    assert loop is not None
    got, finished = compare(a, b, pool, loop)
    want, _ = compare(a, b, pool, None)
    assert finished == 1  # of three blocks of 1,700 values: the zeros
    assert_same(got, want)
    assert got.cosine == -1.0 and want.cosine == -1.0
