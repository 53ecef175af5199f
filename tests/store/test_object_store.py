"""Arrays in S3-compatible object storage (a real SeaweedFS server on loopback, tests/support/s3.py): what lands in
the bucket, what a slice fetches, and the errors a store that cannot be used gives at start-up."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import obstore
import pytest
import torch
from obstore.store import S3Store
from sqlalchemy import select
from tensor_debugger.errors import StoreUnavailableError
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.queue import IngestJob
from tensor_debugger.services import Services
from tensor_debugger.store import object_chunks
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.database import create_db_engine, make_sessionmaker
from tensor_debugger.store.dtypes import parse_dtype
from tensor_debugger.store.layout import EVERY_CHUNK_WRITTEN, MissingChunkError
from tensor_debugger.store.models import RunRecord, TensorRecord
from tensor_debugger.store.object_chunks import ObjectChunkReader

from tests.support.cli_main import Finished, main_cli
from tests.support.dumps import seeded
from tests.support.s3 import ACCESS_KEY, BUCKET, PARTLY_WRITABLE, SECRET_KEY, SeaweedS3
from tests.support.servers import free_port, run_cli
from tests.support.stored import read_back, same_bits, stored


@pytest.mark.parametrize("store_url", ["s3"], indirect=True)
def test_ingest_uploads_every_chunk_to_the_bucket_and_reads_back_bit_exact(
    services: Services, s3: SeaweedS3, tmp_path: Path
) -> None:
    original = seeded((600, 1000), seed=7)  # 2.4 MB: 38 chunks of 64 KiB
    path = tmp_path / "big.pth"
    torch.save(original, path)
    from tensor_debugger.ingest.runs import Ingestor

    small_chunks = services.settings.with_overrides(chunk_bytes=64 * 1024)
    result = Ingestor(small_chunks, services.sessions, services.store).ingest("s3", "ref", [InputFile(path, "big")])
    (record,) = stored(services, result.run_id).values()
    bucket = S3Store(
        BUCKET,
        prefix=services.settings.store_url.split(BUCKET + "/", 1)[1],
        endpoint=s3.endpoint,
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
        client_options={"allow_http": True},
    )
    keys = {item["path"] for batch in obstore.list(bucket, prefix=record.store_key) for item in batch}
    assert len([k for k in keys if "/c/" in k]) == 38 and f"{record.store_key}/zarr.json" in keys
    assert not (services.settings.data_dir / "arrays").exists()  # nothing on local disk
    assert same_bits(read_back(services, record), original)
    before = services.store.chunk_reads
    array = services.store.reader(record.store_key, record.digest)
    assert torch.equal(torch.from_numpy(array[17:19, 3:5]), original[17:19, 3:5])
    assert services.store.chunk_reads - before == 1  # the one chunk holding those rows, nothing else


def bucket_keys(s3: SeaweedS3, prefix: str) -> set[str]:
    """Every object under `prefix` of the bucket, listed with the writing identity's keys."""
    bucket = S3Store(
        BUCKET,
        prefix=prefix,
        endpoint=s3.endpoint,
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
        client_options={"allow_http": True},
    )
    return {item["path"] for batch in obstore.list(bucket) for item in batch}


