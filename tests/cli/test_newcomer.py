"""What a new user meets first and should not stumble on: the usage line names only what is missing, `--help` says
what an empty default means, the address a user guesses for the sessions list leads to it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support import loopback_http
from tests.support.cli_main import main_cli
from tests.support.polling import wait_until
from tests.support.servers import LiveServer, child_env, free_port


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
