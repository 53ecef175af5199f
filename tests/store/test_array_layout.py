"""zarr.json read by the spec (array_layout.py) against arrays that Zarr itself wrote: the chunk reader must read
back exactly what Zarr reads, for every layout it claims, and refuse the layouts it does not read."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from numpy.typing import NDArray
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.chunk_reader import ChunkReader, ReadCounter
from tensor_debugger.store.chunk_writer import ChunkWriter
from tensor_debugger.store.dtypes import all_dtypes, parse_dtype
from tensor_debugger.store.layout import parse_layout, read_layout
from zarr.codecs import BloscCodec, BytesCodec, ZstdCodec
from zarr.storage import LocalStore

BLOSC = BloscCodec(cname="lz4", clevel=1, shuffle="bitshuffle")


def _written(folder: Path, values: NDArray[Any], chunks: tuple[int, ...], fill: Any, **options: Any) -> zarr.Array[Any]:
    array = zarr.create_array(
        LocalStore(folder),
        name="a",
        shape=values.shape,
        dtype=values.dtype,
        chunks=chunks,
        compressors=options.pop("compressors", BLOSC),
        fill_value=fill,
        **options,
    )
    array[...] = values
    return array


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int8", "uint16", "int64", "bool", "complex64"])
@pytest.mark.parametrize("keys", [None, {"name": "v2", "separator": "."}, {"name": "default", "separator": "."}])
def test_reader_reads_what_zarr_reads(tmp_path: Path, dtype: str, keys: dict[str, str] | None) -> None:
    rng = np.random.default_rng(3)
    values = (rng.standard_normal((5, 7, 3)) * 50).astype(dtype)
    options = {} if keys is None else {"chunk_key_encoding": keys}
    array = _written(tmp_path, values, (2, 3, 3), np.zeros((), dtype)[()], **options)
    layout = read_layout(tmp_path / "a", "a")
    assert layout.readable and layout.shape == (5, 7, 3) and layout.chunks == (2, 3, 3)
    assert layout.dtype == np.dtype(dtype)
    reader = ChunkReader(layout, tmp_path / "a", ReadCounter(), lambda: array)
    np.testing.assert_array_equal(reader[(slice(None),) * 3], array[...])
    np.testing.assert_array_equal(reader[(slice(1, 4), slice(2, 7), slice(0, 2))], array[1:4, 2:7, 0:2])


@pytest.mark.parametrize("fill", [np.nan, np.inf, -np.inf, 7.5, 0.0])
def test_fill_values_of_chunks_never_written(tmp_path: Path, fill: float) -> None:
    array = zarr.create_array(
        LocalStore(tmp_path), name="a", shape=(6, 4), dtype="float32", chunks=(2, 4), compressors=BLOSC, fill_value=fill
    )
    array[0:2] = np.ones((2, 4), dtype=np.float32)  # the other chunks are never written
    layout = read_layout(tmp_path / "a", "a")
    reader = ChunkReader(layout, tmp_path / "a", ReadCounter(), lambda: array)
    np.testing.assert_array_equal(reader[(slice(None), slice(None))], array[...])


def test_layouts_read_through_zarr_instead(tmp_path: Path) -> None:
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    zstd = _written(tmp_path / "zstd", values, (1, 4), 0.0, compressors=ZstdCodec())
    big = _written(tmp_path / "big", values, (1, 4), 0.0, serializer=BytesCodec(endian="big"))
    scalar = zarr.create_array(
        LocalStore(tmp_path / "scalar"), name="a", shape=(), dtype="float32", compressors=BLOSC, fill_value=0.0
    )
    for array, folder in ((zstd, "zstd"), (big, "big"), (scalar, "scalar")):
        assert array is not None
        assert not read_layout(tmp_path / folder / "a", "a").readable


def test_broken_metadata_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no array 'runs/1/0'"):
        read_layout(tmp_path, "runs/1/0")
    (tmp_path / "zarr.json").write_text("{not json")
    with pytest.raises(ValueError, match="not readable JSON"):
        read_layout(tmp_path, "runs/1/0")
    (tmp_path / "zarr.json").write_text('{"zarr_format": 2}')
    with pytest.raises(ValueError, match="not Zarr v3 array metadata"):
        read_layout(tmp_path, "runs/1/0")


def test_chunk_keys_follow_the_encoding() -> None:
    base = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [4, 4],
        "data_type": "float32",
        "fill_value": 0,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2]}},
        "codecs": [],
    }
    assert parse_layout(base).chunk_key((1, 0)) == "c/1/0"
    v2 = parse_layout({**base, "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "."}}})
    assert v2.chunk_key((1, 0)) == "1.0" and v2.chunk_key(()) == "0"
    assert np.isnan(parse_layout({**base, "fill_value": "0x7fc00000"}).fill_value)
    assert parse_layout({**base, "fill_value": "-Infinity"}).fill_value == -np.inf


@pytest.mark.parametrize("compressed", [True, False])
def test_writer_writes_the_metadata_zarr_writes(tmp_path: Path, compressed: bool) -> None:
    """`ArrayStore.writer` writes a new array's zarr.json itself: the same document, and the same group documents
    above it, as Zarr's `create_array` writes for every dtype; 0-d arrays are still made by Zarr."""
    store = ArrayStore(f"file://{tmp_path}")
    for n, dtype in enumerate(all_dtypes()):
        shape, chunks = (9, 4, 3), (2, 4, 3)
        store.create(f"by_zarr/{n}/{dtype.name}", shape, dtype, chunks, compressed)
        writer = store.writer(f"ours/{n}/{dtype.name}", shape, dtype, chunks, compressed)
        assert isinstance(writer, ChunkWriter)
        theirs = json.loads((tmp_path / f"by_zarr/{n}/{dtype.name}/zarr.json").read_bytes())
        ours = json.loads((tmp_path / f"ours/{n}/{dtype.name}/zarr.json").read_bytes())
        assert ours == theirs, dtype.name
        for level in (f"{n}", ""):
            assert json.loads((tmp_path / "ours" / level / "zarr.json").read_bytes()) == json.loads(
                (tmp_path / "by_zarr" / level / "zarr.json").read_bytes()
            )
        values = np.arange(math.prod(shape)).astype(dtype.numpy_storage).reshape(shape)
        writer[tuple(slice(0, d) for d in shape)] = values
        assert np.asarray(zarr.open_array(LocalStore(tmp_path), path=f"ours/{n}/{dtype.name}")[...]).tobytes() == (
            values.tobytes()
        )
    assert json.loads((tmp_path / "zarr.json").read_bytes())["node_type"] == "group"
    scalar = store.writer("ours/scalar", (), all_dtypes()[0], (), compressed)
    assert isinstance(scalar, zarr.Array)  # Zarr's own


