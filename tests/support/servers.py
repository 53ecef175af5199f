"""`tensor-debugger serve` in a child process on a loopback port, as a user runs it, uploads to it, and the CLI in a
child process."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support import loopback_http
from tests.support.polling import wait_until

WRITE_TOKEN = "write-token-for-tests-0123456789"
READ_TOKEN = "read-token-for-tests-0123456789"


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


_PICKED: set[int] = set()  # ports this process handed out: a server may not have bound its port yet
_CHOOSE = random.SystemRandom()  # not the `random` module's state, which test plugins may seed alike in workers


def free_port() -> int:
    """A loopback port free now, for a server started next. Chosen at random below the kernel's ephemeral range: a
    port the kernel handed out there (to a socket bound to port 0, such as a Dask dashboard's, or to a connection's
    own end) could be taken between this answer and the server's bind, which happened with SeaweedFS's S3 gateway
    (it binds seconds after it starts) while other servers started in other threads and pytest-xdist workers."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(1000):
        port = _CHOOSE.randrange(max(1024, low - 12000), low)
        if port in _PICKED:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _PICKED.add(port)
        return port
    with socket.socket() as s:  # that range is full: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli_command() -> list[str]:
    return [sys.executable, "-m", "tensor_debugger"]


# `python -m tensor_debugger ARGS`, once the process has asked the kernel to SIGKILL it when the thread that started it
# ends (PR_SET_PDEATHSIG, Linux; the parent's pid is the first argument): a server started by a pytest worker that
# ends without its teardown (killed, or its controller gone: bench/RESULTS.md found such servers running on) goes
# with it. Asked by the child itself, not in a `preexec_fn`, which is unsafe in a process with threads (pytest-xdist's
# workers have them); a parent already gone by then ends it at once. The thread matters: a server must be started
# from a thread that lives as long as the server should (every test starts its servers on its main thread).
_DIE_WITH_PARENT = """\
import ctypes, os, runpy, signal, sys
parent = int(sys.argv.pop(1))
if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
    sys.exit(f"prctl(PR_SET_PDEATHSIG) failed: errno {ctypes.get_errno()}")
if os.getppid() != parent:
    sys.exit(f"the process that started this server ({parent}) has ended")
runpy.run_module("tensor_debugger", run_name="__main__", alter_sys=True)
"""


def server_command() -> list[str]:
    """`cli_command()` for a server: on Linux, one that dies with this process (`_DIE_WITH_PARENT`)."""
    if not sys.platform.startswith("linux"):
        return cli_command()
    return [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid())]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`tensor-debugger ARGS` in a child process, with no TENSOR_DEBUGGER_ setting but those in `env`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_DEBUGGER_")}
    return subprocess.run(
        [*cli_command(), *args], capture_output=True, text=True, env={**base, **(env or {})}, timeout=120
    )


