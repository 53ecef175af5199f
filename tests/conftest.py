from __future__ import annotations

import compileall
import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import tensor_debugger
from tensor_debugger.engine.fused import configure
from tensor_debugger.resources import resource_dir
from tensor_debugger.settings import Settings

from tests.support.dask_cluster import DaskCluster
from tests.support.postgres import PostgresCluster, start_cluster
from tests.support.s3 import SeaweedS3, start_seaweed
from tests.support.servers import READ_TOKEN, WRITE_TOKEN, LiveServer, started_server
from tests.support.service_starts import ServiceStarts, needed_services
from tests.support.slow_first import SlowFirst
from tests.support.tiers import Tiers

if TYPE_CHECKING:  # imported where a fixture needs them: pytest-xdist's controller loads this file and runs no test
    from tensor_debugger.services import Services

    from tests.support.traces import WrittenTraces


def pytest_configure(config: pytest.Config) -> None:
    """The run's test files slowest first (tests/support/slow_first.py); the slow tier marked
    (tests/support/tiers.py)."""
    config.pluginmanager.register(SlowFirst(config), "tensor_debugger_slow_first")
    config.pluginmanager.register(Tiers(), "tensor_debugger_tiers")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Write the package's bytecode (and the migrations') once, before any test starts a Python process: with
    PYTHONDONTWRITEBYTECODE set (as here), every server, CLI and ingest child of the run would otherwise compile
    its ~120 modules again (about 0.3 s of CPU each, hundreds of processes). The processes only read it; an edited
    module's stale bytecode is ignored as Python always does."""
    for folder in (Path(tensor_debugger.__file__).parent, resource_dir("migrations")):
        compileall.compile_dir(folder, quiet=1)
    # The same for this process: pytest rewrites the asserts of every test module it imports, and caches the result
    # only where bytecode may be written (about 5 s of CPU per run otherwise).
    sys.dont_write_bytecode = False


@pytest.fixture(scope="session")
def service_starts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceStarts]:
    """Starts the PostgreSQL cluster, S3 server and Dask cluster that the run's tests need together, when a test
    first asks for one of them (tests/support/service_starts.py)."""
    starts = ServiceStarts(needed_services(request.session.items), tmp_path_factory)
    yield starts
    starts.stop_unused()


@pytest.fixture(scope="session")
def postgres(service_starts: ServiceStarts) -> Iterator[PostgresCluster]:
    """A PostgreSQL cluster of the run's own (tests/support/postgres.py), started when a test first asks for it."""
    started = service_starts.take("postgres")
    if isinstance(started, str):
        pytest.skip(started)
    assert isinstance(started, PostgresCluster)
    yield started
    started.stop()


@pytest.fixture(scope="session")
def s3(service_starts: ServiceStarts) -> Iterator[SeaweedS3]:
    """A SeaweedFS S3 server of the run's own (tests/support/s3.py), started when a test first asks for it."""
    started = service_starts.take("s3")
    if isinstance(started, str):
        pytest.skip(started)
    assert isinstance(started, SeaweedS3)
    yield started
    started.stop()


@pytest.fixture(scope="session")
def dask_cluster(request: pytest.FixtureRequest, service_starts: ServiceStarts) -> Iterator[DaskCluster]:
    """A Dask scheduler (with its dashboard) and two worker processes of the run's own
    (tests/support/dask_cluster.py), started when a test first asks for it; the workers reach the run's S3 server
    where there is one."""
    with contextlib.suppress(pytest.skip.Exception):  # no SeaweedFS here: the workers read arrays in folders only
        request.getfixturevalue("s3")  # torn down after the cluster
    started = service_starts.take("dask_cluster")
    assert isinstance(started, DaskCluster)
    yield started
    started.stop()


@pytest.fixture
def database_url(request: pytest.FixtureRequest) -> str:
    """The metadata database a test's settings name: "" (SQLite in the data dir) unless the test is parametrized
    over `tests.support.postgres.DATABASES` (indirect), where "postgresql" is a new database in the run's cluster."""
    if getattr(request, "param", "sqlite") == "sqlite":
        return ""
    cluster: PostgresCluster = request.getfixturevalue("postgres")
    return cluster.create_database()


