"""The warm path: `compare` and `ingest` on the data dir of a running server hand it the work (found through
`<data dir>/server.json`) and print what they print without one; a file left by a server that is gone is ignored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import torch
from litestar.testing import TestClient
from tensor_debugger.cli.warm import PROBE_SECONDS, ServerProbe, probe_server
from tensor_debugger.demo.synthetic import Plant, write_dump
from tensor_debugger.settings import Settings
from tensor_debugger.web.address import ServerAddress, address_path, read_address, write_address
from tensor_debugger.web.app import create_app

from tests.support import loopback_http
from tests.support.cli_main import main_cli
from tests.support.dumps import make_zip, seeded
from tests.support.polling import wait_until
from tests.support.servers import LiveServer, child_env, cli_command, free_port, session_judged, started_server


def dumps(tmp_path: Path) -> tuple[Path, Path]:
    write_dump(tmp_path / "ref", layers=2, seed=5)
    write_dump(tmp_path / "cand", layers=2, seed=5, plant=Plant(layer=1, stage="post_attn", index=(3, 7), offset=0.5))
    return make_zip(tmp_path / "ref", tmp_path / "ref.zip"), make_zip(tmp_path / "cand", tmp_path / "cand.zip")


def without_ids(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload less what differs between data dirs: ids and the URL."""
    return {
        key: {k: v for k, v in value.items() if k not in ("id", "url")} if key in ("session", "run") else value
        for key, value in payload.items()
    }


def test_compare_uses_the_running_server_and_prints_the_same(shared_server: LiveServer, tmp_path: Path) -> None:
    a, b = dumps(tmp_path)
    address = read_address(shared_server.data_dir)
    assert address is not None and address.url == shared_server.url  # the server said where it answers
    assert address_path(shared_server.data_dir).stat().st_mode & 0o077 == 0  # its token: the owner's only

    warm = main_cli("--data-dir", str(shared_server.data_dir), "compare", str(a), str(b), "--name", "warm", "--json")
    assert warm.returncode == 1, warm.stderr
    payload = json.loads(warm.stdout)
    # the server did it: the session URL is the server's own (a command alone names its settings' port, 8000)
    assert payload["session"]["url"] == f"{shared_server.url}/sessions/{payload['session']['id']}"
    listed = loopback_http.get(f"{shared_server.url}/api/sessions", timeout=30).json()
    assert payload["session"]["id"] in [s["id"] for s in listed]

    cold = main_cli("--data-dir", str(tmp_path / "alone"), "compare", str(a), str(b), "--name", "warm", "--json")
    assert cold.returncode == 1, cold.stderr
    assert without_ids(json.loads(cold.stdout)) == without_ids(payload)

    failing = main_cli("--data-dir", str(shared_server.data_dir), "compare", str(a), str(b), "--fail-fast")
    assert failing.returncode == 1
    assert "FIRST DIVERGENCE: 1_post_attn" in failing.stdout

    missing = main_cli("--data-dir", str(shared_server.data_dir), "compare", str(a), str(tmp_path / "nothing"))
    assert missing.returncode == 2 and str(tmp_path / "nothing") in missing.stderr


