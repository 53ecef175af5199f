"""Every Dask worker killed during a comparison: the computation waits TENSOR_DEBUGGER_DASK_NO_WORKER_SECONDS for
one, then stops; `compare` exits 2 saying that no worker has been connected to the scheduler, its pairs still
pending (no verdict on them); a server on the same data dir computes them once a worker is back. It used to wait
forever (Dask keeps a task whose workers all died for the next worker that joins)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from distributed import Client
from tensor_debugger.demo.synthetic import Plant, write_dump

from tests.support.dask_cluster import QUIET, start_dask
from tests.support.polling import wait_until
from tests.support.servers import LiveServer, child_env, cli_command, free_port, wait_done

NO_WORKER_SECONDS = 3.0


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
        with Client(cluster.address, timeout=10, set_as_default=False) as client:  # type: ignore[no-untyped-call]
            wait_until(
                lambda: any(client.processing().values()),
                what="the comparison's tasks on the worker",
                timeout=90,
                interval=0.2,
            )
        worker.kill()  # SIGKILL, mid-compute: the scheduler has no worker left
        worker.wait()
        cluster.processes.remove(worker)  # gone for good: the cluster's checks look at the living ones
        killed = time.monotonic()
        out, err = compare.communicate(timeout=60)
        waited = time.monotonic() - killed
        assert compare.returncode == 2, (out, err)
        assert NO_WORKER_SECONDS <= waited < NO_WORKER_SECONDS + 20, waited
        message = f"no Dask worker has been connected to {cluster.address} for 3 s"
        report = json.loads(out)
        assert message in report["error"], report["error"]
        statuses = [p["status"] for p in report["pairs"]]
        assert statuses and set(statuses) == {"pending"}, statuses
        assert report["verdict"] != "no_divergence"

        # a worker is back: a server on the same data dir computes the pairs left pending
        with open(tmp_path / "dask" / "worker-again.log", "ab") as log:
            command = [str(Path(sys.executable).with_name("dask")), "worker", cluster.address, "--nthreads", "1"]
            command += ["--no-nanny", "--host", "127.0.0.1", "--no-dashboard"]
            again = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**child_env(), **QUIET})
        cluster.processes.append(again)
        wait_until(cluster.workers, what="the new worker to join", timeout=60, interval=0.5)
        server = LiveServer(data, free_port(), env={k: v for k, v in env.items() if k.startswith("TENSOR_")}).start()
        try:
            done = wait_done(server, report["session"]["id"], timeout=90)
            assert done["first_divergence"]["name"] == "1_post_mlp"
            assert server.alive()
        finally:
            server.stop()
    finally:
        cluster.stop()