def test_a_store_refusing_writes_mid_ingest_fails_the_run_naming_the_file(s3: SeaweedS3, tmp_path: Path) -> None:
    """The store opens (its listing succeeds), stores the first file's tensor, then refuses the second's (the
    identity may write only run 1's first array): the CLI says which file and why, exits 2 without a traceback,
    the run is kept "failed" saying so, and what it had written is deleted again."""
    inputs = []
    for n in range(2):
        inputs.append(tmp_path / f"part{n}.pth")
        torch.save({"hidden": seeded((64, 64), seed=n)}, inputs[-1])
    env = {**s3.read_only_environ, "TENSOR_DEBUGGER_STORE_URL": f"s3://{BUCKET}/{PARTLY_WRITABLE}"}
    data = tmp_path / "data"
    done = main_cli(
        "--data-dir", str(data), "ingest", "--session", "s3 refused", "--run", "ref", *map(str, inputs), env=env
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    message = f"the array store failed writing the arrays of {inputs[1]}: access denied"
    assert message in done.stderr and "403 Forbidden" in done.stderr, done.stderr

    engine = create_db_engine(f"sqlite:///{data / 'metadata.sqlite3'}")
    try:
        with make_sessionmaker(engine)() as db:
            (run,) = db.scalars(select(RunRecord)).all()
            assert run.id == 1 and run.status == "failed"  # the run the identity may write the first array of
            assert [(p.file, p.reason.startswith(message)) for p in run.problems] == [(str(inputs[1]), True)]
            assert db.scalars(select(TensorRecord)).all() == []
    finally:
        engine.dispose()
    assert not [key for key in bucket_keys(s3, PARTLY_WRITABLE) if key.startswith("runs/1/")]  # part0's deleted


def test_a_store_that_cannot_be_used_is_a_clear_error_naming_the_setting(s3: SeaweedS3) -> None:
    with pytest.raises(StoreUnavailableError, match="bucket 'no-such-bucket' does not exist"):
        ArrayStore("s3://no-such-bucket/arrays", s3.environ)
    with pytest.raises(StoreUnavailableError, match=r"credentials were refused .*AWS_SECRET_ACCESS_KEY"):
        ArrayStore(f"s3://{BUCKET}/arrays", {**s3.environ, "AWS_SECRET_ACCESS_KEY": "wrong"})
    with pytest.raises(StoreUnavailableError, match="set AWS_ALLOW_HTTP=true"):
        ArrayStore(f"s3://{BUCKET}/arrays", {**s3.environ, "AWS_ALLOW_HTTP": ""})


def test_a_store_that_does_not_answer_is_tried_again_for_the_store_retry_seconds(tmp_path: Path) -> None:
    """TENSOR_DEBUGGER_STORE_RETRY_SECONDS reaches obstore: its own words on the last try name the time limit."""
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",  # nothing listens there
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        "TENSOR_DEBUGGER_STORE_URL": f"s3://{BUCKET}/arrays",
        "TENSOR_DEBUGGER_STORE_RETRY_SECONDS": "1",
    }
    done = main_cli("--data-dir", str(tmp_path / "data"), "sessions", env=env)
    assert done.returncode == 2, done.stderr
    assert "the store did not answer (AWS_ENDPOINT_URL, AWS_REGION, the network)" in done.stderr, done.stderr
    assert "retry_timeout: 1s" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["sessions", "serve"])
def test_the_cli_says_which_setting_before_doing_anything(s3: SeaweedS3, tmp_path: Path, command: str) -> None:
    env = {**s3.environ, "TENSOR_DEBUGGER_STORE_URL": "s3://no-such-bucket/arrays"}
    # `serve` in a child: were the store not checked first, the server would start there, not in this process
    args = ("--data-dir", str(tmp_path / "data"), command)
    done: Finished = run_cli(*args, env=env) if command == "serve" else main_cli(*args, env=env)
    assert done.returncode == 2, done.stderr
    assert "TENSOR_DEBUGGER_STORE_URL=s3://no-such-bucket/arrays" in done.stderr
    assert "does not exist" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "data" / "metadata.sqlite3").exists()  # nothing was done