def test_a_new_array_replaces_what_its_key_held(tmp_path: Path) -> None:
    """As Zarr's overwrite: an array written again at a key (a run id reused after a crash) keeps nothing of the
    old one, whose chunks there were more of; `delete` removes a folder's arrays without Zarr."""
    store = ArrayStore(f"file://{tmp_path}")
    float32 = parse_dtype("float32")
    old = store.writer("runs/1/0", (8, 2), float32, (1, 2), compressed=True)
    old[(slice(0, 8), slice(0, 2))] = np.ones((8, 2), dtype=np.float32)
    new = store.writer("runs/1/0", (2, 2), float32, (1, 2), compressed=False)
    new[(slice(0, 2), slice(0, 2))] = np.full((2, 2), 7, dtype=np.float32)
    chunks = sorted(p.name for p in (tmp_path / "runs/1/0").iterdir() if p.name != "zarr.json")
    assert chunks == ["c.0.0", "c.1.0"]  # "c.0.0": no folder per chunk (layout.CHUNK_SEPARATOR)
    assert np.asarray(store.reader("runs/1/0")[0:2, 0:2]).tolist() == [[7, 7], [7, 7]]
    store.delete("runs/1")
    store.delete("runs/404")  # nothing there: nothing to do
    assert not (tmp_path / "runs/1").exists() and store.children("runs") == ["zarr.json"]
    store.writer("runs/1/0", (2, 2), float32, (1, 2), compressed=False)
    assert (tmp_path / "runs/1/zarr.json").exists()  # the group above it, written again