@pytest.fixture
def store_url(request: pytest.FixtureRequest) -> str:
    """The array store a test's settings name: "" (a folder in the data dir) unless the test is parametrized over
    `tests.support.s3.STORES` (indirect), where "s3" is a new prefix in the run's S3 bucket."""
    if getattr(request, "param", "files") == "files":
        return ""
    server: SeaweedS3 = request.getfixturevalue("s3")
    return server.new_url()


@pytest.fixture
def dask_scheduler(request: pytest.FixtureRequest) -> str:
    """The Dask scheduler a test's settings name: "" (pairs computed in the process) unless the test is parametrized
    over tests/support/backends.py (indirect), where "dask" is the run's cluster."""
    if getattr(request, "param", "") != "dask":
        return ""
    cluster: DaskCluster = request.getfixturevalue("dask_cluster")
    return cluster.address


@pytest.fixture
def store_environ(request: pytest.FixtureRequest, store_url: str) -> dict[str, str]:
    """The AWS variables that reach the test's S3 store (none for a folder)."""
    if not store_url.startswith("s3://"):
        return {}
    server: SeaweedS3 = request.getfixturevalue("s3")
    return server.environ


@pytest.fixture
def settings(tmp_path: Path, database_url: str, store_url: str, dask_scheduler: str) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        demo=False,
        database_url=database_url,
        store_url=store_url,
        dask_scheduler=dask_scheduler,
    )


@pytest.fixture
def backend_env(
    database_url: str, store_url: str, dask_scheduler: str, store_environ: dict[str, str]
) -> dict[str, str]:
    """The environment variables that give a child process (the CLI, a server) the test's database, store and Dask
    scheduler: none for SQLite, a folder and no cluster."""
    env = {"TENSOR_DEBUGGER_DATABASE_URL": database_url, "TENSOR_DEBUGGER_DASK_SCHEDULER": dask_scheduler}
    return {k: v for k, v in env.items() if v} | _store_settings(store_url, store_environ)


@pytest.fixture
def services(settings: Settings, store_environ: dict[str, str]) -> Iterator[Services]:
    from tensor_debugger.services import open_services

    opened = open_services(settings, store_environ)
    yield opened
    opened.close()


@pytest.fixture(scope="session")
def hf_traces(tmp_path_factory: pytest.TempPathFactory) -> WrittenTraces:
    """Hugging Face debugger traces of a tiny random Llama (tests/support/traces.py), each written once per run (by
    whichever pytest worker first asks for it), and only read by the tests."""
    from tests.support.traces import WrittenTraces

    return WrittenTraces(tmp_path_factory)


@pytest.fixture
def live_server(
    tmp_path: Path, database_url: str, store_url: str, dask_scheduler: str, store_environ: dict[str, str]
) -> Iterator[LiveServer]:
    """A server of the test's own, on an empty data dir: for a test that restarts or kills it, looks at everything
    it holds (every session, its peak memory), or needs it empty."""
    env = _store_settings(store_url, store_environ)
    if dask_scheduler:
        env["TENSOR_DEBUGGER_DASK_SCHEDULER"] = dask_scheduler
    server = started_server(tmp_path, env=env, database_url=database_url)
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def default_kernels() -> Iterator[None]:
    """Every test starts and ends with the default statistics path and kernel family (a process-wide choice that
    some tests change)."""
    configure()
    yield
    configure()