@pytest.mark.parametrize("store_url", ["s3"], indirect=True)
def test_an_ingest_in_a_child_process_reaches_the_store_the_services_were_given(
    services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The AWS variables reach the services here only as an argument (not this process's environment, which the
    child inherits): the server's child process that ingests an upload (ingest/child.py) opens the same store."""
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    original = seeded((64, 64), seed=3)
    path = tmp_path / "child.pth"
    torch.save(original, path)
    pending = services.ingestor.begin("s3 child", "ref", ["child.pth"])
    result = services.ingests.submit(IngestJob(pending, [InputFile(path, "child.pth")], True, lambda: None)).result(120)
    (record,) = stored(services, result.run_id).values()
    assert same_bits(read_back(services, record), original)  # written by the child, read back here from S3
    assert not (services.settings.data_dir / "arrays").exists()


@pytest.mark.parametrize("store_url", ["s3"], indirect=True)
def test_slices_fetch_their_chunk_objects_and_read_what_zarr_reads(
    services: Services, s3: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any region of an array in S3, Blosc-compressed or raw, edge chunks included: the chunk objects it covers,
    fetched in batches (of 4 here), decoded bit for bit as Zarr decodes them and counted as Zarr counts them; a
    deleted chunk object is an error naming it (the array was written with every chunk), as a deleted file is."""
    monkeypatch.setattr(object_chunks, "SLICE_BATCH", 4)
    ranged: list[str] = []  # the chunk objects read in part (a ranged GET), seen without changing what is read
    fetch_range = object_chunks.ChunkObjects.fetch_range

    def seen(objects: object_chunks.ChunkObjects, key: str, start: int, end: int) -> object:
        ranged.append(key)
        return fetch_range(objects, key, start, end)

    monkeypatch.setattr(object_chunks.ChunkObjects, "fetch_range", seen)
    store = services.store
    rng = np.random.default_rng(5)
    values = rng.standard_normal((100, 37)).astype(np.float32)
    for n, compressed in enumerate((True, False)):
        array = store.create(f"runs/1/{n}", values.shape, parse_dtype("float32"), (7, 37), compressed)
        array[...] = values
        reader = store.reader(f"runs/1/{n}", f"digest-{n}")
        assert isinstance(reader, ObjectChunkReader)
        for k in range(12):
            region = tuple(slice(*sorted(int(x) for x in rng.integers(0, d + 1, 2))) for d in values.shape)
            region = region if k else (slice(0, 100), slice(0, 37))  # the whole array: 15 chunks, 4 batches
            before = store.chunk_reads
            got = reader[region]
            reads = store.chunk_reads - before
            assert got.tobytes() == np.asarray(array[region]).tobytes(), region
            assert store.chunk_reads - before - reads == reads, region  # as many chunks as Zarr reads
        ranged.clear()
        for region in ((slice(8, 9), slice(2, 30)), (slice(22, 27), slice(5, 6)), (slice(99, 100), slice(36, 37))):
            before = store.chunk_reads  # inside one chunk (a raw one's bytes fetched by a ranged GET): one read
            assert reader[region].tobytes() == np.asarray(array[region]).tobytes(), region
            assert store.chunk_reads - before == 2, region  # and Zarr's one
        # a raw array's, where the bytes spanned are under half its chunk (rows 22-26 of column 5 span 149 values)
        assert ranged == ([f"runs/1/{n}/c/1/0", f"runs/1/{n}/c/14/0"] if n else [])
    obstore.delete(s3.bucket(services.settings.store_url), "runs/1/1/c/2/0")  # rows 14 to 20
    for region in ((slice(10, 30), slice(0, 37)), (slice(15, 17), slice(3, 9))):  # the second: a ranged GET
        with pytest.raises(MissingChunkError, match="runs/1/1/c/2/0 is missing: the data dir is damaged"):
            reader[region]  # written with every chunk: damage, never the fill value
    with pytest.raises(FileNotFoundError, match="runs/1/404"):
        store.reader("runs/1/404", "sha256:0")


@pytest.mark.parametrize("store_url", ["s3"], indirect=True)
def test_what_the_chunk_loop_fetched_is_read_again_without_a_second_fetch_up_to_the_kept_bytes(
    services: Services, s3: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failing pair's second read (where its error is) takes the chunk objects its reader fetched for the compiled
    chunk loop from what the reader kept, up to KEPT_BYTES (3 chunks here): with every object deleted from the
    bucket after the first read, the kept chunks still read as stored, the others as the fill value (fetched
    again, and gone). A reader that only slices keeps nothing (the slice test above)."""
    chunk = 7 * 37 * 4  # bytes of one (7, 37) float32 chunk
    monkeypatch.setattr(object_chunks, "KEPT_BYTES", 3 * chunk)
    store = services.store
    values = np.random.default_rng(6).standard_normal((35, 37)).astype(np.float32) + 10  # no zeros: fill is 0
    array = store.create("runs/1/0", values.shape, parse_dtype("float32"), (7, 37), False)
    array[...] = values
    del array.attrs[EVERY_CHUNK_WRITTEN]  # as stored before the marker: a deleted object reads as the fill value
    reader = store.reader("runs/1/0", "digest-kept")
    assert isinstance(reader, ObjectChunkReader)
    pieces = reader.flat_pieces(0, values.size)
    assert pieces is not None and len(pieces) == 5
    fetched = reader.fetch_pieces(pieces).result()
    assert [bytes(data or b"") for data in fetched] == [values[7 * i : 7 * i + 7].tobytes() for i in range(5)]
    bucket = s3.bucket(services.settings.store_url)
    obstore.delete(bucket, [f"runs/1/0/c/{i}/0" for i in range(5)])
    again = np.asarray(reader[0:35, 0:37])
    assert again[:21].tobytes() == values[:21].tobytes()  # the first 3 chunks, kept
    assert not again[21:].any()  # the 2 past KEPT_BYTES, fetched again: gone, the fill value
    fresh = store.reader("runs/1/0", "digest-kept")
    assert not np.asarray(fresh[0:35, 0:37]).any()  # another pair's reader keeps nothing of this one's
