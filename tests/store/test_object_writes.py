"""Ingest into S3 (a real SeaweedFS server on loopback, tests/support/s3.py) uploads each block's chunk objects
concurrently (store/object_writes.py): the same bytes as the chunk files of an ingest into a folder, and a refused
upload among them fails the run with nothing of it left."""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import obstore
import torch
from numpy.typing import NDArray
from sqlalchemy import select
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.runs import Ingestor
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.database import create_db_engine, make_sessionmaker
from tensor_debugger.store.layout import ArrayLayout, read_layout
from tensor_debugger.store.models import RunRecord, TensorRecord

from tests.support.cli_main import main_cli
from tests.support.dumps import seeded
from tests.support.s3 import BUCKET, ONE_CHUNK_REFUSED, SeaweedS3
from tests.support.stored import read_back, same_bits, stored

CHUNK_BYTES = 16 * 1024


def _tensors() -> dict[str, torch.Tensor]:
    """Tensors of many chunks each, raw and Blosc-coded, with short and padded edge chunks."""
    return {
        "noise": seeded((650, 1000), seed=11),  # float32 noise, stored raw; its last chunk short of rows
        "coded": (torch.arange(333 * 517) % 97).reshape(333, 517).to(torch.bfloat16),  # compressible, edges
        "ints": torch.arange(100_000, dtype=torch.int64) * 3,
        "mask": seeded((300, 301), seed=5) > 0,
    }


def test_an_ingest_to_s3_stores_the_chunk_files_of_an_ingest_to_a_folder(s3: SeaweedS3, tmp_path: Path) -> None:
    originals = _tensors()
    path = tmp_path / "many.pth"
    torch.save(originals, path)
    arrays: dict[str, dict[str, bytes]] = {}  # store -> chunk key ("c/1/0") -> the bytes stored
    layouts: dict[str, ArrayLayout] = {}  # of the folder's arrays
    for name, url in (("folder", ""), ("s3", s3.new_url())):
        settings = Settings(data_dir=tmp_path / name, store_url=url, demo=False, chunk_bytes=CHUNK_BYTES, workers=2)
        services = open_services(settings, s3.environ if url else {})
        try:
            result = Ingestor(settings, services.sessions, services.store).ingest("s", "ref", [InputFile(path, "m")])
            records = stored(services, result.run_id)
            assert len(records) == len(originals)
            for tensor_name, record in records.items():
                assert same_bits(read_back(services, record), originals[tensor_name.split(".")[-1]])
            if url:
                bucket = s3.bucket(url)
                for record in records.values():
                    keys = [
                        item["path"] for batch in obstore.list(bucket, prefix=f"{record.store_key}/") for item in batch
                    ]
                    chunks = {k.removeprefix(f"{record.store_key}/") for k in keys} - {"zarr.json"}
                    objects = {
                        key: obstore.get(bucket, f"{record.store_key}/{key}").bytes().to_bytes() for key in chunks
                    }
                    arrays[f"s3 {record.name}"] = objects
            else:
                for record in records.values():
                    folder = tmp_path / name / "arrays" / record.store_key
                    layout = read_layout(folder, record.store_key)
                    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "zarr.json"}
                    arrays[f"folder {record.name}"] = {k.replace(".", "/"): v for k, v in files.items()}
                    layouts[record.name] = layout
        finally:
            services.close()
    total = 0
    for tensor_name in stored_names(arrays):
        folder_chunks, s3_chunks = arrays[f"folder {tensor_name}"], arrays[f"s3 {tensor_name}"]
        layout = layouts[tensor_name]
        grid = [range(math.ceil(d / c)) for d, c in zip(layout.shape, layout.chunks, strict=True)]
        every = {"/".join(("c", *map(str, coords))) for coords in itertools.product(*grid)}
        assert set(folder_chunks) == set(s3_chunks) == every, tensor_name  # every chunk written, nothing else
        assert all(folder_chunks[k] == s3_chunks[k] for k in every), tensor_name  # byte for byte
        total += len(every)
    assert total > 150  # many blocks of 16 concurrent uploads
    assert {layout.blosc is None for layout in layouts.values()} == {True, False}  # raw and coded


def stored_names(arrays: dict[str, dict[str, bytes]]) -> list[str]:
    return sorted(key.split(" ", 1)[1] for key in arrays if key.startswith("folder "))


