"""`serve` beyond loopback needs a token or an explicit --no-auth; `ingest` and `sessions` through a server with a
token (`--server`, `--token` or TENSOR_DEBUGGER_TOKEN): refusals on real processes (their exit status and words), the
commands that go on to talk to the server through `main(argv)` in this process (tests/support/cli_main.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support import loopback_http as http
from tests.support.cli_main import main_cli
from tests.support.dumps import named_dump
from tests.support.servers import READ_TOKEN, WRITE_TOKEN, LiveServer, bearer, free_port, run_cli


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "gpu-box.lab.example"])
def test_serve_beyond_loopback_without_a_token_refuses_to_start(tmp_path: Path, host: str) -> None:
    done = run_cli("--data-dir", str(tmp_path / "data"), "serve", "--host", host, "--port", str(free_port()))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "TENSOR_DEBUGGER_TOKEN" in done.stderr and "--no-auth" in done.stderr
    assert not (tmp_path / "data").exists()  # it stopped before opening anything


def test_a_token_too_short_is_refused_by_name(tmp_path: Path) -> None:
    done = run_cli("--data-dir", str(tmp_path), "serve", env={"TENSOR_DEBUGGER_TOKEN": "secret"})
    assert done.returncode == 2 and "TENSOR_DEBUGGER_TOKEN" in done.stderr and "16 characters" in done.stderr


def test_no_auth_serves_beyond_loopback_with_a_warning(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    server = LiveServer(tmp_path / "data", free_port(), args=("--host", "0.0.0.0", "--no-auth")).start()
    try:
        assert http.get(server.url + "/api/sessions").status_code == 200  # no token asked
        assert http.get(server.url + "/login").status_code == 404  # and no login page
    finally:
        server.stop()
    log = server.log.read_text()
    assert "WARNING: --no-auth" in log and "WITHOUT AUTHENTICATION" in log


def test_ingest_and_sessions_through_a_server_with_its_token(token_server: LiveServer, tmp_path: Path) -> None:
    dump = named_dump(tmp_path / "dump", ["layer0_attn", "layer0_mlp"])
    args = ("ingest", "--session", "cli over http", "--run", "reference", str(dump), "--json")

    refused = run_cli(*args, "--server", token_server.url)
    assert refused.returncode == 1 and "401" in refused.stderr and "--token" in refused.stderr
    read_only = main_cli(*args, "--server", token_server.url, "--token", READ_TOKEN)
    assert read_only.returncode == 1 and "403" in read_only.stderr and "read-only" in read_only.stderr

    sent = main_cli(*args, "--server", token_server.url, "--token", WRITE_TOKEN)
    assert sent.returncode == 0, sent.stderr
    payload = json.loads(sent.stdout)
    session = http.get(f"{token_server.url}/api/sessions/{payload['session']['id']}", headers=bearer(READ_TOKEN))
    assert session.json()["name"] == "cli over http"
    assert [r["id"] for r in session.json()["runs"]] == [payload["run"]["id"]]
    again = main_cli(*args, "--server", token_server.url, "--token", WRITE_TOKEN)
    assert again.returncode == 1 and "(409): session 'cli over http' already has a run labelled" in again.stderr
    assert "{'" not in again.stderr  # the server's words, not a Python dict

    listed = main_cli("sessions", "--json", "--server", token_server.url, env={"TENSOR_DEBUGGER_TOKEN": READ_TOKEN})
    assert listed.returncode == 0, listed.stderr
    runs = {s["name"]: s["runs"] for s in json.loads(listed.stdout)}["cli over http"]
    assert [r["label"] for r in runs] == ["reference"]


def test_a_folder_whose_files_share_a_name_is_refused_before_sending(tmp_path: Path) -> None:
    named_dump(tmp_path / "dump" / "rank0", ["x"])
    named_dump(tmp_path / "dump" / "rank1", ["x"])
    done = run_cli(
        "ingest", "--session", "s", "--run", "r", str(tmp_path / "dump"), "--server", "http://127.0.0.1:9"
    )  # nothing listens there: the refusal comes first
    assert done.returncode == 2 and "x.pth" in done.stderr and "archive" in done.stderr


def test_a_server_that_is_not_there_is_a_clear_error(tmp_path: Path) -> None:
    done: subprocess.CompletedProcess[str] = run_cli("sessions", "--server", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 1 and "tensor-debugger:" in done.stderr and "Traceback" not in done.stderr


def test_tokens_stay_out_of_the_settings_repr(tmp_path: Path) -> None:
    from tensor_debugger.settings import Settings

    shown = repr(Settings(data_dir=tmp_path, token=WRITE_TOKEN, read_token=READ_TOKEN))
    assert WRITE_TOKEN not in shown and READ_TOKEN not in shown and "data_dir" in shown
