"""Arrays that Zarr reads (a 0-d tensor, which the chunk reader leaves to it): a chunk missing from one written with
every chunk is an error naming it, not the fill value; from one stored before the marker, the fill value."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.chunk_reader import ChunkReader
from tensor_debugger.store.dtypes import parse_dtype
from tensor_debugger.store.layout import EVERY_CHUNK_WRITTEN, MissingChunkError


@pytest.mark.parametrize("marked", [True, False], ids=["written-whole", "before-the-marker"])
def test_a_zero_d_array_read_through_zarr(tmp_path: Path, marked: bool) -> None:
    writing = ArrayStore(f"file://{tmp_path}")
    array = writing.create("runs/1/0", (), parse_dtype("float32"), ())
    array[...] = np.float32(3.0)
    if not marked:
        del array.attrs[EVERY_CHUNK_WRITTEN]
    (tmp_path / "runs/1/0/c").unlink()
    reader = ArrayStore(f"file://{tmp_path}").reader("runs/1/0")  # another process's store, as a compare opens it
    assert not isinstance(reader, ChunkReader)
    if marked:
        with pytest.raises(MissingChunkError, match=f"the stored chunk file {tmp_path}/runs/1/0/c is missing"):
            np.asarray(reader[()])
    else:
        assert float(np.asarray(reader[()])) == 0.0  # the fill value, as before the marker
