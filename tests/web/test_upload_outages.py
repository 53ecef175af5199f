"""An upload the server accepted (202) is never lost to a fault: a PostgreSQL restart while it ingests, the array
store gone mid-ingest, the replica ingesting it killed. Each on private servers (a PostgreSQL cluster, SeaweedFS)
stopped in the middle of the test; each checks that the session ends whole: both runs ready with every tensor
once, every pair with a verdict (the planted divergence found), no array left that no tensor names, and the staged
upload removed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import obstore
from sqlalchemy import select
from tensor_debugger.demo.synthetic import DumpShape, Plant, write_dump
from tensor_debugger.store.database import create_db_engine, make_sessionmaker
from tensor_debugger.store.models import PairRecord, RunRecord, TensorRecord

from tests.support import loopback_http as http
from tests.support.dumps import make_zip
from tests.support.polling import wait_until
from tests.support.postgres import PostgresCluster
from tests.support.s3 import QUICK_OUTAGE_RETRIES, QUICK_STORE_RETRIES, SeaweedS3
from tests.support.servers import LiveServer, free_port, started_server, upload, wait_done, wait_staging_empty

PLANTED = "1_post_mlp"


SHAPE = DumpShape(tokens=256, heads=8, head_dim=32)  # 256 KiB a tensor: an ingest lasts long enough to be cut


def two_runs(tmp_path: Path, shape: DumpShape = SHAPE) -> list[tuple[str, Path]]:
    write_dump(tmp_path / "ref", layers=3, seed=7, shape=shape)
    write_dump(tmp_path / "cand", layers=3, seed=7, shape=shape, plant=Plant(1, "post_mlp", (1, 2), 0.5))
    return [
        ("reference", make_zip(tmp_path / "ref", tmp_path / "ref.zip")),
        ("candidate", make_zip(tmp_path / "cand", tmp_path / "cand.zip")),
    ]


def accepted(server: LiveServer, files: list[tuple[str, Path]]) -> int:
    answer = upload(server, "survives", files, url="/api/sessions?wait=false")
    assert answer.status_code == 202, answer.text
    session_id: int = answer.json()["session"]["id"]
    return session_id


def progress(server: LiveServer, session_id: int) -> dict[str, Any]:
    answer: dict[str, Any] = http.get(f"{server.url}/api/sessions/{session_id}/progress", timeout=30).json()
    return answer


def assert_whole(server: LiveServer, database_url: str, session_id: int, files: list[tuple[str, Path]]) -> set[str]:
    """The session's two runs are ready, each with every tensor of its dump once, every pair has a verdict and
    the planted divergence is the first; returns the store keys its tensors name."""
    report = wait_done(server, session_id, timeout=180)
    assert report["first_divergence"]["name"] == PLANTED
    tensors = len(list(files[0][1].parent.joinpath("ref").glob("*.pth")))
    engine = create_db_engine(database_url)
    try:
        with make_sessionmaker(engine)() as db:
            runs = db.scalars(select(RunRecord).order_by(RunRecord.position)).all()
            assert [(r.label, r.status, r.session_id) for r in runs] == [
                ("reference", "ready", session_id),
                ("candidate", "ready", session_id),
            ]
            for run in runs:
                names = db.scalars(select(TensorRecord.name).where(TensorRecord.run_id == run.id)).all()
                assert len(names) == len(set(names)) == tensors == run.tensor_count
            pairs = db.scalars(select(PairRecord).where(PairRecord.session_id == session_id)).all()
            assert len(pairs) == tensors
            assert {p.status for p in pairs} == {"pass", "fail"}
            keys = set(db.scalars(select(TensorRecord.store_key)))
    finally:
        engine.dispose()
    wait_staging_empty(server)
    return keys


def test_an_accepted_upload_survives_a_postgresql_restart_mid_ingest(
    tmp_path: Path, own_postgres: PostgresCluster
) -> None:
    url = own_postgres.create_database("restart")
    # tried again every second while the database is down: the first try after the restart comes within one
    env = {"TENSOR_DEBUGGER_OUTAGE_RETRY_SECONDS": str(QUICK_OUTAGE_RETRIES)}
    server = started_server(tmp_path, database_url=url, env=env)
    try:
        files = two_runs(tmp_path)
        session_id = accepted(server, files)
        wait_until(
            lambda: progress(server, session_id),
            until=lambda p: any(r["stage"] in ("unpacking", "copying") for r in p["runs"]),
            what="an ingest to begin",
            timeout=60,
            interval=0.01,
        )
        own_postgres.pause()  # the ingests (in a child process) meet it when they record their tensors, or sooner
        # down until an ingest (or the planning after it) has met the outage: however long its unpacking takes on a
        # loaded machine, the restart then hits it (a fixed pause could end before it next reached the database)
        wait_until(
            lambda: "met an outage; tried again" in server.log.read_text(),
            what="an ingest to meet the outage",
            timeout=180,
            interval=0.05,
        )
        own_postgres.resume()
        keys = assert_whole(server, url, session_id, files)
        arrays = server.data_dir / "arrays" / "runs"
        written = {f"runs/{run.name}/{a.name}" for run in arrays.iterdir() if run.is_dir() for a in run.iterdir()}
        assert {key for key in written if not key.endswith("/zarr.json")} == keys
        assert server.alive()
    finally:
        server.stop()


def test_an_ingest_that_meets_a_store_outage_waits_and_leaves_no_array_behind(
    tmp_path: Path, own_s3: SeaweedS3
) -> None:
    store_url = own_s3.new_url()
    env = {"TENSOR_DEBUGGER_STORE_URL": store_url, **own_s3.environ, **QUICK_STORE_RETRIES}
    server = started_server(tmp_path, env=env)
    bucket = own_s3.bucket(store_url)

    def chunks_written() -> bool:
        return any("/c/" in item["path"] for batch in obstore.list(bucket, prefix="runs/") for item in batch)

    try:
        files = two_runs(tmp_path)
        session_id = accepted(server, files)
        wait_until(chunks_written, what="the first chunks in the bucket", timeout=60, interval=0.01)
        own_s3.stop()  # mid-ingest: some arrays are written, the rest cannot be
        waiting = wait_until(
            lambda: progress(server, session_id),
            until=lambda p: any(r["stage"] == "waiting" for r in p["runs"]),
            what="a run to say it waits for the store",
            timeout=60,
        )
        assert waiting["stage"] == "ingesting"
        words = next(r["words"] for r in waiting["runs"] if r["stage"] == "waiting")
        assert words.startswith("waiting to be ingested again: the array store did not answer "), words
        # nothing failed, nothing deleted (a run ingested whole before the store went stays ready)
        assert [r["label"] for r in waiting["runs"]] == ["reference", "candidate"]
        assert {r["status"] for r in waiting["runs"]} <= {"ingesting", "ready"}
        assert list((server.data_dir / "staging").iterdir())  # the upload is kept for the next try

        own_s3.restart()
        keys = assert_whole(server, f"sqlite:///{server.data_dir / 'metadata.sqlite3'}", session_id, files)
        arrays = {
            "/".join(item["path"].split("/")[:3])
            for batch in obstore.list(bucket, prefix="runs/")
            for item in batch
            if item["path"].count("/") >= 3
        }
        assert arrays == keys  # every array written is a tensor's: what the first try wrote was deleted
        assert server.alive()
    finally:
        server.stop()


def test_an_upload_whose_replica_is_killed_mid_ingest_is_ingested_by_the_other(
    tmp_path: Path, own_postgres: PostgresCluster
) -> None:
    url = own_postgres.create_database("replicas")
    data = tmp_path / "data"
    data.mkdir()
    # leases renewed every second; what the killed replica's ingests unpacked is swept within 2 s
    env = {"TENSOR_DEBUGGER_CLAIM_SECONDS": "3", "TENSOR_DEBUGGER_STAGING_SWEEP_SECONDS": "2"}
    one, other = (LiveServer(data, free_port(), database_url=url, env=env) for _ in range(2))
    try:
        one.start()
        other.start()
        files = two_runs(tmp_path)
        session_id = accepted(one, files)
        wait_until(
            lambda: progress(one, session_id),
            until=lambda p: any(r["stage"] in ("unpacking", "copying") for r in p["runs"]),
            what="an ingest to begin",
            timeout=60,
            interval=0.01,
        )
        assert one.process is not None
        one.process.kill()  # kill -9: its ingest children follow it within a fraction of a second
        one.process.wait()
        keys = assert_whole(other, url, session_id, files)
        arrays = data / "arrays" / "runs"
        written = {f"runs/{run.name}/{a.name}" for run in arrays.iterdir() if run.is_dir() for a in run.iterdir()}
        assert {key for key in written if not key.endswith("/zarr.json")} == keys
        assert "ingest died; this process ingests it again from its staged files" in other.log.read_text()
        assert other.alive()
    finally:
        one.stop()
        other.stop()


def test_an_upload_whose_server_is_stopped_mid_ingest_is_ingested_at_its_next_start(tmp_path: Path) -> None:
    # short leases: where the graceful stop outlasts LiveServer.stop's 20 s on a loaded machine and the server is
    # killed, its claim on the run runs out in 3 s, not 30, before the next start takes the upload over
    server = started_server(tmp_path, env={"TENSOR_DEBUGGER_CLAIM_SECONDS": "3"})
    try:
        files = two_runs(tmp_path)
        session_id = accepted(server, files)
        wait_until(
            lambda: progress(server, session_id),
            until=lambda p: any(r["stage"] in ("unpacking", "copying") for r in p["runs"]),
            what="an ingest to begin",
            timeout=60,
            interval=0.01,
        )
        server.stop()  # SIGTERM: a graceful stop cancels the ingests, but keeps the accepted upload
        server.port = free_port()
        server.start()
        assert_whole(server, f"sqlite:///{server.data_dir / 'metadata.sqlite3'}", session_id, files)
        assert "ingest died; this process ingests it again from its staged files" in server.log.read_text()
    finally:
        server.stop()
