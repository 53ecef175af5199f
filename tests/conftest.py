from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tensor_debugger.engine.fused import configure
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings

from tests.support.servers import READ_TOKEN, WRITE_TOKEN, LiveServer, started_server
from tests.support.traces import WrittenTraces


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", demo=False)


@pytest.fixture
def services(settings: Settings) -> Iterator[Services]:
    opened = open_services(settings)
    yield opened
    opened.close()


@pytest.fixture(scope="session")
def hf_traces(tmp_path_factory: pytest.TempPathFactory) -> WrittenTraces:
    """Hugging Face debugger traces of a tiny random Llama (tests/support/traces.py), each written once per run when
    a test first asks for it, and only read by the tests."""
    return WrittenTraces(tmp_path_factory.mktemp("traces"))


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[LiveServer]:
    """A server of the test's own, on an empty data dir: for a test that restarts or kills it, looks at everything
    it holds (every session, its peak memory), or needs it empty."""
    server = started_server(tmp_path)
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


@pytest.fixture
def shared_server(_shared_server: LiveServer) -> LiveServer:
    """One server for the whole run, on a fresh data dir, for every test that only needs "a server". A test using
    it names its sessions uniquely, looks only at its own sessions (by id), leaves nothing under way when it ends,
    and never stops, restarts or kills it."""
    assert _shared_server.alive(), f"the shared server has exited; its log: {_shared_server.log}"
    return _shared_server


@pytest.fixture(scope="session")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One server with a token and a read-only token for the whole run, bound to every address (0.0.0.0, which
    it may be since it has a token), for the tests of authentication. The same manners as `shared_server`."""
    server = started_server(
        tmp_path_factory.mktemp("token-server"),
        env={"TENSOR_DEBUGGER_TOKEN": WRITE_TOKEN, "TENSOR_DEBUGGER_READ_TOKEN": READ_TOKEN},
        args=("--host", "0.0.0.0"),
    )
    yield server
    server.stop()
