"""The server's background ingests, in process: a bounded number at a time and the rest waiting their turn,
live figures while they run, failures kept with their reasons, and recovery that leaves live runs alone."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest
import torch
from sqlalchemy import delete
from tensor_debugger.compare.reports.progress import SessionProgress, pair_progress, session_progress
from tensor_debugger.errors import NothingUsableError
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.outcomes import IngestCancelled
from tensor_debugger.ingest.queue import IngestJob, IngestProgress, IngestQueue
from tensor_debugger.ingest.recovery import recover
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store import catalog
from tensor_debugger.store.models import PairRecord, RunRecord

from tests.support.dumps import seeded
from tests.support.polling import wait_until
from tests.support.postgres import DATABASES


def tensor_file(tmp_path: Path, name: str, seed: int) -> InputFile:
    path = tmp_path / name
    torch.save(seeded((64, 64), seed), path)
    return InputFile(path, name)


def status_of(services: Services, run_id: int) -> str | None:
    with services.sessions() as db:
        run = db.get(RunRecord, run_id)
        return None if run is None else run.status


def test_one_worker_ingests_one_run_at_a_time_and_the_next_waits(services: Services, tmp_path: Path) -> None:
    gate = threading.Event()
    planned: list[int] = []

    def plan(session_id: int) -> None:  # holds the first job in its "planning" stage until the gate opens
        planned.append(session_id)
        gate.wait(60)

    queue = IngestQueue(services.ingestor, plan, at_once=1)
    try:
        done: list[str] = []
        a = services.ingestor.begin("queued", "a", ["a.pth"])
        b = services.ingestor.begin("queued", "b", ["b.pth"])
        first = queue.submit(IngestJob(a, [tensor_file(tmp_path, "0_a.pth", 1)], True, lambda: done.append("a")))
        second = queue.submit(IngestJob(b, [tensor_file(tmp_path, "0_b.pth", 2)], True, lambda: done.append("b")))
        wait_until(lambda: planned == [a.session_id], what="the first job to be planned", interval=0.01)
        live_a = queue.progress(a.run_id)
        assert live_a is not None and live_a.stage == "planning"
        assert live_a.bytes_total > 0 and live_a.bytes_done == live_a.bytes_total
        assert queue.progress(b.run_id) == IngestProgress("queued")
        assert (status_of(services, a.run_id), status_of(services, b.run_id)) == ("ready", "ingesting")
        assert done == []
        gate.set()
        assert first.result(60).tensors == 1 and second.result(60).tensors == 1
        wait_until(lambda: len(done) == 2, what="both jobs' callbacks", interval=0.01)
        assert done == ["a", "b"] and planned == [a.session_id, b.session_id]
        assert queue.progress(a.run_id) is None and queue.progress(b.run_id) is None
        assert status_of(services, b.run_id) == "ready"
    finally:
        gate.set()
        queue.close()


@pytest.mark.parametrize("database_url", DATABASES, indirect=True)
def test_recovery_leaves_this_process_s_live_runs_alone(services: Services, tmp_path: Path) -> None:
    """A run begun here and still being ingested is alive; one that names this process but that its ingestor
    does not know was left by an earlier process with the same id (a container's process 1 restarted)."""
    live = services.ingestor.begin("mine", "live", ["x.pth"])
    with services.sessions.begin() as db:
        stale = RunRecord(
            session_id=live.session_id,
            label="left over",
            position=1,
            role="candidate",
            status="ingesting",
            ingest_pid=os.getpid(),
            ingest_host=socket.gethostname(),
        )
        db.add(stale)
        db.flush()
        stale_id = stale.id
    report = recover(services.sessions, services.store, services.ingestor.live_runs)
    assert report.runs_removed == 1
    assert status_of(services, live.run_id) == "ingesting" and status_of(services, stale_id) is None
    services.ingestor.complete(live, [tensor_file(tmp_path, "0_x.pth", 3)])
    assert status_of(services, live.run_id) == "ready"
    assert services.ingestor.live_runs() == frozenset()
    assert recover(services.sessions, services.store, services.ingestor.live_runs).runs_removed == 0


def test_opening_the_data_dir_again_in_this_process_leaves_its_ingest_alone(
    services: Services, settings: Settings, tmp_path: Path
) -> None:
    """A second open_services on the same data dir (a capture beside a server, in one process) recovers; the run
    the first one is ingesting is this process's, so it survives, and no other data dir's run ids count."""
    live = services.ingestor.begin("mine", "live", ["x.pth"])
    other = open_services(Settings(data_dir=tmp_path / "elsewhere", demo=False))
    again = open_services(settings)
    try:
        assert again.recovery.runs_removed == 0 and status_of(services, live.run_id) == "ingesting"
        assert other.ingestor.live_runs() == frozenset() and again.ingestor.live_runs() == {live.run_id}
        services.ingestor.complete(live, [tensor_file(tmp_path, "0_x.pth", 3)])
        assert status_of(again, live.run_id) == "ready"
    finally:
        again.close()
        other.close()


def test_a_report_read_while_the_last_run_is_planned_never_says_done_without_its_pairs(
    services: Services, tmp_path: Path
) -> None:
    """The page's report takes the live figures before the database: the moment the last run's plan commits and
    its figures are dropped falls either before both (its pairs are read) or after both (it is still "planning");
    never between, where every run is ready, nothing is live and no pair is read: "done" with no verdict."""
    planned, release = threading.Event(), threading.Event()

    def plan(session_id: int) -> None:  # commits the pairs, then holds the job before its figures are dropped
        services.plan(session_id)
        planned.set()
        release.wait(60)

    a = services.ingestor.begin("raced", "reference", ["0_x.pth"])
    services.ingestor.complete(a, [tensor_file(tmp_path, "0_x.pth", 1)])
    queue = IngestQueue(services.ingestor, plan, at_once=1)
    try:
        b = services.ingestor.begin("raced", "candidate", ["0_x.pth"])
        done = queue.submit(IngestJob(b, [tensor_file(tmp_path, "0_x.pth", 2)], True, lambda: None))
        assert planned.wait(60)
        live = queue.snapshot()  # taken while the candidate is "planning": its pairs are committed already
        assert live[b.run_id].stage == "planning"
        release.set()
        done.result(60)
        wait_until(lambda: queue.progress(b.run_id) is None, what="the candidate's figures to be dropped")

        def report(live: dict[int, IngestProgress]) -> SessionProgress:
            with services.sessions() as db:
                return session_progress(catalog.get_session(db, a.session_id), live, pair_progress(db, a.session_id))

        # the plan committed before the figures were taken: the report reads the pair, whichever stage it says
        raced = report(live)
        assert raced.stage == "planning" and raced.pairs.total == 1
        assert report(queue.snapshot()).stage == "comparing"  # nothing live any more, one pair pending
        # the other order, database first, then figures taken after they were dropped, is what said "done"
        with services.sessions() as db:
            session = catalog.get_session(db, a.session_id)
            db.execute(delete(PairRecord).where(PairRecord.session_id == a.session_id))  # the plan not yet in
            stale = session_progress(session, queue.snapshot(), pair_progress(db, a.session_id))
            db.rollback()
        assert (stale.stage, stale.pairs.total) == ("done", 0)
    finally:
        release.set()
        queue.close()


def test_a_failed_background_ingest_is_kept_with_its_reasons_and_can_be_replaced(
    services: Services, tmp_path: Path
) -> None:
    queue = IngestQueue(services.ingestor, services.plan, at_once=2)
    try:
        garbage = tmp_path / "weights.pth"
        garbage.write_bytes(b"\x00" * 64)
        pending = services.ingestor.begin("broken", "reference", ["weights.pth"])
        future = queue.submit(IngestJob(pending, [InputFile(garbage, "weights.pth")], True, lambda: None))
        with pytest.raises(NothingUsableError):
            future.result(60)
        with services.sessions() as db:
            run = db.get_one(RunRecord, pending.run_id)
            assert (run.status, run.ingest_pid, run.tensor_count) == ("failed", None, 0)
            assert [(p.file, p.reason.split(": ")[0]) for p in run.problems] == [
                ("weights.pth", "not a readable PyTorch file")
            ]
        assert not services.store.children(f"runs/{pending.run_id}")
        again = services.ingestor.ingest("broken", "reference", [tensor_file(tmp_path, "0_ok.pth", 4)])
        with services.sessions() as db:
            runs = db.query(RunRecord).filter_by(session_id=pending.session_id).all()
            assert [(r.label, r.position, r.role, r.status) for r in runs] == [("reference", 0, "reference", "ready")]
        assert again.tensors == 1
    finally:
        queue.close()


def test_closing_drops_the_waiting_ingests_and_their_runs(services: Services, tmp_path: Path) -> None:
    gate = threading.Event()

    def on_ingested(_session_id: int) -> None:
        gate.wait(60)

    queue = IngestQueue(services.ingestor, on_ingested, at_once=1)
    try:
        a = services.ingestor.begin("stopping", "a", ["a.pth"])
        b = services.ingestor.begin("stopping", "b", ["b.pth"])
        first = queue.submit(IngestJob(a, [tensor_file(tmp_path, "0_a.pth", 1)], True, lambda: None))
        second = queue.submit(IngestJob(b, [tensor_file(tmp_path, "0_b.pth", 2)], True, lambda: None))
        wait_until(
            lambda: getattr(queue.progress(a.run_id), "stage", None) == "planning",
            what="run a's ingest to reach planning",
            interval=0.01,
        )
        queue.close(timeout=0)  # the server stops while `a` is being paired and `b` waits
        with pytest.raises(RuntimeError, match="stopping"):
            queue.submit(IngestJob(b, [], True, lambda: None))
        gate.set()
        assert first.result(60).tensors == 1
        with pytest.raises(IngestCancelled):
            second.result(60)
        assert (status_of(services, a.run_id), status_of(services, b.run_id)) == ("ready", None)
        assert services.ingestor.live_runs() == frozenset()
    finally:
        gate.set()
        queue.close()
