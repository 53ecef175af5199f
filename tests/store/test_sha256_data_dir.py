"""A data dir written before BLAKE3 digests and raw chunks keeps working: its tensors' digests are "sha256:<hex>"
and every array is Blosc-compressed. Its runs are reused, read (by the chunk reader and the compiled chunk loop)
and compared to the same statistics as a new data dir's; new ingests of the same files write "blake3:" digests
beside them, and deleting sessions deletes every array.

The old data dir is made in the test rather than checked in: the schema did not change (the digest names its
algorithm, zarr.json its codecs), so the previous version's data dir is this version's with each digest written
the old way (sha256 of the same header and bytes, through SQL) and each array rewritten as the old version wrote
it (Zarr's public API, Blosc lz4 with bit-shuffle). A checked-in copy would be binary files that hide what they
hold and stop matching the schema as migrations are added."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zarr
from tensor_debugger.cli.compare import run_compare
from tensor_debugger.cli.compare_output import compare_request
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.writer import digest_header
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store import catalog
from tensor_debugger.store.dtypes import parse_dtype
from zarr.codecs import BloscCodec

from tests.support.dumps import seeded

OLD_CODEC = BloscCodec(cname="lz4", clevel=1, shuffle="bitshuffle")  # what every array was stored with


def write_dump(folder: Path, seed: int) -> dict[str, torch.Tensor]:
    folder.mkdir(parents=True)
    tensors = {
        f"{layer}_{stage}": seeded((64, 48), seed * 10 + layer * 2 + i)
        for layer in range(2)
        for i, stage in enumerate(("query", "post_mlp"))
    }
    tensors["0_mask"] = torch.zeros(64, 48)  # compressed today too; the rest are noise, stored raw today
    for name, tensor in tensors.items():
        torch.save(tensor, folder / f"{name}.pth")
    return tensors


def rewrite_as_previous_version(data: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Every digest as sha256, every array re-created with the old codec, holding the same values."""
    arrays = data / "arrays"
    with sqlite3.connect(data / "metadata.sqlite3") as conn:
        rows = conn.execute("SELECT id, name, dtype, shape, store_key FROM tensors").fetchall()
        rewritten: set[str] = set()
        for row_id, name, dtype_name, shape, key in rows:
            tensor = tensors[name]
            dtype = parse_dtype(dtype_name)
            old = hashlib.sha256(digest_header(dtype, tuple(json.loads(shape))) + tensor.numpy().tobytes())
            conn.execute("UPDATE tensors SET digest = ? WHERE id = ?", ("sha256:" + old.hexdigest(), row_id))
            if key in rewritten:
                continue
            rewritten.add(key)
            current = zarr.open_array(arrays / key, mode="r")
            values, chunks = np.asarray(current[...]), current.chunks
            zarr.create_array(
                zarr.storage.LocalStore(arrays),
                name=key,
                shape=values.shape,
                dtype=values.dtype,
                chunks=chunks,
                compressors=OLD_CODEC,
                fill_value=np.zeros((), dtype=values.dtype)[()],
                attributes={"logical_dtype": dtype.name},
                overwrite=True,
            )[...] = values
        conn.execute("DELETE FROM comparison_results")  # keyed by the digests it was computed for


def codecs(data: Path, key: str) -> list[str]:
    return [c["name"] for c in json.loads((data / "arrays" / key / "zarr.json").read_text())["codecs"]]


def compare(services: Services, a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert run_compare(services, compare_request(a, b, None, None, None), True) == 0
    payload: dict[str, Any] = json.loads(capsys.readouterr().out)
    return payload


def test_a_sha256_data_dir_keeps_working(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "reference", tmp_path / "candidate"
    tensors = write_dump(a, seed=1)
    write_dump(b, seed=1)  # the same values: every pair passes, with differences of zero

    fresh = open_services(Settings(data_dir=tmp_path / "fresh", demo=False))
    try:
        want = compare(fresh, a, b, capsys)
    finally:
        fresh.close()

    settings = Settings(data_dir=tmp_path / "data", demo=False)
    services = open_services(settings)
    try:
        old_a = services.ingestor.ingest("old", "reference", [InputFile(a, str(a))])
        old_b = services.ingestor.ingest("old", "candidate", [InputFile(b, str(b))])
    finally:
        services.close()
    rewrite_as_previous_version(settings.data_dir, tensors)

    services = open_services(settings)
    try:
        with services.sessions() as db:
            old_rows = [t for run in (old_a, old_b) for t in catalog.list_tensors(db, run.run_id)]
        assert all(t.digest.startswith("sha256:") for t in old_rows)
        assert all(codecs(settings.data_dir, t.store_key) == ["bytes", "blosc"] for t in old_rows)

        reused = compare(services, a, b, capsys)  # the same files: the old runs' rows and arrays, reused
        assert [p["stats"] for p in reused["pairs"]] == [p["stats"] for p in want["pairs"]]
        assert all(p["stats"]["max_abs_diff"] == 0 for p in reused["pairs"])
        with services.sessions() as db:
            runs = catalog.get_session(db, reused["session"]["id"]).runs
            rows = [t for run in runs for t in catalog.list_tensors(db, run.id)]
        assert sorted(t.digest for t in rows) == sorted(t.digest for t in old_rows)

        read_again = services.ingestor.ingest("new", "reference", [InputFile(a, str(a))], reuse=False)
        with services.sessions() as db:
            new_rows = {t.name: t for t in catalog.list_tensors(db, read_again.run_id)}
        assert all(t.digest.startswith("blake3:") for t in new_rows.values())
        assert codecs(settings.data_dir, new_rows["0_query"].store_key) == ["bytes"]  # noise: stored raw
        assert codecs(settings.data_dir, new_rows["0_mask"].store_key) == ["bytes", "blosc"]
        old_keys = {t.store_key for t in old_rows}
        assert not old_keys & {t.store_key for t in new_rows.values()}  # other digests: not shared
        for name, tensor in tensors.items():
            row = new_rows[name]
            assert torch.equal(services.store.read_whole(row.store_key, parse_dtype(row.dtype)), tensor)

        with services.sessions() as db:
            for session in catalog.list_sessions(db):
                catalog.delete_session(db, services.store, session.id)
        runs_folder = settings.data_dir / "arrays" / "runs"
        assert not runs_folder.exists() or not any(p.name.isdigit() for p in runs_folder.iterdir())
    finally:
        services.close()
