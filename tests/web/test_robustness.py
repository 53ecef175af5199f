"""Nothing a careless or hostile upload does takes the server down or leaves anything behind, on the real server
process: a zip of zips, a full disk, a server killed mid-upload, two runs racing."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support import loopback_http as http
from tests.support.bombs import nested_zip_bomb
from tests.support.cli_main import main_cli
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
    assert http.get(shared_server.url + "/api/sessions").status_code == 200


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


def test_a_killed_servers_staging_is_removed_and_its_accepted_upload_ingested_at_restart(
    tmp_path: Path, big_tar: Path
) -> None:
    server = started_server(tmp_path)
    try:
        sock = stalled_upload(server, "stalled.pth", 4 << 20)
        wait_until(lambda: folders(server, "upload"), what="the stalled upload's staging folder", timeout=30)
        with open(big_tar, "rb") as f:
            sent = http.post(
                server.url + "/api/sessions",
                params={"wait": "false"},
                data={"name": "killed mid-ingest"},
                files=[("ref", ("big.tar", f))],
                timeout=120,
            )
        assert sent.status_code == 202, sent.text
        [folder] = wait_until(
            lambda: folders(server, "ingest"), what="the ingest's staging folder", timeout=30, interval=0.01
        )
        child = int(folder.name.split("-")[2].split(".")[0])  # the folder is named for the process that ingests
        os.kill(child, signal.SIGSTOP)  # frozen mid-ingest, then killed with its server, as in a crash
        assert server.process is not None
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
        os.kill(child, signal.SIGKILL)
        sock.close()
        assert folders(server, "upload") and folders(server, "ingest")
        accepted = {p.name for p in folders(server, "upload") if any(p.rglob("big.tar"))}
        assert len(accepted) == 1
        server.port = free_port()
        server.start()  # its start-up removes what the killed process left, but the accepted upload's files
        assert {p.name for p in folders(server, "upload")} <= accepted and not folders(server, "ingest")
        # the accepted upload is ingested again from its files, which go once it is
        runs = wait_until(
            lambda: http.get(server.url + "/api/sessions").json()[0]["runs"],
            until=lambda runs: runs[0]["status"] != "ingesting",
            what="the accepted upload's run to be ingested again",
            timeout=60,
        )
        assert [(r["label"], r["status"], r["tensors"]) for r in runs] == [("ref", "ready", 1)]
        wait_until(lambda: staging_left(server) == [], what="the staging folder to be empty", timeout=15)
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
                "--in-process",  # not handed to the server (the warm path): this process is the one killed
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
        ingest.wait()  # its folder stays until the server's next sweep (every second here): no look in between
        wait_until(lambda: staging_left(server) == [], what="the sweep to remove the CLI's staging", timeout=30)
        wait_until(
            lambda: http.get(server.url + "/api/sessions").json() == [],
            what="the sweep to remove the CLI's half-ingested run",
            timeout=30,
        )
    finally:
        server.stop()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB file system of its own: a tmpfs, else a loop device (both need root); skipped when neither mounts."""
    where = tmp_path / "small"
    where.mkdir()
    tried = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)], capture_output=True)
    if tried.returncode != 0:
        image = tmp_path / "small.img"
        with open(image, "wb") as f:
            f.truncate(16 << 20)
        made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True)
        looped = made.returncode == 0 and (
            subprocess.run(["mount", "-o", "loop", str(image), str(where)], capture_output=True).returncode == 0
        )
        if not looped:
            pytest.skip(
                f"cannot mount a small file system here (tmpfs: {tried.stderr.decode().strip()}; no loop device)"
            )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_out_of_disk_space_is_507_the_run_failed_and_the_session_usable(small_disk: Path, tmp_path: Path) -> None:
    server = started_server(small_disk)
    try:
        rng = np.random.default_rng(1)
        big = tmp_path / "big.npy"  # 12 MiB that do not compress: staged, then copied into arrays, past 16 MiB
        np.save(big, rng.standard_normal((3, 1024, 1024), dtype=np.float32))
        made = upload(server, "full disk", [("ref", big)])
        assert made.status_code == 507, made.text
        assert "out of disk space" in made.json()["detail"]
        [session] = http.get(server.url + "/api/sessions").json()
        [run] = session["runs"]
        assert (run["label"], run["status"]) == ("ref", "failed")
        detail = http.get(f"{server.url}/api/sessions/{session['id']}").json()
        assert any("out of disk space" in p["reason"] for p in detail["runs"][0]["problems"]), detail
        assert staging_left(server) == []

        huge = tmp_path / "huge.pth"  # more than the disk holds: the upload itself runs out
        with open(huge, "wb") as f:
            f.truncate(24 << 20)
        sent = upload(server, "too big", [("ref", huge)], url=f"/api/sessions/{session['id']}/runs")
        assert sent.status_code == 507, sent.text
        assert "out of disk space writing the upload" in sent.json()["detail"]
        assert staging_left(server) == []

        small = tmp_path / "small.npy"  # the session still takes runs
        np.save(small, rng.standard_normal((4, 4), dtype=np.float32))
        added = upload(server, "", [("cand", small)], url=f"/api/sessions/{session['id']}/runs")
        assert added.status_code == 201, added.text
        assert http.get(f"{server.url}/sessions/{session['id']}").status_code == 200
    finally:
        server.stop()
    cli = small_disk / "cli"  # the command line: exit status 2, the reason, and the run kept as failed
    dump = tmp_path / "dump"  # 24 MiB of arrays to write
    dump.mkdir()
    for name in ("0_a.npy", "0_b.npy"):
        os.link(big, dump / name)
    # in this process (what it prints and stores is the point here, not its start-up)
    refused = main_cli("--data-dir", str(cli), "ingest", "--session", "full", "--run", "ref", str(dump))
    assert refused.returncode == 2 and "out of disk space" in refused.stderr
    listing = main_cli("--data-dir", str(cli), "sessions", "--json")
    assert listing.returncode == 0
    listed = json.loads(listing.stdout)
    assert [(r["label"], r["status"]) for r in listed[0]["runs"]] == [("ref", "failed")]


