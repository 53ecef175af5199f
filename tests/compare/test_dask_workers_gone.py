"""Every Dask worker killed during a comparison: the computation waits TENSOR_DEBUGGER_DASK_NO_WORKER_SECONDS for
one, then stops, its pairs still pending (no verdict on them). `compare` exits 2 saying that no worker has been
connected to the scheduler; a server logs it, stays up, and computes the pairs once a worker is back. Both used to
wait forever (Dask keeps a task whose workers all died for the next worker that joins)."""

from __future__ import annotations

import json
import operator
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from distributed import Client
from tensor_debugger.compare.compute.dask_connection import SchedulerConnection, WaitStopped, result_with_workers
from tensor_debugger.demo.synthetic import Plant, write_dump
from tensor_debugger.errors import NoDaskWorkerError

from tests.support import loopback_http
from tests.support.dask_cluster import QUIET, DaskCluster, start_dask
from tests.support.dumps import make_zip
from tests.support.polling import wait_until
from tests.support.servers import LiveServer, child_env, cli_command, free_port, started_server, upload, wait_done

NO_WORKER_SECONDS = 3.0


def kill_when_busy(cluster: DaskCluster, worker: subprocess.Popen[bytes]) -> None:
    """SIGKILL `worker` (the cluster's only one, stopped) once the scheduler has given it a task."""
    with Client(cluster.address, timeout=10, set_as_default=False) as client:  # type: ignore[no-untyped-call]
        wait_until(lambda: any(client.processing().values()), what="the comparison's tasks on the worker", timeout=90)
    worker.kill()  # mid-compute: the scheduler has no worker left
    worker.wait()
    cluster.processes.remove(worker)  # gone for good: the cluster's checks look at the living ones


def worker_again(cluster: DaskCluster) -> None:
    """A new worker process for the cluster's scheduler, once it has joined."""
    with open(cluster.logs / "worker-again.log", "ab") as log:
        command = [str(Path(sys.executable).with_name("dask")), "worker", cluster.address, "--nthreads", "1"]
        command += ["--no-nanny", "--host", "127.0.0.1", "--no-dashboard"]
        again = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**child_env(), **QUIET})
    cluster.processes.append(again)
    wait_until(cluster.workers, what="the new worker to join", timeout=60, interval=0.5)