def child_env() -> dict[str, str]:
    """This process's environment without any TENSOR_DEBUGGER_ setting, so a child sees only what a test gives it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_DEBUGGER_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class LiveServer:
    """`tensor-debugger serve` in a child process on loopback, as a user runs it."""

    data_dir: Path
    port: int
    demo: bool = False
    process: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)  # TENSOR_DEBUGGER_ settings of the child (and AWS_* ones)
    args: tuple[str, ...] = ()  # more `serve` options
    database_url: str = ""  # "": SQLite in the data dir
    asked_to_stop: bool = field(default=False, init=False)  # SIGTERM sent (`ask_to_stop`): `stop` only waits

    @property
    def token(self) -> str | None:
        return self.env.get("TENSOR_DEBUGGER_TOKEN")

    @property
    def auth(self) -> dict[str, str]:
        """The headers a script sends it: its token, when it has one."""
        return bearer(self.token) if self.token else {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.data_dir.parent / f"server-{self.port}.log"

    def launch(self) -> subprocess.Popen[bytes]:
        """Start the server's process and return at once (`start` also waits until it answers)."""
        args = [*server_command(), "--data-dir", str(self.data_dir), "serve", "--port", str(self.port), *self.args]
        if not self.demo:
            args.append("--no-demo")
        log = open(self.log, "ab")
        env = {**child_env(), **self.env}
        if self.database_url:
            env["TENSOR_DEBUGGER_DATABASE_URL"] = self.database_url
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()  # the child has its own copy
        return self.process

    def start(self, timeout: float = 60) -> LiveServer:
        """Launch the server and wait until it answers; one that does not within `timeout` seconds (or whose wait
        is interrupted) is stopped before the error goes on, not left running with no one to stop it."""
        self.launch()
        try:
            wait_until(
                self.answers,
                what=f"the server on port {self.port} to answer GET /api/sessions",
                timeout=timeout,
                interval=0.02,
            )
        except BaseException:
            self.stop()
            raise
        return self

    def answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"server exited with {self.process.returncode}; its log: {self.log}")
        try:
            return loopback_http.get(self.url + "/api/sessions", headers=self.auth, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def ask_to_stop(self) -> None:
        """SIGTERM, once, and return at once: servers asked together stop together, each then waited for (`stop`).
        Once only: a second SIGTERM during the graceful stop would end it midway."""
        if self.process is not None and self.process.poll() is None and not self.asked_to_stop:
            self.process.terminate()
            self.asked_to_stop = True

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.ask_to_stop()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        self.asked_to_stop = False

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def started_server(
    root: Path,
    demo: bool = False,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    database_url: str = "",
) -> LiveServer:
    """A server on a new data dir, `root/data`, answering on a free port (its log beside the data dir), with the
    TENSOR_DEBUGGER_ settings in `env`, more `serve` options in `args`, its metadata in `database_url` ("": SQLite
    in the data dir)."""
    server = LiveServer(
        root / "data", free_port(), demo=demo, env=dict(env or {}), args=args, database_url=database_url
    )
    server.data_dir.mkdir(parents=True)
    return server.start()


def started_with_demo(demo_data: Path, root: Path) -> LiveServer:
    """A server of its own on `root/data`, a copy of a data dir whose demo session is computed (tests/web/conftest.py's
    `demo_data`): as after a first start with the demo, without generating and computing the demo again."""
    shutil.copytree(demo_data, root / "data")
    return LiveServer(root / "data", free_port(), demo=True).start()


def upload(server: LiveServer, name: str, files: list[tuple[str, Path]], url: str = "/api/sessions") -> httpx.Response:
    """POST `files` (form field, path) as a multipart upload, as the browser's form sends them."""
    handles = [(field, (path.name, open(path, "rb"))) for field, path in files]
    try:
        return loopback_http.post(
            server.url + url, data={"name": name}, files=handles, headers=server.auth, timeout=120
        )
    finally:
        for _, (_, handle) in handles:
            handle.close()


def wait_done(server: LiveServer, session_id: int, timeout: float = 120) -> dict[str, Any]:
    """The session's pairs report once every pair has a verdict."""
    report: dict[str, Any] = wait_until(
        lambda: loopback_http.get(
            f"{server.url}/api/sessions/{session_id}/pairs", headers=server.auth, timeout=30
        ).json(),
        until=lambda r: r["progress"]["total"] and r["progress"]["pending"] == 0,
        what=f"session {session_id}'s pairs to be computed",
        timeout=timeout,
        interval=0.03,
    )
    return report


def session_judged(client: httpx.Client, session_id: int) -> dict[str, Any]:
    """The session's pairs report (through `client`, an app's) once it has pairs and none is pending: what a
    `find_divergence` or capture into that app's data dir left to be judged."""
    report: dict[str, Any] = wait_until(
        lambda: client.get(f"/api/sessions/{session_id}/pairs").json(),
        until=lambda got: got["pairs"] and not got["progress"]["pending"],
        what=f"session {session_id} to be judged",
        timeout=120,
        interval=0.05,
    )
    return report


def wait_staging_empty(server: LiveServer) -> None:
    """Wait until the server's staging folder holds nothing: an upload's files go as its last ingest ends, which
    can be a moment after the request that waited for the ingests has returned."""
    staging = server.data_dir / "staging"
    wait_until(
        lambda: not staging.exists() or not list(staging.iterdir()),
        what=f"the staging folder of the server on port {server.port} to be empty",
        timeout=15,
    )
