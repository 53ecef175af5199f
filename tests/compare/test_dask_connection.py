"""A server with a Dask scheduler keeps one client to it: none while idle (the scheduler's log stays quiet), one
made when pairs are first sent to the workers and kept for the next computations, connected again when the
scheduler restarts. It used to open a client every 5 seconds of idling, each one logged by the scheduler coming and
going."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlparse

from tensor_debugger.demo.synthetic import Plant, write_dump

from tests.support.dask_cluster import start_dask
from tests.support.dumps import make_zip
from tests.support.servers import LiveServer, started_server, upload, wait_done


def clients(log: Path) -> tuple[list[str], set[str]]:
    """The clients the scheduler's log says it received (in order, a reconnected one again) and those still
    connected (received, never removed): the test's own clients, asking for the workers, come and go."""
    received, removed = [], set()
    for line in log.read_text(errors="replace").splitlines():
        if "Receive client connection: " in line:
            received.append(line.rsplit(" ", 1)[1])
        elif "Remove client " in line:
            removed.add(line.rsplit(" ", 1)[1])
    return received, set(received) - removed


def compared_on_dask(server: LiveServer, root: Path, name: str, seed: int) -> None:
    """Upload two runs whose pairs the workers compute, and wait for the verdicts."""
    write_dump(root / f"ref-{name}", layers=2, seed=seed)
    write_dump(root / f"cand-{name}", layers=2, seed=seed, plant=Plant(1, "post_mlp", (1, 2), 0.25))
    files = [("reference", make_zip(root / f"ref-{name}", root / f"ref-{name}.zip"))]
    files.append(("candidate", make_zip(root / f"cand-{name}", root / f"cand-{name}.zip")))
    created = upload(server, name, files)
    assert created.status_code == 201, created.text
    report = wait_done(server, created.json()["session"]["id"])
    assert report["first_divergence"]["name"] == "1_post_mlp"


IDLE_SECONDS = 0.2  # how often the server's comparison worker wakes when idle (the product's default is 5 s)
IDLE_WAKES = 3  # idle wakes between the looks at the scheduler's log


def idle() -> None:
    """Leave the server idle for IDLE_WAKES of its comparison worker's wakes."""
    time.sleep(IDLE_WAKES * IDLE_SECONDS + IDLE_SECONDS / 2)


def test_an_idle_server_opens_no_connection_and_a_busy_one_keeps_one(tmp_path: Path) -> None:
    logs = tmp_path / "dask"
    cluster = start_dask(logs, workers=1)
    try:
        env = {
            "TENSOR_DEBUGGER_DASK_SCHEDULER": cluster.address,
            "TENSOR_DEBUGGER_COMPARE_IDLE_SECONDS": str(IDLE_SECONDS),
        }
        server = started_server(tmp_path / "server", env=env)
        try:
            before, _ = clients(logs / "scheduler.log")
            idle()
            assert clients(logs / "scheduler.log") == (before, set())
            for n in range(2):  # two computations on the workers, one client
                compared_on_dask(server, tmp_path, f"on dask {n}", n)
                idle()
            received, kept = clients(logs / "scheduler.log")
            assert len(received) == len(before) + 1 and len(kept) == 1

            cluster.stop()  # the scheduler restarts (a new log): the server's client connects to the new one
            (logs / "scheduler.log").rename(logs / "scheduler-before.log")
            cluster = start_dask(logs, workers=1, port=int(urlparse(cluster.address).port or 0))
            compared_on_dask(server, tmp_path, "after a restart", 2)
            idle()
            received, kept = clients(logs / "scheduler.log")
            assert len(kept) == 1 and received.count(next(iter(kept))) == 1, received
            assert server.alive()
        finally:
            server.stop()
    finally:
        cluster.stop()