def test_a_compare_whose_workers_all_die_stops_and_a_server_computes_its_pairs_later(tmp_path: Path) -> None:
    cluster = start_dask(tmp_path / "dask", workers=1)
    try:
        write_dump(tmp_path / "ref", layers=2, seed=5)
        write_dump(tmp_path / "cand", layers=2, seed=5, plant=Plant(1, "post_mlp", (1, 2), 0.25))
        worker = cluster.processes[1]
        os.kill(worker.pid, signal.SIGSTOP)  # holds the task it is given, till it is killed with it
        env = {
            **{k: v for k, v in child_env().items() if not k.startswith("TENSOR_DEBUGGER_")},
            "TENSOR_DEBUGGER_DASK_SCHEDULER": cluster.address,
            "TENSOR_DEBUGGER_DASK_NO_WORKER_SECONDS": str(NO_WORKER_SECONDS),
            "TENSOR_DEBUGGER_CLAIM_SECONDS": "2",
        }
        data = tmp_path / "data"
        args = ["--data-dir", str(data), "compare", str(tmp_path / "ref"), str(tmp_path / "cand"), "--json"]
        compare = subprocess.Popen(
            [*cli_command(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        try:
            kill_when_busy(cluster, worker)
            killed = time.monotonic()
            out, err = compare.communicate(timeout=60)
        finally:  # a compare still waiting (as it did, for ever) is not left behind
            if compare.poll() is None:
                compare.kill()
                compare.communicate()
        waited = time.monotonic() - killed
        assert compare.returncode == 2, (out, err)
        assert NO_WORKER_SECONDS <= waited < NO_WORKER_SECONDS + 20, waited
        message = f"no Dask worker has been connected to {cluster.address} for 3 s"
        report = json.loads(out)
        assert message in report["error"], report["error"]
        statuses = [p["status"] for p in report["pairs"]]
        assert statuses and set(statuses) == {"pending"}, statuses
        assert report["verdict"] == "incomplete" and report["first_divergence"] is None

        # a worker is back: a server on the same data dir computes the pairs left pending
        worker_again(cluster)
        server = LiveServer(data, free_port(), env={k: v for k, v in env.items() if k.startswith("TENSOR_")}).start()
        try:
            done = wait_done(server, report["session"]["id"], timeout=90)
            assert done["first_divergence"]["name"] == "1_post_mlp"
            assert server.alive()
        finally:
            server.stop()
    finally:
        cluster.stop()


@dataclass(frozen=True)
class Held:
    """A server on a one-worker cluster, and the session whose pairs that worker, stopped, was given to compute."""

    cluster: DaskCluster
    worker: subprocess.Popen[bytes]
    server: LiveServer
    session_id: int


@contextmanager
def held_by_a_stopped_worker(tmp_path: Path, name: str, seed: int, env: dict[str, str]) -> Iterator[Held]:
    """Session `name` (a reference and a candidate with a plant in layer 1, zipped) uploaded to a server whose Dask
    cluster's only worker is stopped (SIGSTOP: it holds the task it is given, till it is killed with it); the server
    and the cluster stopped on the way out."""
    cluster = start_dask(tmp_path / "dask", workers=1)
    try:
        for run, plant in (("ref", None), ("cand", Plant(1, "post_mlp", (1, 2), 0.25))):
            write_dump(tmp_path / run, layers=2, seed=seed, plant=plant)
            make_zip(tmp_path / run, tmp_path / f"{run}.zip")
        worker = cluster.processes[1]
        os.kill(worker.pid, signal.SIGSTOP)
        server = started_server(tmp_path / "server", env={"TENSOR_DEBUGGER_DASK_SCHEDULER": cluster.address, **env})
        try:
            files = [("reference", tmp_path / "ref.zip"), ("candidate", tmp_path / "cand.zip")]
            created = upload(server, name, files)
            assert created.status_code == 201, created.text
            yield Held(cluster, worker, server, created.json()["session"]["id"])
        finally:
            server.stop()
    finally:
        cluster.stop()


def test_a_server_whose_workers_all_die_stays_up_and_computes_the_pairs_once_one_is_back(tmp_path: Path) -> None:
    env = {
        "TENSOR_DEBUGGER_DASK_NO_WORKER_SECONDS": str(NO_WORKER_SECONDS),
        "TENSOR_DEBUGGER_COMPARE_IDLE_SECONDS": "0.5",
    }
    with held_by_a_stopped_worker(tmp_path, "workers gone", 6, env) as held:
        cluster, server, session_id = held.cluster, held.server, held.session_id
        kill_when_busy(cluster, held.worker)
        message = f"no Dask worker has been connected to {cluster.address} for 3 s"
        wait_until(lambda: message in server.log.read_text(errors="replace"), what="the message", timeout=30)
        assert server.alive()
        pairs = loopback_http.get(f"{server.url}/api/sessions/{session_id}/pairs", timeout=30).json()
        assert pairs["progress"]["pending"] == pairs["progress"]["total"] > 0, pairs["progress"]
        # where users look: the session's progress and the page's status line say why the pairs wait
        progress = loopback_http.get(f"{server.url}/api/sessions/{session_id}/progress", timeout=30).json()
        assert progress["stage"] == "comparing" and message in (progress["waiting_for"] or ""), progress
        page = loopback_http.get(f"{server.url}/sessions/{session_id}", timeout=30).text
        assert 'id="waiting-for"' in page and message in page, page
        worker_again(cluster)
        wait_until(  # said no more once a worker is back, whether or not pairs are still pending
            lambda: loopback_http.get(f"{server.url}/api/sessions/{session_id}/progress", timeout=30).json(),
            until=lambda p: p["waiting_for"] is None,
            what="the progress to stop saying the pairs wait for a worker",
            timeout=60,
        )
        done = wait_done(server, session_id, timeout=90)
        assert done["first_divergence"]["name"] == "1_post_mlp"
        assert server.alive()
        assert 'id="waiting-for"' not in loopback_http.get(f"{server.url}/sessions/{session_id}", timeout=30).text


def test_a_wait_without_workers_is_noted_until_one_is_seen_and_ends_when_the_process_stops(tmp_path: Path) -> None:
    """The wait itself, on a real scheduler with no worker: given up after the bound, its words kept on the
    connection (what a session's progress says) until a wait sees a worker; a stop ends a wait whose bound is far
    off within a poll."""
    cluster = start_dask(tmp_path / "dask", workers=0)
    connection = SchedulerConnection(cluster.address)
    try:
        client = connection.client()
        task = client.submit(operator.add, 1, 2, pure=False)
        with pytest.raises(NoDaskWorkerError, match="no Dask worker has been connected"):
            result_with_workers(connection, client, task, 1.0, lambda: False)
        assert connection.without_workers is not None
        assert f"no Dask worker has been connected to {cluster.address} for 1 s" in connection.without_workers

        stop = threading.Event()
        threading.Timer(0.5, stop.set).start()
        with pytest.raises(WaitStopped):  # the bound is 10 minutes: only the stop ends this wait
            result_with_workers(connection, client, task, 600.0, stop.is_set)
        assert stop.is_set()

        worker_again(cluster)
        assert result_with_workers(connection, client, task, 600.0, lambda: False) == 3
        assert connection.without_workers is None
    finally:
        connection.close()
        cluster.stop()


def test_a_server_stopped_while_its_pairs_wait_for_a_worker_stops_at_once(tmp_path: Path) -> None:
    """SIGTERM while the comparison worker waits for a Dask worker (the bound: 10 minutes): the wait ends on the
    stop, and the server exits within its graceful stop (LiveServer.stop kills a server after 20 s, the comparison
    worker's join gave up after 30 s), the comparison worker stopped, not left behind."""
    with held_by_a_stopped_worker(
        tmp_path, "stopped while waiting", 7, {"TENSOR_DEBUGGER_DASK_NO_WORKER_SECONDS": "600"}
    ) as held:
        kill_when_busy(held.cluster, held.worker)  # the comparison worker now waits for a worker, for up to 600 s
        process = held.server.process
        assert process is not None
        held.server.ask_to_stop()
        assert process.wait(timeout=20) == 0, held.server.log.read_text(errors="replace")
        assert "did not stop" not in held.server.log.read_text(errors="replace")
