"""What a new user meets first and should not stumble on: the usage line names only what is missing, `--help` says
what an empty default means, the address a user guesses for the sessions list leads to it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from tests.support import loopback_http
from tests.support.cli_main import main_cli
from tests.support.dumps import layered_dump
from tests.support.polling import wait_until
from tests.support.servers import LiveServer, child_env, cli_command, free_port, run_cli


def test_compare_with_one_run_asks_for_the_candidate_only() -> None:
    result = main_cli("compare", "ref")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith("the following arguments are required: b")


def test_help_says_empty_for_an_empty_default() -> None:
    result = main_cli("--help")
    assert result.returncode == 0
    assert "(default )" not in result.stdout
    assert "TENSOR_DEBUGGER_DATABASE_URL (default empty)" in result.stdout


def test_the_sessions_address_leads_to_the_list(shared_server: LiveServer) -> None:
    answer = loopback_http.get(f"{shared_server.url}/sessions", headers=shared_server.auth, follow_redirects=False)
    assert (answer.status_code, answer.headers["location"]) == (301, "/")
    assert loopback_http.get(f"{shared_server.url}/sessions", follow_redirects=True).status_code == 200


ROOT = Path(__file__).resolve().parents[2]


def _stub_venv(root: Path) -> Path:
    """A venv whose python runs `-c` code with the real interpreter and only records `-m pip ...` calls (one a line
    in `pip-calls`): what `make install` would install, and from where, without installing anything."""
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ]; then echo "$*" >> "$(dirname "$0")/../pip-calls"; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    return venv


def _make_install(tmp_path: Path, *variables: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    venv = _stub_venv(tmp_path)
    done = subprocess.run(
        ["make", "-C", str(ROOT), "install", f"VENV={venv}", *variables],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done, (venv / "pip-calls").read_text().splitlines()


def test_make_install_takes_torch_from_the_index_given(tmp_path: Path) -> None:
    done, calls = _make_install(tmp_path, "TORCH_INDEX=https://example.invalid/whl/cpu")
    assert calls[0] == "-m pip install --index-url https://example.invalid/whl/cpu torch==2.13.0"
    assert calls[1] == "-m pip install -e ."
    assert "did not answer" not in done.stdout  # a given index is not probed


def test_make_install_falls_back_to_pips_index_where_the_cpu_index_does_not_answer(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}/whl/cpu"
    started = time.monotonic()
    done, calls = _make_install(tmp_path, f"TORCH_CPU_INDEX={closed}")
    assert time.monotonic() - started < 30
    assert calls[0] == "-m pip install torch==2.13.0"  # pip's own index and find-links: a local CPU wheel here
    assert f"{closed} did not answer within 5 s: torch from pip's default index" in done.stdout


def test_make_install_uses_the_cpu_index_where_it_answers(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "whl" / "cpu" / "torch").mkdir(parents=True)
    (site / "whl" / "cpu" / "torch" / "index.html").write_text("<html></html>")
    port = free_port()
    index = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(site)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/whl/cpu"
        wait_until(lambda: _answers(f"{url}/torch/"), what="the stand-in index to answer", timeout=30)
        _, calls = _make_install(tmp_path, f"TORCH_CPU_INDEX={url}")
    finally:
        index.terminate()
        index.wait()
    assert calls[0] == f"-m pip install --index-url {url} torch==2.13.0"


def _answers(url: str) -> bool:
    try:
        return loopback_http.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_make_run_execs_the_server() -> None:
    """Dry run: the recipe replaces its shell with the server, whose exit status is then make's."""
    done = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "-o", f"{sys.prefix}/.installed", "run", f"VENV={sys.prefix}", "PORT=9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"exec {sys.prefix}/bin/tensor-debugger serve --host 127.0.0.1 --port 9" in done.stdout.splitlines()


