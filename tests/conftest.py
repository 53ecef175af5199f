from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from tensor_debugger.engine.fused import configure
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", demo=False)


@pytest.fixture
def services(settings: Settings) -> Iterator[Services]:
    opened = open_services(settings)
    yield opened
    opened.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli_command() -> list[str]:
    return [sys.executable, "-m", "tensor_debugger"]


@dataclass
class LiveServer:
    """`tensor-debugger serve` in a child process on loopback, as a user runs it."""

    data_dir: Path
    port: int
    demo: bool = False
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> subprocess.Popen[bytes]:
        """Start the server's process and return at once (`start` also waits until it answers)."""
        args = [*cli_command(), "--data-dir", str(self.data_dir), "serve", "--port", str(self.port)]
        if not self.demo:
            args.append("--no-demo")
        log = open(self.data_dir.parent / f"server-{self.port}.log", "ab")
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=_child_env())
        return self.process

    def start(self) -> LiveServer:
        self.launch()
        assert self.process is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}")
            try:
                if httpx.get(self.url + "/api/sessions", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("server did not start within 60 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_DEBUGGER_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[LiveServer]:
    server = LiveServer(tmp_path / "data", free_port())
    server.data_dir.mkdir(parents=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def default_kernels() -> Iterator[None]:
    """Every test starts and ends with the default statistics path and kernel family (a process-wide choice that
    some tests change)."""
    configure()
    yield
    configure()
