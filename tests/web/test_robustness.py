"""Nothing a careless or hostile upload does takes the server down or leaves anything behind, on the real server
process: a zip of zips, a full disk, a server killed mid-upload, two runs racing."""

from __future__ import annotations

import signal
import socket
import subprocess
import tarfile
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.support.bombs import nested_zip_bomb
from tests.support.polling import wait_until
from tests.support.servers import LiveServer, child_env, cli_command, free_port, started_server, upload


def staging_left(server: LiveServer) -> list[str]:
    staging = server.data_dir / "staging"
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


def test_zip_of_zips_is_refused_within_seconds(shared_server: LiveServer, tmp_path: Path) -> None:
    bomb = nested_zip_bomb(tmp_path / "bomb.zip")  # about 20 KB holding eight zips of 1 GiB of zeros each
    response = upload(shared_server, "nested bomb", [("ref", bomb)])  # refused by declared sizes: nothing written
    assert response.status_code == 422, response.text
    problems = response.json()["runs"][0]["problems"]
    assert [p["file"] for p in problems] == [f"bomb.zip/inner{i}.zip" for i in range(8)]
    assert all("TENSOR_DEBUGGER_MAX_EXPANSION_RATIO" in p["reason"] for p in problems)
    wait_until(lambda: staging_left(shared_server) == [], what="staging to be emptied", timeout=10)
    assert httpx.get(shared_server.url + "/api/sessions").status_code == 200


@pytest.fixture(scope="module")
def big_tar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 48 MiB tensor in an uncompressed tar: unpacked and copied for a second or more."""
    folder = tmp_path_factory.mktemp("big")
    np.save(folder / "0_query.npy", np.random.default_rng(0).standard_normal((12, 1024, 1024), dtype=np.float32))
    with tarfile.open(folder / "big.tar", "w") as tar:
        tar.add(folder / "0_query.npy", "0_query.npy")
    (folder / "0_query.npy").unlink()
    return folder / "big.tar"


def stalled_upload(server: LiveServer, filename: str, sent: int) -> socket.socket:
    """An upload whose client sent the headers and `sent` bytes of a file, then stopped (the socket stays open)."""
    boundary = "stalled"
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="ref"; filename="{filename}"\r\n\r\n'.encode()
    length = len(head) + 100 * sent
    sock = socket.create_connection(("127.0.0.1", server.port))
    request = (
        f"POST /api/sessions?wait=false HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {length}\r\n\r\n"
    )
    sock.sendall(request.encode() + head + bytes(sent))
    return sock


def folders(server: LiveServer, kind: str) -> list[Path]:
    staging = server.data_dir / "staging"
    return [p for p in staging.iterdir() if p.name.startswith(kind + "-")] if staging.exists() else []


def test_staging_of_a_killed_server_is_removed_at_its_restart(tmp_path: Path, big_tar: Path) -> None:
    server = started_server(tmp_path)
    try:
        sock = stalled_upload(server, "stalled.pth", 4 << 20)
        wait_until(lambda: folders(server, "upload"), what="the stalled upload's staging folder", timeout=30)
        with open(big_tar, "rb") as f:
            sent = httpx.post(
                server.url + "/api/sessions",
                params={"wait": "false"},
                data={"name": "killed mid-ingest"},
                files=[("ref", ("big.tar", f))],
                timeout=120,
            )
        assert sent.status_code == 202, sent.text
        wait_until(lambda: folders(server, "ingest"), what="the ingest's staging folder", timeout=30, interval=0.01)
        assert server.process is not None
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
        sock.close()
        assert folders(server, "upload") and folders(server, "ingest")
        server.port = free_port()
        server.start()  # its start-up removes what the killed process left
        assert staging_left(server) == []
        assert httpx.get(server.url + "/api/sessions").json() == []  # the half-ingested run and its session too
    finally:
        server.stop()


def test_a_running_server_sweeps_what_a_killed_cli_ingest_left(tmp_path: Path, big_tar: Path) -> None:
    server = started_server(tmp_path, env={"TENSOR_DEBUGGER_STAGING_SWEEP_SECONDS": "1"})
    try:
        ingest = subprocess.Popen(
            [
                *cli_command(),
                "--data-dir",
                str(server.data_dir),
                "ingest",
                "--session",
                "cli",
                "--run",
                "a",
                str(big_tar),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=child_env(),
        )
        wait_until(lambda: folders(server, "ingest"), what="the CLI's staging folder", timeout=60, interval=0.01)
        ingest.send_signal(signal.SIGKILL)
        ingest.wait()
        assert folders(server, "ingest")
        wait_until(lambda: staging_left(server) == [], what="the sweep to remove the CLI's staging", timeout=30)
        wait_until(
            lambda: httpx.get(server.url + "/api/sessions").json() == [],
            what="the sweep to remove the CLI's half-ingested run",
            timeout=30,
        )
    finally:
        server.stop()