@pytest.fixture(scope="session")
def _shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = started_server(tmp_path_factory.mktemp("shared-server"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def _shared_postgres_server(
    tmp_path_factory: pytest.TempPathFactory, postgres: PostgresCluster
) -> Iterator[LiveServer]:
    server = started_server(tmp_path_factory.mktemp("shared-postgres-server"), database_url=postgres.create_database())
    yield server
    server.stop()


@pytest.fixture(scope="session")
def _shared_s3_server(tmp_path_factory: pytest.TempPathFactory, s3: SeaweedS3) -> Iterator[LiveServer]:
    server = started_server(tmp_path_factory.mktemp("shared-s3-server"), env=_store_settings(s3.new_url(), s3.environ))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def _shared_cluster_server(
    tmp_path_factory: pytest.TempPathFactory, postgres: PostgresCluster, s3: SeaweedS3, dask_cluster: DaskCluster
) -> Iterator[LiveServer]:
    env = {**_store_settings(s3.new_url(), s3.environ), "TENSOR_DEBUGGER_DASK_SCHEDULER": dask_cluster.address}
    server = started_server(
        tmp_path_factory.mktemp("shared-cluster-server"), env=env, database_url=postgres.create_database()
    )
    yield server
    server.stop()


@pytest.fixture
def shared_server(request: pytest.FixtureRequest, database_url: str, store_url: str, dask_scheduler: str) -> LiveServer:
    """One server for the whole run, on a fresh data dir, for every test that only needs "a server" (one more on
    PostgreSQL, one more with its arrays on S3, and one on PostgreSQL, S3 and the Dask cluster for a test
    parametrized over tests/support/backends.py). A test using it names its sessions uniquely, looks only at its own
    sessions (by id), leaves nothing under way when it ends, and never stops, restarts or kills it."""
    if bool(database_url) + bool(store_url) + bool(dask_scheduler) not in (0, 1, 3):
        pytest.fail("no shared server has that mix of backends: parametrize over tests.support.backends.BACKENDS")
    which = (
        "_shared_cluster_server"
        if dask_scheduler
        else "_shared_postgres_server"
        if database_url
        else "_shared_s3_server"
        if store_url
        else "_shared_server"
    )
    shared: LiveServer = request.getfixturevalue(which)
    assert shared.alive(), f"the shared server has exited; its log: {shared.log}"
    return shared


def _store_settings(store_url: str, store_environ: dict[str, str]) -> dict[str, str]:
    """The environment variables that give a server process the store `store_url` ("" for its data dir's folder)."""
    return {"TENSOR_DEBUGGER_STORE_URL": store_url, **store_environ} if store_url else {}


@pytest.fixture(scope="session")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One server with a token and a read-only token for the whole run, bound to every address (0.0.0.0, which
    it may be since it has a token), for the tests of authentication, behind a reverse proxy on this machine (it
    trusts 127.0.0.1's X-Forwarded-For and -Proto, as the README tells a proxy's user to set). The same manners as
    `shared_server`."""
    server = started_server(
        tmp_path_factory.mktemp("token-server"),
        env={
            "TENSOR_DEBUGGER_TOKEN": WRITE_TOKEN,
            "TENSOR_DEBUGGER_READ_TOKEN": READ_TOKEN,
            "TENSOR_DEBUGGER_TRUSTED_PROXIES": "127.0.0.1",
        },
        args=("--host", "0.0.0.0"),
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def _outage_postgres() -> Iterator[list[PostgresCluster]]:
    """The worker's cluster for outages (`own_postgres`), started when a test first asks for it."""
    started: list[PostgresCluster] = []
    yield started
    for cluster in started:
        cluster.stop()


@pytest.fixture
def own_postgres(_outage_postgres: list[PostgresCluster]) -> Iterator[PostgresCluster]:
    """A PostgreSQL cluster that the test may pause and resume (an outage): not the run's shared one, which every other
    test on it would then find gone, but one per worker kept for these tests (an initdb and a start cost seconds
    each), each test in databases of its own (`create_database`). Running again when the test ends, however it
    ended; one that does not start again is replaced for the next test."""
    if not _outage_postgres:
        cluster = start_cluster()
        if isinstance(cluster, str):
            pytest.skip(cluster)
        _outage_postgres.append(cluster)
    cluster = _outage_postgres[0]
    yield cluster
    if not cluster.running:
        try:
            cluster.resume()
        except (RuntimeError, subprocess.TimeoutExpired):
            _outage_postgres.clear()
            cluster.stop()


@pytest.fixture(scope="session")
def _outage_s3() -> Iterator[list[SeaweedS3]]:
    """The worker's SeaweedFS for outages (`own_s3`), started when a test first asks for it."""
    started: list[SeaweedS3] = []
    yield started
    for server in started:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture
def own_s3(_outage_s3: list[SeaweedS3]) -> Iterator[SeaweedS3]:
    """A SeaweedFS server that the test may stop and restart, as `own_postgres`: one per worker, each test under a
    prefix of its own (`new_url`), running again when the test ends."""
    if not _outage_s3:
        root = Path(tempfile.mkdtemp(prefix="tensor-debugger-weed-"))
        server = start_seaweed(root)
        if isinstance(server, str):
            shutil.rmtree(root, ignore_errors=True)
            pytest.skip(server)
        _outage_s3.append(server)
    server = _outage_s3[0]
    yield server
    if server.process.poll() is not None:
        try:
            server.restart()
        except (RuntimeError, AssertionError):
            _outage_s3.clear()
            server.stop()
            shutil.rmtree(server.root, ignore_errors=True)
