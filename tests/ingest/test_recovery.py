"""An ingest killed midway (kill -9) leaves nothing visible after restart, and its arrays are removed."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
from tensor_debugger.ingest.recovery import remove_dead_ingests
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import RunRecord, SessionRecord

from tests.support.polling import wait_until
from tests.support.postgres import DATABASES
from tests.support.servers import cli_command


def wait_for_partial_ingest(data: Path, process: subprocess.Popen[bytes], timeout: float = 90) -> int:
    """The id of the run being ingested, once some of its arrays are on disk but it is not finished."""

    def partial_run() -> int | None:
        assert process.poll() is None, "the ingest finished before it could be killed"
        db = data / "metadata.sqlite3"
        if db.exists():
            with sqlite3.connect(db) as conn:
                try:
                    row = conn.execute("select id, status from runs").fetchone()
                except sqlite3.OperationalError:
                    row = None
            if row is not None and row[1] == "ingesting":
                arrays = data / "arrays" / "runs" / str(row[0])
                if arrays.exists() and sum(1 for p in arrays.iterdir() if p.name.isdigit()) >= 3:
                    return int(row[0])
        return None

    found = wait_until(
        partial_run, what="a partial ingest (a run 'ingesting' with 3 arrays on disk)", timeout=timeout, interval=0.02
    )
    assert found is not None  # wait_until returns only a truthy answer
    return found


def test_kill_nine_midway_leaves_nothing(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    dump.mkdir()
    # 20 files of 8 MiB: once 3 arrays are on disk, 17 (136 MiB) are left to ingest, far more than the 20 ms between
    # two looks and the kill (60 files wrote 480 MiB for the same check: bench/RESULTS.md, "the workers' own work")
    for i in range(20):
        torch.save(torch.full((1024, 2048), float(i)), dump / f"{i}_post_mlp.pth")  # 8 MiB each
    data = tmp_path / "data"
    process = subprocess.Popen(
        [*cli_command(), "--data-dir", str(data), "ingest", "--session", "doomed", "--run", "ref", str(dump)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run_id = wait_for_partial_ingest(data, process)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    with sqlite3.connect(data / "metadata.sqlite3") as conn:  # the debris is there before the restart
        assert conn.execute("select count(*) from runs where status = 'ingesting'").fetchone() == (1,)
    assert (data / "arrays" / "runs" / str(run_id)).exists()

    services = open_services(Settings(data_dir=data, demo=False))
    try:
        assert services.recovery.runs_removed == 1
        with sqlite3.connect(data / "metadata.sqlite3") as conn:
            assert conn.execute("select count(*) from runs").fetchone() == (0,)
            assert conn.execute("select count(*) from sessions").fetchone() == (0,)
            assert conn.execute("select count(*) from tensors").fetchone() == (0,)
        assert not (data / "arrays" / "runs" / str(run_id)).exists()
    finally:
        services.close()


@pytest.mark.parametrize("database_url", DATABASES, indirect=True)
def test_arrays_a_failed_run_left_are_removed_and_the_run_kept(tmp_path: Path, settings: Settings) -> None:
    from tensor_debugger.errors import NothingUsableError
    from tensor_debugger.ingest.inputs import InputFile
    from tensor_debugger.store.dtypes import parse_dtype

    services = open_services(settings)
    notes = tmp_path / "notes.txt"
    notes.write_text("not a tensor")
    pending = services.ingestor.begin("kept", "ref", [notes.name])
    with pytest.raises(NothingUsableError):
        services.ingestor.complete(pending, [InputFile(notes, notes.name)], keep_failure=True)
    # what an ingest wrote before the store failed it, left when the store did not answer its deletion either
    services.store.create(f"runs/{pending.run_id}/0", (3,), parse_dtype("float32"), (3,))
    services.close()
    services = open_services(settings)
    try:
        assert services.recovery.orphan_arrays_removed == 1
        assert str(pending.run_id) not in services.store.children("runs")
        with services.sessions() as db:
            run = db.get_one(RunRecord, pending.run_id)
            assert run.status == "failed" and [p.file for p in run.problems] == [notes.name]
    finally:
        services.close()


@pytest.mark.parametrize("database_url", DATABASES, indirect=True)
def test_orphan_arrays_of_a_recorded_run_are_removed_and_no_others(tmp_path: Path, settings: Settings) -> None:
    """A session's deletion cut short between its rows and its arrays leaves its run's folder: recovery removes it,
    since this database recorded that folder when it created the run. An array in a folder the database never
    recorded (another database's, say) is left where it is."""
    from tensor_debugger.ingest.inputs import InputFile
    from tensor_debugger.store.dtypes import parse_dtype

    services = open_services(settings)
    path = tmp_path / "x.pth"
    torch.save(torch.ones(3), path)
    other = tmp_path / "y.pth"
    torch.save(torch.zeros(5), other)
    kept = services.ingestor.ingest("keep", "ref", [InputFile(path, path.name)])
    cut = services.ingestor.ingest("cut short", "ref", [InputFile(other, other.name)])
    with services.sessions.begin() as db:  # the rows deleted and committed, the arrays not yet
        db.delete(db.get_one(SessionRecord, cut.session_id))
    services.store.create("runs/999/0", (3,), parse_dtype("float32"), (3,))  # never recorded by this database
    services.close()
    assert {c for c in services.store.children("runs") if c.isdigit()} == {str(kept.run_id), str(cut.run_id), "999"}
    services = open_services(settings)
    try:
        assert services.recovery.orphan_arrays_removed == 1
        assert {c for c in services.store.children("runs") if c.isdigit()} == {str(kept.run_id), "999"}
        again = open_services(settings)  # a second start finds nothing more to do
        assert again.recovery.orphan_arrays_removed == 0
        again.close()
    finally:
        services.close()


@pytest.mark.parametrize("database_url", DATABASES, indirect=True)
def test_another_hosts_ingest_is_removed_once_its_lease_expires_and_by_one_process(services: Services) -> None:
    """A replica on another host died ingesting: its run is left while its lease holds, then removed by one of the
    processes recovering at once."""
    with services.sessions.begin() as db:
        session = SessionRecord(name="replica died")
        db.add(session)
        db.flush()
        runs = [
            RunRecord(
                session_id=session.id,
                label=label,
                position=position,
                role="reference" if position == 0 else "candidate",
                status="ingesting",
                ingest_pid=1,
                ingest_host="another-host",
                claimed_by="another-host:1:0",
                claimed_until=time.time() + offset,
            )
            for position, (label, offset) in enumerate([("dead", -1.0), ("alive", 600.0)])
        ]
        db.add_all(runs)
        db.flush()
        dead, alive = runs[0].id, runs[1].id
    start = threading.Barrier(4)
    removed: list[int] = []

    def recover_once() -> None:
        start.wait()
        removed.append(remove_dead_ingests(services.sessions, services.store))

    threads = [threading.Thread(target=recover_once) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(removed) == [0, 0, 0, 1]
    with services.sessions() as db:
        assert db.get(RunRecord, dead) is None and db.get_one(RunRecord, alive).status == "ingesting"


def test_a_run_begun_while_the_heartbeat_recovers_is_not_taken_for_dead(services: Services) -> None:
    """The heartbeat's recovery asks which runs this process ingests after it has read the runs "ingesting": a run
    begun in between (an upload arriving then, as seen on two replicas under load) was taken for dead, deleted, and
    its ingest failed on a foreign key when it stored its tensors."""
    begun: list[int] = []

    def live_then_an_upload_begins() -> frozenset[int]:
        answer = services.ingestor.live_runs()
        begun.append(services.ingestor.begin("arrived meanwhile", "reference", ["0_x.pth"]).run_id)
        return answer  # what was live when asked

    assert remove_dead_ingests(services.sessions, services.store, live_then_an_upload_begins, services.claims) == 0
    [run_id] = begun
    with services.sessions() as db:
        run = db.get(RunRecord, run_id)
        assert run is not None and run.status == "ingesting"
    assert remove_dead_ingests(services.sessions, services.store, services.ingestor.live_runs, services.claims) == 0


@pytest.mark.parametrize("database_url", DATABASES, indirect=True)
def test_an_ingest_whose_run_another_process_took_over_stops_without_touching_it(
    tmp_path: Path, settings: Settings
) -> None:
    """A replica whose lease lapsed (the database away longer than the lease) while another took its run over
    commits nothing: the run, its arrays and its files are the other's, so no tensor is stored twice."""
    from tensor_debugger.ingest.inputs import InputFile
    from tensor_debugger.ingest.outcomes import TakenOver
    from tensor_debugger.store.claims import Claims
    from tensor_debugger.store.models import TensorRecord

    services = open_services(settings)
    try:
        path = tmp_path / "0_ok.pth"
        torch.save(torch.arange(12.0).reshape(3, 4), path)
        pending = services.ingestor.begin("taken", "ref", [path.name])
        other = Claims(services.sessions, settings.claim_seconds)  # another replica's, after the lease ran out
        with services.sessions.begin() as db:
            run = db.get_one(RunRecord, pending.run_id)
            assert other.take_run(db, run.id, run.claimed_by, run.claimed_until)
        with pytest.raises(TakenOver):
            services.ingestor.complete(pending, [InputFile(path, path.name)], keep_failure=True)
        with services.sessions() as db:
            run = db.get_one(RunRecord, pending.run_id)
            assert (run.status, run.claimed_by) == ("ingesting", other.owner)
            assert db.query(TensorRecord).count() == 0
        assert pending.run_id not in services.ingestor.live_runs()
    finally:
        services.close()