def test_make_run_says_the_address_once_it_answers_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    """A new data dir: the demo is built first (seconds), said so; the address comes once the server answers; a
    SIGTERM to the server is a clean stop, and make says no error."""
    port = free_port()
    env = {**child_env(), "TENSOR_DEBUGGER_DATA_DIR": str(tmp_path / "data")}
    make = subprocess.Popen(
        ["make", "-s", "-C", str(ROOT), "-o", f"{sys.prefix}/.installed", "run", f"VENV={sys.prefix}", f"PORT={port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    try:
        assert make.stdout is not None
        for line in make.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("Tensor Debugger on"):
                break
        # said once it answers: asked at once, it does
        assert loopback_http.get(f"http://127.0.0.1:{port}/api/sessions", timeout=5).status_code == 200
        children = Path(f"/proc/{make.pid}/task/{make.pid}/children").read_text().split()
        assert len(children) == 1  # the server itself (exec), no shell between
        os.kill(int(children[0]), signal.SIGTERM)
        rest, _ = make.communicate(timeout=30)
    finally:
        if make.poll() is None:
            make.kill()
            make.wait()
    lines += rest.splitlines()
    assert lines[:2] == [
        "building the demo session...",
        f"Tensor Debugger on http://127.0.0.1:{port}  (data in {tmp_path / 'data'})",
    ], lines
    assert make.returncode == 0, lines
    assert not [line for line in lines if "Error" in line], lines


def _bad_database_urls() -> list[tuple[str, str]]:
    closed = free_port()  # nothing listens there: refused at once
    return [
        ("postgresql://tensor:s3cret@127.0.0.1:port/db", "not a database URL"),
        ("oracle9://tensor:s3cret@127.0.0.1/db", "no database driver for 'oracle9'"),
        (f"postgresql+psycopg://tensor:s3cret@127.0.0.1:{closed}/db", "Connection refused"),
    ]


@pytest.mark.parametrize("command", ["serve", "sessions", "compare"])
def test_a_bad_database_url_is_one_line_naming_it(tmp_path: Path, command: str) -> None:
    """Malformed, an unknown driver, a PostgreSQL port nobody answers: one line naming the URL (password hidden) and
    the cause, exit 2, for the server and the commands alike; nothing created in the data dir."""
    ref = tmp_path / "ref.npy"
    np.save(ref, np.zeros(4, dtype=np.float32))
    args = {"serve": ["serve", "--port", str(free_port())], "sessions": ["sessions"]}.get(
        command, ["compare", str(ref), str(ref), "--in-process"]
    )
    for url, cause in _bad_database_urls():
        done = run_cli("--data-dir", str(tmp_path / "data"), *args, env={"TENSOR_DEBUGGER_DATABASE_URL": url})
        assert done.returncode == 2, (url, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, (url, done.stderr)
        assert lines[0].startswith("tensor-debugger: ") and cause in lines[0], lines
        assert url.replace(":s3cret@", ":***@") in lines[0] and "s3cret" not in lines[0], lines
        assert "Traceback" not in done.stderr


def test_serve_on_a_port_in_use_says_so_in_one_line(tmp_path: Path) -> None:
    """A second `make run` (or another program on the port): one line naming the address and the cause, exit 2,
    before anything is built (no demo session, no data dir), not uvicorn's "ERROR: [Errno 98]" after start-up."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = run_cli("--data-dir", str(tmp_path / "data"), "serve", "--port", str(port))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"tensor-debugger: cannot listen on 127.0.0.1:{port}: address already in use (another server? stop it, "
        "or choose another port: --port P, or make run PORT=P)"
    )
    assert done.stdout == ""
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("json_output", [False, True])
def test_output_into_a_reader_that_left_ends_quietly(tmp_path: Path, json_output: bool) -> None:
    """`compare A B | head -1` where head exits before compare writes: no BrokenPipeError traceback on stderr (nor
    "Exception ignored" at exit), exit 141 as a tool that SIGPIPE ends."""
    ref, cand = layered_dump(tmp_path / "ref", None), layered_dump(tmp_path / "cand", bug_from=1)
    reader, writer = os.pipe()
    os.close(reader)  # the reader is gone before the first line is written
    try:
        done = subprocess.run(
            [*cli_command(), "--data-dir", str(tmp_path / "data"), "compare", str(ref), str(cand)]
            + (["--json"] if json_output else []),
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
            timeout=120,
        )
    finally:
        os.close(writer)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_compare_with_top_beside_a_server_links_to_its_port(shared_server: LiveServer, tmp_path: Path) -> None:
    """`compare --top 3` runs in this process (a server keeps its own top) beside a server of the data dir on a port
    of its own: the link is to that server, not a hint to start one on 8000."""
    ref, cand = layered_dump(tmp_path / "ref", None), layered_dump(tmp_path / "cand", bug_from=1)
    data = str(shared_server.data_dir)
    done = run_cli("--data-dir", data, "compare", str(ref), str(cand), "--top", "3", "--name", "top beside a server")
    assert done.returncode == 1, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith(f"open in the browser: {shared_server.url}/sessions/"), last
    assert ":8000" not in done.stdout and "serve" not in last


def test_compare_where_neither_run_has_tensors_says_why(tmp_path: Path) -> None:
    """The reference a file with no tensor (read, then refused) and the candidate a path that is not there (refused
    at once): the reference's run, which made the session, ends last and takes the session with it; the compare
    says why in plain words (exit 2, no traceback of a session already gone) and leaves no session."""
    config = tmp_path / "ref" / "config.json"
    config.parent.mkdir()
    config.write_text('{"hidden_size": 8}')
    data = str(tmp_path / "data")
    done = run_cli("--data-dir", data, "compare", str(config.parent), str(tmp_path / "missing"), "--in-process")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"tensor-debugger: no tensors found in {config}\n"), done.stderr
    assert run_cli("--data-dir", data, "sessions", "--json").stdout.strip() == "[]"


def test_sessions_from_a_dead_server_names_it(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    done = run_cli("sessions", "--server", dead)
    assert done.returncode == 1
    assert done.stderr.strip() == f"tensor-debugger: could not reach the server at {dead}: connection refused"


def test_read_commands_on_a_new_data_dir_create_nothing(tmp_path: Path) -> None:
    data = tmp_path / "new"
    listed = run_cli("--data-dir", str(data), "sessions")
    assert (listed.returncode, listed.stdout.strip()) == (0, f"no sessions yet in {data}")
    assert run_cli("--data-dir", str(data), "sessions", "--json").stdout.strip() == "[]"
    diff = run_cli("--data-dir", str(data), "compare-sessions", "before", "after")
    assert diff.returncode == 2
    assert diff.stderr.strip() == f"tensor-debugger: no session with id or name 'before': {data} has no sessions yet"
    assert not data.exists()
    # from the environment too: the default data dir is the XDG one
    home = tmp_path / "xdg"
    listed = run_cli("sessions", env={"XDG_DATA_HOME": str(home)})
    assert listed.stdout.strip() == f"no sessions yet in {home / 'tensor-debugger'}"
    assert not home.exists()


def test_compare_sessions_counts_pending_pairs_as_pending(tmp_path: Path) -> None:
    """A session whose runs were ingested with no server up has its pairs not compared yet: against a compared
    one they are `pending`, not `same` (what an uncompared pair's missing error read as), and the exit is 2 (not
    compared yet)."""
    data = str(tmp_path / "data")
    ref = layered_dump(tmp_path / "ref", None)
    fixed = layered_dump(tmp_path / "fixed", None)
    assert main_cli("--data-dir", data, "compare", str(ref), str(fixed), "--name", "compared").returncode == 0
    later = layered_dump(tmp_path / "later", None, noise=1e-7)  # not the compared one's tensors: no cached result
    for label, run in (("reference", ref), ("candidate", later)):
        assert main_cli("--data-dir", data, "ingest", "--session", "ingested", "--run", label, str(run)).returncode == 0
    done = main_cli("--data-dir", data, "compare-sessions", "compared", "ingested", "--json")
    assert done.returncode == 2, done.stderr
    out = json.loads(done.stdout)
    assert out["counts"]["pending"] == 8 and out["counts"]["same"] == 0
    assert {p["change"] for p in out["pairs"]} == {"pending"}
    table = main_cli("--data-dir", data, "compare-sessions", "compared", "ingested")
    assert table.returncode == 2
    assert "0 same" in table.stdout and "8 pending" in table.stdout
    assert "B: ingested (session 2): 8 pairs not compared yet" in table.stdout


def test_an_unreadable_file_is_said_once_with_one_reason(tmp_path: Path) -> None:
    """A truncated torch.save file (cut short at two places: the reader fails differently, "[Errno 22]" or a miniz
    error) gets one reason a user can act on; with no tensor found, the reason is said once, under a line naming
    the file; `explore`, which names no culprit, does not speak of one."""
    ref = tmp_path / "ref.pth"
    torch.save({"w": torch.randn(256, 64), "b": torch.randn(8)}, ref)
    whole = ref.read_bytes()
    data = str(tmp_path / "data")
    for size in (300, len(whole) // 2):
        cut = tmp_path / f"cut-{size}.pth"
        cut.write_bytes(whole[:size])
        done = main_cli("--data-dir", data, "compare", str(ref), str(cut), "--in-process")
        assert done.returncode == 2
        assert done.stderr.splitlines() == [
            f"tensor-debugger: no tensors found in {cut}",
            f"  {cut}: not a readable PyTorch file: truncated or damaged: a zip archive of {size} bytes whose "
            "directory cannot be read (was it copied whole?)",
        ], done.stderr
    run = tmp_path / "run"
    run.mkdir()
    (run / "cut.pth").write_bytes(whole[:300])
    torch.save({"x": torch.randn(4, 4), "y": torch.randn(4, 4)}, run / "whole.pth")
    explored = main_cli("--data-dir", data, "explore", str(run))
    assert explored.returncode == 2
    incomplete = [line for line in explored.stdout.splitlines() if line.startswith("INCOMPLETE")]
    assert incomplete == [
        "INCOMPLETE: 1 input file could not be read (see problem above): their tensors are missing from this comparison"
    ], explored.stdout
    assert "culprit" not in explored.stdout


def test_a_name_taken_gets_a_number_from_the_api_and_the_command_line(
    shared_server: LiveServer, tmp_path: Path
) -> None:
    """One behaviour for a new session whose name a session has: `name (2)`, said so, whether created through the
    API (JSON or an upload) or by `compare`; `ingest --session NAME` still adds its run to the session of that
    name."""
    url, auth = shared_server.url, shared_server.auth
    first = loopback_http.post(f"{url}/api/sessions", json={"name": "taken name"}, headers=auth)
    second = loopback_http.post(f"{url}/api/sessions", json={"name": "taken name"}, headers=auth)
    assert (first.status_code, first.json()["name"]) == (201, "taken name")
    assert (second.status_code, second.json()["name"]) == (201, "taken name (2)")
    dump = tmp_path / "0_query.npy"
    np.save(dump, np.arange(6, dtype=np.float32))
    with dump.open("rb") as f:
        uploaded = loopback_http.post(
            f"{url}/api/sessions", data={"name": "taken name"}, files=[("reference", ("0_query.npy", f))], headers=auth
        )
    assert uploaded.status_code == 201, uploaded.text
    assert uploaded.json()["session"]["name"] == "taken name (3)"
    data = str(shared_server.data_dir)
    done = main_cli("--data-dir", data, "compare", str(dump), str(dump), "--name", "taken name")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "a session named 'taken name' exists already: this one is 'taken name (4)'"
    explored = main_cli("--data-dir", data, "explore", str(dump), "--name", "taken name")
    assert explored.stdout.splitlines()[0] == (
        "a session named 'taken name' exists already: this one is 'taken name (5)'"
    ), explored.stdout
    added = main_cli("--data-dir", data, "ingest", "--session", "taken name", "--run", "later", str(dump), "--json")
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["session"]["id"] == first.json()["id"]
