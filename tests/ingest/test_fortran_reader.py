"""A compressed Fortran-order .npy, decompressed to disk, is read block by block in C order (ingest/block_readers.py's
FortranReader): by positioned reads where the runs along the first axis are long, through a mapping where short;
every region gives what numpy gives, and an ingest of one stores its values."""

from __future__ import annotations

import zipfile
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
from tensor_debugger.ingest.block_readers import FortranReader
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services

from tests.support.stored import read_back, stored


@pytest.mark.parametrize(
    "shape", [(7, 5), (3000, 7), (1, 9), (2, 3, 4), (1500, 3, 5), (5000, 2, 3, 2), (4, 0, 3)], ids=str
)
def test_every_region_reads_as_numpy_reads_it(tmp_path: Path, shape: tuple[int, ...]) -> None:
    values = np.asfortranarray(np.random.default_rng(0).standard_normal(shape).astype(">f4"))
    raw = tmp_path / "values.raw"
    raw.write_bytes(values.tobytes(order="F"))
    with ExitStack() as stack:
        reader = FortranReader(raw, shape, values.dtype, stack)
        regions = [(), tuple(slice(0, n) for n in shape), tuple(slice(n // 3, n - n // 4) for n in shape)]
        regions.append((slice(1, 2),) if shape[0] > 1 else (slice(0, 1),))
        for region in regions:
            block = reader.read(region)
            assert block.flags["C_CONTIGUOUS"]
            assert np.array_equal(block, values[region]), region


def test_a_compressed_fortran_npy_is_ingested_exactly(services: Services, tmp_path: Path) -> None:
    values = np.asfortranarray(np.arange(3000 * 7, dtype=np.float32).reshape(3000, 7))
    np.save(tmp_path / "0_f.npy", values)
    archive = tmp_path / "f.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        z.write(tmp_path / "0_f.npy", "0_f.npy")
    result = services.ingestor.ingest("fortran", "ref", [InputFile(archive, archive.name)])
    [record] = stored(services, result.run_id).values()
    assert np.array_equal(read_back(services, record).numpy(), values)
    assert list((services.settings.staging_dir).iterdir()) == []  # the decompressed copy is gone