def test_one_refused_upload_among_a_blocks_fails_the_run_with_nothing_of_it_left(s3: SeaweedS3, tmp_path: Path) -> None:
    """The identity may write run 1's first array, but not its chunk row 1: of the 16 chunk objects its one block
    uploads at once, one is refused. The CLI names the file and why, exits 2 without a traceback, keeps the run
    "failed" with no tensor recorded, and every object it had written is deleted, none arriving later (each
    upload of the block had settled before the run was failed)."""
    path = tmp_path / "one.pth"
    original = seeded((16, 4096), seed=2)
    torch.save({"hidden": original}, path)
    url = f"s3://{BUCKET}/{ONE_CHUNK_REFUSED}"
    env = {**s3.read_only_environ, "TENSOR_DEBUGGER_STORE_URL": url, "TENSOR_DEBUGGER_CHUNK_BYTES": "16384"}
    data = tmp_path / "data"
    done = main_cli("--data-dir", str(data), "ingest", "--session", "refused", "--run", "ref", str(path), env=env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    message = f"the array store failed writing the arrays of {path}: access denied"
    assert message in done.stderr and "403 Forbidden" in done.stderr, done.stderr
    assert f"{ONE_CHUNK_REFUSED}/runs/1/0/c/1/0" in done.stderr  # a chunk's upload, the array's zarr.json written
    engine = create_db_engine(f"sqlite:///{data / 'metadata.sqlite3'}")
    try:
        with make_sessionmaker(engine)() as db:
            (run,) = db.scalars(select(RunRecord)).all()
            assert run.id == 1 and run.status == "failed"
            assert [(p.file, p.reason.startswith(message)) for p in run.problems] == [(str(path), True)]
            assert db.scalars(select(TensorRecord)).all() == []
    finally:
        engine.dispose()
    bucket = s3.bucket(url)

    def run_objects() -> list[str]:
        return [item["path"] for batch in obstore.list(bucket, prefix="runs/1/") for item in batch]

    assert run_objects() == []
    time.sleep(1)
    assert run_objects() == []  # no upload of the block was still under way


def test_a_run_of_many_files_stores_each_while_the_next_is_read_and_a_bad_one_among_them_is_its_own_problem(
    s3: SeaweedS3, tmp_path: Path
) -> None:
    """A run of one-tensor files of several blocks each, with a truncated file and a file with no tensors among
    them: the file before is still being written while the next is read (run_copy.py), and still each good tensor
    reads back bit for bit, in S3 as in a folder, the bad files are their own problems, and no array is left but
    the stored tensors' (the truncated file's arrays deleted, its indices taken by the next file)."""
    run = tmp_path / "run"
    run.mkdir()
    originals: dict[str, NDArray[Any]] = {}
    for i in range(6):
        values = np.random.default_rng(i).standard_normal((40 + 7 * i, 1000), dtype=np.float32)
        np.save(run / f"{i}_layer.npy", values)
        originals[f"{i}_layer"] = values
    whole = (run / "3_layer.npy").read_bytes()
    (run / "3_layer.npy").write_bytes(whole[: len(whole) // 2])  # its header promises more than there is
    del originals["3_layer"]
    torch.save({}, run / "4_empty.pth")
    for name, url in (("folder", ""), ("s3", s3.new_url())):
        settings = Settings(data_dir=tmp_path / name, store_url=url, demo=False, chunk_bytes=CHUNK_BYTES, workers=2)
        services = open_services(settings, s3.environ if url else {})
        try:
            result = Ingestor(settings, services.sessions, services.store).ingest("s", "ref", [InputFile(run, "m")])
            records = stored(services, result.run_id)
            assert sorted(records) == sorted(originals), name
            for tensor_name, record in records.items():
                assert same_bits(read_back(services, record), torch.from_numpy(originals[tensor_name])), tensor_name
            with services.sessions() as db:
                problems = {p.file: p.reason for p in db.get_one(RunRecord, result.run_id).problems}
            assert problems == {"m/3_layer.npy": "truncated: 244000 bytes of data expected, 121936 found"} | {
                "m/4_empty.pth": "holds no tensors"
            }, problems
            arrays = sorted(services.store.children(f"runs/{result.run_id}"), key=lambda n: (not n.isdigit(), n))
            assert [a for a in arrays if a.isdigit()] == sorted(r.store_key.rsplit("/", 1)[1] for r in records.values())
        finally:
            services.close()


def test_an_array_made_again_at_a_key_leaves_nothing_of_the_one_before_whoever_made_it(s3: SeaweedS3) -> None:
    """A run's level is listed once per store, then each array made under it is remembered: an array made again at
    a key this store made, or that another store (another process) made before this one listed the level, or one
    made through Zarr, still replaces the one before, no chunk object of it left. (Arrays another process makes at
    a level after this store listed it are not seen: a run's arrays are made by the one ingest that holds it.)"""
    from tensor_debugger.store.arrays import ArrayStore
    from tensor_debugger.store.dtypes import parse_dtype

    url = s3.new_url()
    bucket = s3.bucket(url)
    float32 = parse_dtype("float32")

    def made(store: ArrayStore, key: str, rows: int) -> None:
        writer = store.writer(key, (rows, 64), float32, (4, 64), compressed=False)
        writer[0:rows, 0:64] = np.ones((rows, 64), dtype=np.float32)

    def chunks(key: str) -> set[str]:
        return {item["path"] for batch in obstore.list(bucket, prefix=f"{key}/c/") for item in batch}

    mine, another = ArrayStore(url, s3.environ), ArrayStore(url, s3.environ)
    made(mine, "runs/9/0", 40)  # lists runs/9: nothing there yet
    made(mine, "runs/9/0", 8)  # this store's own, made again
    assert chunks("runs/9/0") == {"runs/9/0/c/0/0", "runs/9/0/c/1/0"}
    made(another, "runs/9/1", 40)  # after `mine` listed runs/9
    made(mine, "runs/9/2", 4)
    made(ArrayStore(url, s3.environ), "runs/9/1", 4)  # a third store: lists runs/9, finds 1
    assert chunks("runs/9/1") == {"runs/9/1/c/0/0"}
    mine.create("runs/9/3", (40, 64), float32, (4, 64), False)[...] = np.ones((40, 64), dtype=np.float32)
    made(mine, "runs/9/3", 4)  # made through Zarr first: runs/9 listed again
    assert chunks("runs/9/3") == {"runs/9/3/c/0/0"}


def test_unsigned_requests_and_a_chunk_past_the_part_size_store_the_tensors_bit_for_bit(
    s3: SeaweedS3, tmp_path: Path
) -> None:
    """With AWS_UNSIGNED_PAYLOAD=true requests are signed without a hash of their bodies, and what an ingest
    uploads so reads back bit for bit; a chunk object larger than obstore's part size (5 MB) goes up as a multipart
    upload (the bucket's ETag of it names its parts), a smaller one in one request."""
    from tensor_debugger.store.object_stores import open_s3_bucket

    url = s3.new_url()
    unsigned = {**s3.environ, "AWS_UNSIGNED_PAYLOAD": "true"}
    assert str(open_s3_bucket(url, unsigned).config.get("unsigned_payload")).lower() == "true"
    assert "unsigned_payload" not in open_s3_bucket(url, s3.environ).config  # signed unless asked
    originals = {"big": seeded((1700, 1000), seed=3), "small": seeded((300, 1000), seed=4)}  # 6.8 MB; 1.2 MB
    path = tmp_path / "two.pth"
    torch.save(originals, path)
    settings = Settings(data_dir=tmp_path / "data", store_url=url, demo=False, chunk_bytes=8 << 20)
    services = open_services(settings, unsigned)
    try:
        result = Ingestor(settings, services.sessions, services.store).ingest("s", "ref", [InputFile(path, "m")])
        records = stored(services, result.run_id)
        assert sorted(records) == ["m.big", "m.small"]
        for name, record in records.items():
            assert same_bits(read_back(services, record), originals[name.removeprefix("m.")]), name
    finally:
        services.close()
    bucket = s3.bucket(url)
    tags = {name: obstore.head(bucket, f"{record.store_key}/c/0/0")["e_tag"] for name, record in records.items()}
    assert str(tags["m.big"]).strip('"').endswith("-2") and "-" not in str(tags["m.small"]), tags  # 5 MB + 1.8 MB