def test_ingest_uses_the_running_server(shared_server: LiveServer, tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    torch.save(seeded((4, 4), 0), folder / "0_query.pth")
    (folder / "notes.txt").write_text("not a tensor")
    args = ("ingest", "--session", "warm ingest", "--run", "reference", str(folder), "--json")
    warm = main_cli("--data-dir", str(shared_server.data_dir), *args)
    cold = main_cli("--data-dir", str(tmp_path / "alone"), *args)
    assert warm.returncode == cold.returncode == 0, warm.stderr + cold.stderr
    out = json.loads(warm.stdout)
    assert without_ids(out) == without_ids(json.loads(cold.stdout))
    assert out["run"]["tensors"] == 1 and out["problems"][0]["file"] == f"{folder}/notes.txt"
    session = loopback_http.get(f"{shared_server.url}/api/sessions/{out['session']['id']}", timeout=30).json()
    assert [r["label"] for r in session["runs"]] == ["reference"]


def test_a_stale_address_is_ignored(tmp_path: Path) -> None:
    a, b = dumps(tmp_path)
    settings = Settings(data_dir=tmp_path / "data")
    settings.data_dir.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for stale in (
        ServerAddress(os.getpid(), f"http://127.0.0.1:{free_port()}", "t"),  # alive, but nothing answers there
        ServerAddress(int(gone.stdout), f"http://127.0.0.1:{free_port()}", "t"),  # its process has exited
    ):
        write_address(settings.data_dir, stale)
        assert probe_server(settings) == ServerProbe()  # no server: refused, or gone
    done = main_cli("--data-dir", str(settings.data_dir), "compare", str(a), str(b), "--json")
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["session"]["url"].startswith("http://127.0.0.1:8000/")  # done by itself


def test_a_server_that_does_not_answer_in_time(tmp_path: Path) -> None:
    """A server of this data dir that is alive but does not answer (here stopped by SIGSTOP; a loaded one is the
    same for the probe): the command compares by itself after one probe, says so on stderr, and names the
    session's page on that server, where it is once the server answers, not on the settings' default port."""
    a, b = dumps(tmp_path)
    server = started_server(tmp_path / "serving")
    assert server.process is not None
    try:
        os.kill(server.process.pid, signal.SIGSTOP)
        started = time.monotonic()
        done = main_cli("--data-dir", str(server.data_dir), "compare", str(a), str(b), "--name", "silent")
        waited = time.monotonic() - started
        os.kill(server.process.pid, signal.SIGCONT)
        assert done.returncode == 1, done.stderr
        assert f"the server at {server.url} (this data dir's) did not answer in" in done.stderr
        assert "open in the browser: " + server.url + "/sessions/" in done.stdout
        assert "8000" not in done.stdout and "serve, then" not in done.stdout
        assert waited >= PROBE_SECONDS  # it was asked, and waited for
        url = done.stdout.split("open in the browser: ", 1)[1].split()[0]
        page = loopback_http.get(url.replace("/sessions/", "/api/sessions/"), timeout=30)
        assert page.status_code == 200 and page.json()["name"] == "silent"
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


def test_the_app_removes_its_address_when_it_stops(tmp_path: Path) -> None:
    """The app's own start-up and shutdown (in this process: no port needed to see the file come and go)."""
    settings = Settings(data_dir=tmp_path / "data", demo=False)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        address = read_address(settings.data_dir)
        assert address is not None and address.pid == os.getpid()
        assert client.get("/api/local/", headers={"x-tensor-debugger-token": "guess"}).status_code == 403
        assert client.get("/api/local/").status_code == 403  # reading local paths takes the token
        mine = client.get("/api/local/", headers={"x-tensor-debugger-token": address.token})
        assert mine.status_code == 200 and mine.json()["database_url"] == settings.database_url
    assert not address_path(settings.data_dir).exists()


def test_finding_a_server_imports_nothing_heavy() -> None:
    """The warm path's point is to start nothing: what it imports leaves the database, arrays and torch alone."""
    heavy = ("sqlalchemy", "numpy", "zarr", "torch", "litestar")
    code = f"import sys, tensor_debugger.cli.warm; print([m for m in {heavy!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_compare_handed_to_the_server_and_stopped_by_ctrl_c_says_where_its_answer_is(
    shared_server: LiveServer, tmp_path: Path
) -> None:
    """Ctrl-C on a compare the server does: it said the server goes on (naming the server by its address record,
    token and all), and the same command again made "name (2)" beside it. The server does go on to the end, into
    the session named; the words say where its answer then is, and that the command again compares once more, into
    a new session, as it does; the token is not printed."""
    import sqlite3
    import tarfile
    import uuid

    import numpy as np

    reference, candidate = tmp_path / "ref", tmp_path / "port.tar"
    reference.mkdir()
    query = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    np.save(reference / "0_query.npy", query)
    np.save(tmp_path / "0_query.npy", query + np.float32(0.5))
    np.save(tmp_path / "1_big.npy", np.random.default_rng(1).standard_normal((12, 1024, 1024)).astype(np.float32))
    with tarfile.open(candidate, "w") as tar:
        tar.add(tmp_path / "0_query.npy", "0_query.npy")
        tar.add(tmp_path / "1_big.npy", "1_big.npy")
    name = f"ctrl-c {uuid.uuid4().hex[:8]}"
    database = shared_server.data_dir / "metadata.sqlite3"

    def runs() -> list[tuple[str, str]]:
        try:
            with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=1) as db:
                query = "select r.label, r.status from runs r join sessions s on s.id = r.session_id where s.name = ?"
                return [(str(label), str(status)) for label, status in db.execute(query, (name,))]
        except sqlite3.OperationalError:  # locked a moment
            return []

    command = [*cli_command(), "--data-dir", str(shared_server.data_dir), "compare", str(reference), str(candidate)]
    compare = subprocess.Popen(
        [*command, "--name", name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        # a pytest-xdist worker ignores SIGINT, and a child inherits that: Ctrl-C as a shell delivers it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        wait_until(lambda: ("port.tar", "ingesting") in runs(), what="the server to ingest the candidate", timeout=120)
        compare.send_signal(signal.SIGINT)
        _, err = compare.communicate(timeout=120)
    finally:
        if compare.poll() is None:
            compare.kill()
            compare.wait()
    address = read_address(shared_server.data_dir)
    assert address is not None
    assert compare.returncode == 130, err
    assert address.token not in err and "ServerAddress" not in err, err
    assert (
        f"the server at {shared_server.url} goes on with this compare to the end, into session {name!r} (or "
        f"{name + ' (2)'!r}... where that name was taken): its answer is on that session's page "
        f"({shared_server.url}/sessions lists it; so does `tensor-debugger sessions`). This command run again "
        "compares once more, into a new session."
    ) in " ".join(err.split()), err
    # it did go on: the session named holds both runs, ready, and its pairs are judged
    wait_until(lambda: sorted(runs()) == [("port.tar", "ready"), ("ref", "ready")], what="the compare to end")
    with httpx.Client(base_url=shared_server.url, timeout=30, headers=shared_server.auth) as client:
        listed = client.get("/api/sessions", params={"q": name}).json()
        (session,) = [s for s in listed if s["name"] == name]
        judged = session_judged(client, session["id"])
    assert judged["first_divergence"]["name"] == "0_query", judged["first_divergence"]
    again = main_cli(*command[len(cli_command()) :], "--name", name)
    assert again.returncode == 1, again.stderr
    assert f"a session named {name!r} exists already: this one is {name + ' (2)'!r}" in again.stdout
