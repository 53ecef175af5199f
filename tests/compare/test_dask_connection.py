"""A server with a Dask scheduler keeps one client to it: none while idle (the scheduler's log stays quiet), one
made when pairs are first sent to the workers and kept for the next computations. It used to open a client every
5 seconds of idling, each one logged by the scheduler coming and going."""

from __future__ import annotations

import time
from pathlib import Path

from tensor_debugger.demo.synthetic import Plant, write_dump

from tests.support.dask_cluster import start_dask
from tests.support.dumps import make_zip
from tests.support.servers import started_server, upload, wait_done


def connections(log: Path) -> tuple[int, int]:
    """(clients received, clients removed) as the scheduler's log says."""
    text = log.read_text(errors="replace")
    return text.count("Receive client connection"), text.count("Remove client")


def test_an_idle_server_opens_no_connection_and_a_busy_one_keeps_one(tmp_path: Path) -> None:
    cluster = start_dask(tmp_path / "dask", workers=1)
    scheduler_log = tmp_path / "dask" / "scheduler.log"
    try:
        server = started_server(tmp_path / "server", env={"TENSOR_DEBUGGER_DASK_SCHEDULER": cluster.address})
        try:
            received, removed = connections(scheduler_log)  # the test's own clients, asking for the workers
            time.sleep(12)  # idle: the comparison worker wakes every 5 s
            assert connections(scheduler_log) == (received, removed)
            for n in range(2):  # two computations on the workers, one client
                write_dump(tmp_path / f"ref{n}", layers=2, seed=n)
                write_dump(tmp_path / f"cand{n}", layers=2, seed=n, plant=Plant(1, "post_mlp", (1, 2), 0.25))
                files = [("reference", make_zip(tmp_path / f"ref{n}", tmp_path / f"ref{n}.zip"))]
                files.append(("candidate", make_zip(tmp_path / f"cand{n}", tmp_path / f"cand{n}.zip")))
                created = upload(server, f"on dask {n}", files)
                assert created.status_code == 201, created.text
                report = wait_done(server, created.json()["session"]["id"])
                assert report["first_divergence"]["name"] == "1_post_mlp"
                time.sleep(6)  # idle again
            assert connections(scheduler_log) == (received + 1, removed)
        finally:
            server.stop()
    finally:
        cluster.stop()
