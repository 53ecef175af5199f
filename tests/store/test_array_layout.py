"""zarr.json read by the spec (array_layout.py) against arrays that Zarr itself wrote: the chunk reader must read
back exactly what Zarr reads, for every layout it claims, and refuse the layouts it does not read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from tensor_debugger.store.chunk_reader import ChunkReader, ReadCounter
from tensor_debugger.store.layout import parse_layout, read_layout
from zarr.codecs import BloscCodec, BytesCodec, ZstdCodec
from zarr.storage import LocalStore

BLOSC = BloscCodec(cname="lz4", clevel=1, shuffle="bitshuffle")


def _written(folder: Path, values: np.ndarray, chunks: tuple[int, ...], fill: Any, **options: Any) -> zarr.Array[Any]:
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
