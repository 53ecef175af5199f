from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tensor_debugger.engine.fused import configure
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings

from tests.support.s3 import SeaweedS3, start_seaweed
from tests.support.servers import LiveServer, started_server
from tests.support.traces import WrittenTraces


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A SeaweedFS S3 server of the run's own (tests/support/s3.py), started when a test first asks for it."""
    started = start_seaweed(tmp_path_factory.mktemp("seaweedfs"))
    if isinstance(started, str):
        pytest.skip(started)
    yield started
    started.stop()


@pytest.fixture
def store_url(request: pytest.FixtureRequest) -> str:
    """The array store a test's settings name: "" (a folder in the data dir) unless the test is parametrized over
    `tests.support.s3.STORES` (indirect), where "s3" is a new prefix in the run's S3 bucket."""
    if getattr(request, "param", "files") == "files":
        return ""
    server: SeaweedS3 = request.getfixturevalue("s3")
    return server.new_url()


@pytest.fixture
def store_environ(request: pytest.FixtureRequest, store_url: str) -> dict[str, str]:
    """The AWS variables that reach the test's S3 store (none for a folder)."""
    if not store_url.startswith("s3://"):
        return {}
    server: SeaweedS3 = request.getfixturevalue("s3")
    return server.environ


@pytest.fixture
def settings(tmp_path: Path, store_url: str) -> Settings:
    return Settings(data_dir=tmp_path / "data", demo=False, store_url=store_url)


@pytest.fixture
def services(settings: Settings, store_environ: dict[str, str]) -> Iterator[Services]:
    opened = open_services(settings, store_environ)
    yield opened
    opened.close()


@pytest.fixture(scope="session")
def hf_traces(tmp_path_factory: pytest.TempPathFactory) -> WrittenTraces:
    """Hugging Face debugger traces of a tiny random Llama (tests/support/traces.py), each written once per run when
    a test first asks for it, and only read by the tests."""
    return WrittenTraces(tmp_path_factory.mktemp("traces"))


@pytest.fixture
def live_server(tmp_path: Path, store_url: str, store_environ: dict[str, str]) -> Iterator[LiveServer]:
    """A server of the test's own, on an empty data dir: for a test that restarts or kills it, looks at everything
    it holds (every session, its peak memory), or needs it empty."""
    server = started_server(tmp_path, env=_store_settings(store_url, store_environ))
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
def _shared_s3_server(tmp_path_factory: pytest.TempPathFactory, s3: SeaweedS3) -> Iterator[LiveServer]:
    server = started_server(tmp_path_factory.mktemp("shared-s3-server"), env=_store_settings(s3.new_url(), s3.environ))
    yield server
    server.stop()


@pytest.fixture
def shared_server(request: pytest.FixtureRequest, store_url: str) -> LiveServer:
    """One server for the whole run, on a fresh data dir, for every test that only needs "a server" (one more with
    its arrays on S3, for a test parametrized over both stores). A test using it names its sessions uniquely, looks
    only at its own sessions (by id), leaves nothing under way when it ends, and never stops, restarts or kills it."""
    shared: LiveServer = request.getfixturevalue("_shared_s3_server" if store_url else "_shared_server")
    assert shared.alive(), f"the shared server has exited; its log: {shared.log}"
    return shared


def _store_settings(store_url: str, store_environ: dict[str, str]) -> dict[str, str]:
    """The environment variables that give a server process the store `store_url` ("" for its data dir's folder)."""
    return {"TENSOR_DEBUGGER_STORE_URL": store_url, **store_environ} if store_url else {}
