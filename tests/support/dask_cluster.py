"""A real Dask cluster for the tests and benchmarks: `dask scheduler` and `dask worker` processes (from the
`distributed` package of the test extra) on loopback, each worker with one thread and no nanny, given the
environment that reaches the run's stores (the AWS variables of an S3 server)."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.polling import wait_until
from tests.support.servers import child_env, free_port


@dataclass
class DaskCluster:
    """A running scheduler and its workers; `stop` kills them all."""

    address: str  # tcp://127.0.0.1:PORT
    logs: Path
    dashboard: str = ""  # http://127.0.0.1:PORT of the scheduler's dashboard, "" when started without
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def workers(self) -> int:
        """How many workers the scheduler knows now."""
        from distributed import Client

        for process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(f"a dask process exited with {process.returncode}; logs in {self.logs}")
        try:
            with Client(self.address, timeout=2, set_as_default=False) as client:  # type: ignore[no-untyped-call]
                return len(client.scheduler_info()["workers"])
        except OSError:
            return 0

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()


# Dask's own housekeeping, slowed down for the tests: an idle process checks its event loop every 20 ms, samples
# its threads every 10 ms and the system every 0.5 s, about 2% of a core each for the whole run (the clusters live
# as long as their test worker). What the tests read (results, the task stream the dashboard charts) is untouched.
QUIET = {
    "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "1s",
    "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "5s",
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
}


def start_dask(
    logs: Path, workers: int, environ: dict[str, str] | None = None, dashboard: bool = False, port: int = 0
) -> DaskCluster:
    """A scheduler and `workers` worker processes (one thread each) on free loopback ports (the scheduler on `port`
    where given: a scheduler restarted), their logs under `logs`, the workers' environment this process's plus
    `environ`, the scheduler's dashboard on a free port too with `dashboard`; returned once every worker has
    joined."""
    dask = str(Path(sys.executable).with_name("dask"))
    port = port or free_port()
    logs.mkdir(parents=True, exist_ok=True)
    cluster = DaskCluster(f"tcp://127.0.0.1:{port}", logs)
    plain = ["--host", "127.0.0.1", "--no-dashboard"]
    shown = ["--host", "127.0.0.1", "--dashboard-address", f"127.0.0.1:{free_port()}"] if dashboard else plain
    cluster.dashboard = f"http://{shown[-1]}" if dashboard else ""
    commands = [("scheduler", ["scheduler", "--port", str(port), *shown])]
    commands += [
        (f"worker{n}", ["worker", cluster.address, "--nthreads", "1", "--no-nanny", *plain]) for n in range(workers)
    ]
    try:
        for name, args in commands:
            with open(logs / f"{name}.log", "ab") as log:
                env = {**child_env(), **QUIET, **(environ or {})}
                cluster.processes.append(subprocess.Popen([dask, *args], stdout=log, stderr=subprocess.STDOUT, env=env))
        wait_until(
            lambda: cluster.workers() == workers, what=f"{workers} Dask workers to join", timeout=90, interval=0.5
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def dashboard_compute_times(dashboard: str) -> dict[str, float]:
    """Seconds of compute per task name, as the dashboard at `dashboard` (http://HOST:PORT) shows them in its
    "Compute Time Per Key" chart, read the way a browser reads it (Bokeh's client API); empty when the chart cannot
    be read, as before the cluster's first task (the chart has no data yet and Bokeh fails to send it). Read in a
    thread of its own: Bokeh's client runs an event loop, which fails in a thread where one runs already (Playwright's
    sync API keeps one in the main thread once a browser test has run in the process)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_compute_times, dashboard).result()


def _compute_times(dashboard: str) -> dict[str, float]:
    from bokeh.client import pull_session
    from bokeh.models import ColumnDataSource

    try:
        with pull_session(url=f"{dashboard}/individual-compute-time-per-key") as session:
            document = session.document  # None where no document came (newer Bokeh types it so)
            found = [] if document is None else list(document.select({"type": ColumnDataSource}))
    except RuntimeError:
        return {}
    sources = [s for s in found if isinstance(s, ColumnDataSource) and "names" in s.data]
    return {name: float(t) for s in sources for name, t in zip(s.data["names"], s.data["times"], strict=True)}


def batch_seconds(dashboard: str) -> float:
    """Seconds the dashboard at `dashboard` shows spent in `compute_batch` tasks (the pending pairs' batches)."""
    return dashboard_compute_times(dashboard).get("compute_batch", 0.0)


def wait_for_batches(dashboard: str, before: float) -> None:
    """Wait until the dashboard shows more `compute_batch` time than `before` (what `batch_seconds` gave earlier):
    the scheduler shows a task once its worker reports it done, which on a loaded machine can trail the result."""
    wait_until(
        lambda: batch_seconds(dashboard),
        what="the comparison's compute_batch tasks on the dashboard",
        until=lambda seconds: seconds > before,
        timeout=30,
        interval=0.5,
    )
