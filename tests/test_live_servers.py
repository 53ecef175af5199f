"""The servers the tests start (tests/support/servers.py) end with the tests: one whose start fails is stopped, and
one whose test process ends without its teardown (a pytest worker killed, or left by its controller) dies with it.
Both used to run on after the run (bench/RESULTS.md, "one PostgreSQL, SeaweedFS and Dask cluster per run")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support.polling import wait_until
from tests.support.servers import LiveServer, child_env, free_port

REPO = Path(__file__).resolve().parent.parent

# a worker-like parent: starts a server as the tests do, says its pid, and waits to be killed
PARENT = """\
import sys, time
from pathlib import Path
from tests.support.servers import started_server
server = started_server(Path(sys.argv[1]))
print(server.process.pid, flush=True)
time.sleep(600)
"""


def gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def servers_on(data: Path) -> list[psutil.Process]:
    """This process's children serving `data`."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if str(data) in child.cmdline() and not gone(child):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "server")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=child_env(),
    )
    server: psutil.Process | None = None
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()  # the server's pid once it answers ("" if the parent failed)
        assert line.strip().isdigit(), (line, parent.communicate(timeout=30))
        server = psutil.Process(int(line))
        assert not gone(server) and server.ppid() == parent.pid
        parent.kill()  # no teardown, no atexit: as a worker killed, or ended by its controller
        parent.communicate()
        wait_until(lambda: gone(server), what="the server to end with the process that started it", timeout=30)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.communicate()
        if server is not None and not gone(server):
            server.kill()  # the test has failed: it leaves no server behind either


def test_a_server_that_does_not_answer_in_time_is_stopped(tmp_path: Path) -> None:
    """`start` gave up waiting and raised, leaving the process it had launched running with no one to stop it (an
    overloaded machine: a server not answering within 60 s)."""
    data = tmp_path / "data"
    data.mkdir()
    # it listens on another port (the last --port counts): it never answers on its own
    server = LiveServer(data, free_port(), args=("--port", str(free_port())))
    try:
        with pytest.raises(AssertionError, match="to answer GET /api/sessions"):
            server.start(timeout=1)
        assert servers_on(data) == []
    finally:
        for left in servers_on(data):
            left.kill()
            left.wait()
