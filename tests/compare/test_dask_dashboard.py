"""The Dask dashboard (README, "Cluster"): served by the scheduler with the cluster extra installed (Bokeh), and
showing a comparison's work, read the way a browser reads it (Bokeh's client API on the dashboard's documents).

The test has a cluster of its own: its "Compute Time Per Key" chart leaves out what took under 2% of its
largest entry, so on the run's shared cluster another test's big blocks could hide these small batches. One test,
so one cluster a run: as two tests of a module-scoped cluster, `--dist worksteal` gave each pytest worker that ran
one of them a cluster (three more Dask processes to start)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings

from tests.support import loopback_http
from tests.support.cli_main import main_cli
from tests.support.dask_cluster import DaskCluster, batch_seconds, start_dask, wait_for_batches
from tests.support.dumps import layered_dump


@pytest.fixture
def dask_cluster(tmp_path: Path) -> Iterator[DaskCluster]:
    """A scheduler with its dashboard and two workers for this module's test only (it reads arrays in folders)."""
    cluster = start_dask(tmp_path / "dashboard-dask", workers=2, dashboard=True)
    yield cluster
    cluster.stop()


def test_the_dashboard_shows_the_pairs_computed_on_the_cluster_by_a_server_and_by_a_cli_compare(
    tmp_path: Path, dask_cluster: DaskCluster
) -> None:
    """The dashboard answers and charts the batches of a comparison the services ran on the cluster; then
    `tensor-debugger compare` with TENSOR_DEBUGGER_DASK_SCHEDULER set (a laptop's CLI pointed at the stack) does
    not compare the pairs itself while the runs ingest: once planned, they are the workers' (as in a server), and
    the dashboard charts more batches."""
    status = loopback_http.get(f"{dask_cluster.dashboard}/status", follow_redirects=True, timeout=30)
    assert status.status_code == 200, status.text
    assert "Dask Diagnostic UI" in status.text and "needs bokeh" not in status.text
    plots = loopback_http.get(f"{dask_cluster.dashboard}/individual-plots.json", timeout=30).json()
    assert {"Individual Task Stream", "Individual Progress", "Individual Workers"} <= plots.keys()
    before = batch_seconds(dask_cluster.dashboard)

    services = open_services(Settings(data_dir=tmp_path / "data", demo=False, dask_scheduler=dask_cluster.address))
    try:
        for label, bug in (("reference", None), ("candidate", 2)):
            folder = layered_dump(tmp_path / label, bug)
            inputs = [InputFile(p, p.name) for p in sorted(folder.iterdir())]
            session_id = services.ingestor.ingest("dashboard", label, inputs).session_id
        services.plan(session_id)
        assert services.compute(session_id) == 8
    finally:
        services.close()
    wait_for_batches(dask_cluster.dashboard, before)

    # the CLI's compare, into a data dir of its own
    before = batch_seconds(dask_cluster.dashboard)
    ref, cand = layered_dump(tmp_path / "cli" / "ref", None), layered_dump(tmp_path / "cli" / "cand", 2)
    env = {"TENSOR_DEBUGGER_DASK_SCHEDULER": dask_cluster.address}
    done = main_cli("--data-dir", str(tmp_path / "cli" / "data"), "compare", str(ref), str(cand), "--json", env=env)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["first_divergence"]["name"] == "2_attn"
    wait_for_batches(dask_cluster.dashboard, before)
