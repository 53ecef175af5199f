"""A `compare` killed (kill -9) at any point of its ingest leaves no empty session behind: the next command's
start-up recovery removes its half-ingested runs and the session they made, so `sessions` lists nothing and the
next compare of the same inputs takes the same name, not "name (2)". The compare killed is a process; the commands
after it run `main(argv)` in this process (tests/support/cli_main.py)."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli_main import main_cli
from tests.support.polling import wait_until
from tests.support.servers import child_env, cli_command


@pytest.fixture(scope="module")
def big_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two runs of one 48 MiB tensor each, in uncompressed tars: unpacked and copied for a second or more."""
    folder = tmp_path_factory.mktemp("killed-compare")
    runs = []
    for name, seed in (("ref", 0), ("port", 1)):
        npy = folder / "0_query.npy"
        np.save(npy, np.random.default_rng(seed).standard_normal((12, 1024, 1024), dtype=np.float32))
        with tarfile.open(folder / f"{name}.tar", "w") as tar:
            tar.add(npy, "0_query.npy")
        npy.unlink()
        runs.append(folder / f"{name}.tar")
    return runs[0], runs[1]


def rows(data_dir: Path, query: str) -> list[tuple[object, ...]]:
    database = data_dir / "metadata.sqlite3"
    if not database.exists():
        return []
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=1) as db:
            return list(db.execute(query))
    except sqlite3.OperationalError:  # not made yet, or locked a moment
        return []


def session_made(data_dir: Path) -> bool:
    return bool(rows(data_dir, "select id from sessions"))


def copying(data_dir: Path) -> bool:
    """Both runs' rows are "ingesting" and chunks of them are on disk: mid-ingest."""
    ingesting = rows(data_dir, "select id from runs where status = 'ingesting'")
    arrays = data_dir / "arrays" / "runs"
    return (
        len(ingesting) == 2 and arrays.exists() and any(p.name != "zarr.json" for p in arrays.rglob("*") if p.is_file())
    )


@pytest.mark.parametrize("point", [session_made, copying], ids=["after-the-session-row", "mid-ingest"])
def test_a_compare_killed_leaves_no_empty_session(
    tmp_path: Path, big_runs: tuple[Path, Path], point: Callable[[Path], bool]
) -> None:
    data_dir = tmp_path / "data"
    reference, candidate = big_runs
    compare = subprocess.Popen(
        [*cli_command(), "--data-dir", str(data_dir), "compare", str(reference), str(candidate), "--in-process"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )
    try:
        wait_until(lambda: point(data_dir), what=f"the compare to reach {point.__name__}", timeout=120, interval=0.005)
    finally:
        compare.send_signal(signal.SIGKILL)
        compare.wait()
    assert rows(data_dir, "select name from sessions") == [("ref.tar vs port.tar",)]  # killed with its session

    listed = main_cli("--data-dir", str(data_dir), "sessions", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []

    again = main_cli("--data-dir", str(data_dir), "compare", str(reference), str(candidate), "--in-process", "--json")
    assert again.returncode in (0, 1), again.stderr
    assert json.loads(again.stdout)["session"]["name"] == "ref.tar vs port.tar"
    assert [name for (name,) in rows(data_dir, "select name from sessions")] == ["ref.tar vs port.tar"]


def test_a_compare_stopped_by_ctrl_c_says_so_in_one_line_and_the_same_command_answers_after(
    tmp_path: Path, big_runs: tuple[Path, Path]
) -> None:
    """Ctrl-C mid-ingest printed a traceback and exited 1, the code of a divergence found. Now: one line, no
    verdict, exit 130 (128 + SIGINT, as a shell reports it), and the same command again answers in the same
    session name."""
    data_dir = tmp_path / "data"
    reference, candidate = big_runs
    compare = subprocess.Popen(
        [*cli_command(), "--data-dir", str(data_dir), "compare", str(reference), str(candidate), "--in-process"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        # a pytest-xdist worker ignores SIGINT, and a child inherits that: Ctrl-C as a shell delivers it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        wait_until(lambda: copying(data_dir), what="the compare to reach mid-ingest", timeout=120, interval=0.005)
        compare.send_signal(signal.SIGINT)
        out, err = compare.communicate(timeout=120)
    finally:
        if compare.poll() is None:
            compare.kill()
            compare.wait()
    assert compare.returncode == 130, (out, err)
    assert "Traceback" not in err and "interrupted (Ctrl-C): no verdict" in err, err
    assert out == ""

    again = main_cli("--data-dir", str(data_dir), "compare", str(reference), str(candidate), "--in-process", "--json")
    assert again.returncode == 1, again.stderr  # the two tensors differ
    assert json.loads(again.stdout)["session"]["name"] == "ref.tar vs port.tar"
    assert [name for (name,) in rows(data_dir, "select name from sessions")] == ["ref.tar vs port.tar"]