def test_an_ingest_process_killed_midway_fails_its_run_and_the_next_ingest_works(
    shared_server: LiveServer, tmp_path: Path, big_tar: Path
) -> None:
    for _ in range(5):  # a fast machine may finish the ingest before the child is caught: then upload again
        made = http.post(shared_server.url + "/api/sessions", json={"name": "child killed"})
        session_id = made.json()["id"]
        runs_url = f"{shared_server.url}/api/sessions/{session_id}/runs"
        with open(big_tar, "rb") as f:
            sent = http.post(
                runs_url, params={"label": "big", "wait": "false"}, files=[("r", ("big.tar", f))], timeout=120
            )
        assert sent.status_code == 202, sent.text
        [folder] = wait_until(
            lambda: folders(shared_server, "ingest"), what="the ingest's staging folder", timeout=60, interval=0.01
        )
        child = int(folder.name.split("-")[2].split(".")[0])  # the folder is named for the process that ingests
        assert shared_server.process is not None and child != shared_server.process.pid
        os.kill(child, signal.SIGSTOP)  # frozen: what the run's row says now is what it will say when killed
        status = http.get(f"{shared_server.url}/api/sessions/{session_id}").json()["runs"][0]["status"]
        os.kill(child, signal.SIGKILL)
        if status == "ingesting":
            break
    else:
        pytest.fail("every ingest was done before its child could be stopped")
    runs = wait_until(
        lambda: http.get(f"{shared_server.url}/api/sessions/{session_id}").json()["runs"],
        until=lambda runs: runs[0]["status"] != "ingesting",
        what="the run to end",
        timeout=60,
    )
    assert runs[0]["status"] == "failed"
    assert "the ingest's process died" in runs[0]["problems"][0]["reason"]
    progress = http.get(f"{shared_server.url}/api/sessions/{session_id}/progress").json()
    assert progress["runs"][0]["words"].startswith(
        "failed: the ingest's process died "
    )  # the cause, not "nothing usable"
    small = tmp_path / "0_query.npy"
    np.save(small, np.ones((4, 4), dtype=np.float32))
    again = upload(shared_server, "", [("small", small)], url=f"/api/sessions/{session_id}/runs")
    assert again.status_code == 201, again.text
    # the dead child's staging is swept (by the thread that saw it die, which may still be at it)
    wait_until(lambda: not folder.exists(), what=f"the dead child's staging folder {folder} to be swept", timeout=30)


def test_a_server_stopped_with_sigterm_exits_cleanly_after_its_ingests(tmp_path: Path) -> None:
    """SIGTERM: a graceful stop, then an exit 0 that runs what registered to run at exit (the ingest children's
    semaphores unlinked: killed by the signal, the server leaked them, and said so in its log)."""
    server = started_server(tmp_path)
    dump = tmp_path / "dump.npy"
    np.save(dump, np.arange(64, dtype=np.float32))
    try:
        assert upload(server, "before a stop", [("reference", dump)]).status_code == 201
    finally:
        assert server.process is not None
        process = server.process
        server.stop()
    assert process.returncode == 0
    assert "leaked" not in server.log.read_text()
