"""The run's PostgreSQL cluster, SeaweedFS server and Dask cluster, one of each for the whole run however many
pytest-xdist workers it has: the first worker to need one starts it while holding a lock in the run's services
folder, and records there what reaches it (its addresses, ports and processes); a worker that comes later waits on
the lock and reads the record. Every process and idle tick of a service is then paid once a run, not once a worker.

No worker stops a shared service, since the other may still be using it: the controller (the one process of a run
without pytest-xdist) makes the folder, hands it to the workers (`workerinput`), and at its end, after the workers
have exited, stops every service recorded there, however the run ended (failures, -x, Ctrl-C). Tests that stop or
restart a service (outages, workers gone) keep instances of their own (tests/conftest.py's `own_postgres`, `own_s3`;
the Dask tests' own clusters)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from tests.support.dask_cluster import DaskCluster
from tests.support.postgres import PostgresCluster
from tests.support.s3 import SeaweedS3

PLUGIN = "tensor_debugger_run_services"  # its name in pytest's plugin manager
WORKER_INPUT = "tensor_debugger_services"  # the folder's key in a worker's `workerinput`

Service = PostgresCluster | SeaweedS3 | DaskCluster | str  # str: why it cannot start here (a skip)


class RunServices:
    """A pytest plugin (registered by tests/conftest.py): the run's services folder, stopped and removed by the
    controller at its end."""

    def __init__(self, config: pytest.Config) -> None:
        given = getattr(config, "workerinput", {}).get(WORKER_INPUT)
        self.controller = given is None
        self.folder = Path(given) if given else Path(tempfile.mkdtemp(prefix="tensor-debugger-services-"))

    @pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook, before it starts a worker
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[WORKER_INPUT] = str(self.folder)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.controller:
            stop_recorded(self.folder)
            shutil.rmtree(self.folder, ignore_errors=True)


def lock(folder: Path, name: str) -> IO[str]:
    """The lock on the service `name`, held (after waiting while another worker holds it) until the file returned is
    closed, by whichever thread."""
    held = open(folder / f"{name}.lock", "w")
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
    except BaseException:
        held.close()
        raise
    return held


@contextlib.contextmanager
def locked(folder: Path, name: str) -> Iterator[None]:
    """Hold the lock on the service `name` (waiting while another worker holds it)."""
    with lock(folder, name):
        yield


def shared(folder: Path, name: str, start: Callable[[], Service]) -> Service:
    """The run's service `name`: the one recorded in `folder`, else one that `start` starts now and that is recorded
    for the other workers (with why it cannot start, a skip, which they then skip too). A start that raised is
    recorded nowhere: the next test to ask tries again, as before."""
    with locked(folder, name):
        return recorded(folder, name) or record(folder, name, start())


def recorded(folder: Path, name: str) -> Service | None:
    """The service `name` as `record` wrote it down in `folder` (without its processes: another process's children);
    None before."""
    path = folder / f"{name}.json"
    if not path.exists():
        return None
    found: dict[str, Any] = json.loads(path.read_text())
    if "why" in found:
        return str(found["why"])
    if name == "postgres":
        return PostgresCluster(Path(found["bin_dir"]), Path(found["root"]), found["port"], migrated=True, running=True)
    if name == "s3":
        return SeaweedS3(
            Path(found["root"]),
            None,
            found["s3_port"],
            found["master_port"],
            master_grpc_port=found["master_grpc_port"],
            weed=found["weed"],
            args=tuple(found["args"]),
        )
    return DaskCluster(found["address"], Path(found["logs"]), dashboard=found["dashboard"])


def record(folder: Path, name: str, service: Service) -> Service:
    """Write down in `folder` what reaches `service` and what stops it (its processes, each by pid and start time,
    so that a pid the system gave to another process since is left alone); returns `service`."""
    found: dict[str, Any]
    if isinstance(service, str):
        found = {"why": service}
    elif isinstance(service, PostgresCluster):
        found = {"bin_dir": str(service.bin_dir), "root": str(service.root), "port": service.port}
    elif isinstance(service, SeaweedS3):
        assert service.process is not None, "a SeaweedFS server is recorded by the process that started it"
        found = {
            "root": str(service.root),
            "s3_port": service.s3_port,
            "master_port": service.master_port,
            "master_grpc_port": service.master_grpc_port,
            "weed": service.weed,
            "args": list(service.args),
            "processes": [_identity(service.process)],
        }
    else:
        found = {
            "address": service.address,
            "logs": str(service.logs),
            "dashboard": service.dashboard,
            "processes": [_identity(process) for process in service.processes],
        }
    written = folder / f"{name}.json.tmp"
    written.write_text(json.dumps(found))
    written.replace(folder / f"{name}.json")  # whole or absent to a reader that takes no lock (`stop_recorded`)
    return service


def forget(folder: Path, name: str) -> None:
    """Remove the record of the service `name` (one whose start failed after it was recorded: stopped already)."""
    (folder / f"{name}.json").unlink(missing_ok=True)


def stop_recorded(folder: Path) -> None:
    """Stop every service recorded in `folder`: the PostgreSQL cluster with pg_ctl (its folder removed), the others'
    processes killed (their data is the run's temporary files)."""
    for path in sorted(folder.glob("*.json")):
        found: dict[str, Any] = json.loads(path.read_text())
        if "bin_dir" in found:
            cluster = PostgresCluster(Path(found["bin_dir"]), Path(found["root"]), found["port"])
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):  # stopped already
                cluster.stop()
            shutil.rmtree(cluster.root, ignore_errors=True)
        for pid, started in found.get("processes", []):
            if _start_time(pid) == started:
                os.kill(pid, signal.SIGKILL)
        path.unlink()


def _identity(process: subprocess.Popen[bytes]) -> tuple[int, int | None]:
    return process.pid, _start_time(process.pid)


def _start_time(pid: int) -> int | None:
    """When the process `pid` started, in clock ticks after boot (/proc/PID/stat's 22nd field); None if none runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # the fields after the command's name start at the 3rd
