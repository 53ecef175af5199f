"""A `compare` killed (kill -9) once its reference is stored, before its candidate is: the same command run again
takes over that session (its reference kept, the candidate ingested into it) instead of making "name (2)"; where
the reference's files changed since, or a user wrote notes on the session, it makes "name (2)" as before. The
compare killed is a process; the commands after it run `main(argv)` in this process (tests/support/cli_main.py)."""

from __future__ import annotations

import json
import os
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

NAME = "ref vs port.tar"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A small reference folder, and a candidate tar with its partner and a 48 MiB tensor more: the reference is
    ready while the candidate is still unpacked and copied."""
    folder = tmp_path_factory.mktemp("resumed-compare")
    reference = folder / "ref"
    reference.mkdir()
    query = np.random.default_rng(0).standard_normal((64, 256), dtype=np.float32)
    np.save(reference / "0_query.npy", query)
    np.save(folder / "0_query.npy", query + np.float32(0.5))  # diverges: exit code 1
    np.save(folder / "1_big.npy", np.random.default_rng(1).standard_normal((12, 1024, 1024), dtype=np.float32))
    with tarfile.open(folder / "port.tar", "w") as tar:
        tar.add(folder / "0_query.npy", "0_query.npy")
        tar.add(folder / "1_big.npy", "1_big.npy")
    return reference, folder / "port.tar"


def rows(data_dir: Path, query: str) -> list[tuple[object, ...]]:
    database = data_dir / "metadata.sqlite3"
    if not database.exists():
        return []
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=1) as db:
            return list(db.execute(query))
    except sqlite3.OperationalError:  # not made yet, or locked a moment
        return []


def reference_ready(data_dir: Path) -> bool:
    """The reference run is ready and the candidate's is not (in the session made last)."""
    return rows(
        data_dir,
        "select label, status from runs where session_id = (select max(id) from sessions) order by position",
    ) == [("ref", "ready"), ("port.tar", "ingesting")]


def killed_compare(
    data_dir: Path, reference: Path, candidate: Path, flags: list[str], names: tuple[str, ...] = (NAME,)
) -> None:
    compare = subprocess.Popen(
        [
            *cli_command(),
            "--data-dir",
            str(data_dir),
            "compare",
            str(reference),
            str(candidate),
            "--in-process",
            *flags,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )
    try:
        wait_until(lambda: reference_ready(data_dir), what="the reference to be ready", timeout=120, interval=0.005)
    finally:
        compare.send_signal(signal.SIGKILL)
        compare.wait()
    assert compare.returncode == -signal.SIGKILL  # killed, not finished before the signal
    assert [name for (name,) in rows(data_dir, "select name from sessions order by id")] == list(names)


@pytest.mark.parametrize("flags", [[], ["--fail-fast"]], ids=["at-once", "fail-fast"])
def test_a_rerun_takes_over_the_killed_compare_s_session(
    tmp_path: Path, inputs: tuple[Path, Path], flags: list[str]
) -> None:
    data_dir = tmp_path / "data"
    reference, candidate = inputs
    killed_compare(data_dir, reference, candidate, flags)
    ((reference_id,),) = rows(data_dir, "select id from runs where label = 'ref'")

    again = main_cli(
        "--data-dir", str(data_dir), "compare", str(reference), str(candidate), "--in-process", "--json", *flags
    )
    assert f"resuming the interrupted session {NAME!r}" in again.stderr
    fresh = main_cli(
        "--data-dir", str(tmp_path / "fresh"), "compare", str(reference), str(candidate), "--in-process", "--json"
    )
    assert again.returncode == fresh.returncode == 1, again.stderr  # the query diverges
    payload = json.loads(again.stdout)
    assert payload["session"]["name"] == NAME
    assert [(p["a"]["name"], p["b"]["name"], p["status"]) for p in payload["pairs"]] == [
        (p["a"]["name"], p["b"]["name"], p["status"]) for p in json.loads(fresh.stdout)["pairs"]
    ]

    assert [name for (name,) in rows(data_dir, "select name from sessions")] == [NAME]
    runs = rows(data_dir, "select id, label, status from runs order by position")
    assert [(label, status) for _, label, status in runs] == [("ref", "ready"), ("port.tar", "ready")]
    assert runs[0][0] == reference_id  # the reference kept, not ingested again
    listed = main_cli("--data-dir", str(data_dir), "sessions", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [session["name"] for session in json.loads(listed.stdout)] == [NAME]


def test_a_compare_killed_in_a_name_given_in_place_of_the_one_wanted_is_taken_over(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    """ "x" is another compare's, complete, so the compare killed made "x (2)": the same command again takes that
    session over, and says so, rather than making "x (3)"."""
    data_dir = tmp_path / "data"
    reference, candidate = inputs
    small = tmp_path / "small"
    small.mkdir()
    np.save(small / "0_query.npy", np.load(reference / "0_query.npy"))
    first = main_cli("--data-dir", str(data_dir), "compare", str(reference), str(small), "--name", "x")
    assert first.returncode == 0, first.stdout
    killed_compare(data_dir, reference, candidate, ["--name", "x"], names=("x", "x (2)"))
    ((reference_id,),) = rows(data_dir, "select id from runs where label = 'ref' and session_id = 2")

    again = main_cli(
        "--data-dir", str(data_dir), "compare", str(reference), str(candidate), "--name", "x", "--in-process"
    )
    assert again.returncode == 1, again.stderr  # the query diverges
    assert "resuming the interrupted session 'x (2)'" in again.stderr, again.stderr
    assert "a session named 'x' exists already: this one is 'x (2)'" in again.stdout, again.stdout
    assert [name for (name,) in rows(data_dir, "select name from sessions order by id")] == ["x", "x (2)"]
    runs = rows(data_dir, "select id, label, status from runs where session_id = 2 order by position")
    assert runs == [(reference_id, "ref", "ready"), (runs[1][0], "port.tar", "ready")]
    assert rows(data_dir, "select label from runs where session_id = 1 order by position") == [("ref",), ("small",)]


def touch_reference(data_dir: Path, reference: Path) -> None:
    query = reference / "0_query.npy"
    stat = query.stat()
    os.utime(query, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def write_notes(data_dir: Path, reference: Path) -> None:
    with sqlite3.connect(data_dir / "metadata.sqlite3") as db:
        db.execute("update sessions set notes = 'keep this'")


@pytest.mark.parametrize("change", [touch_reference, write_notes], ids=["reference-changed", "notes"])
def test_a_killed_compare_s_session_changed_since_is_not_taken_over(
    tmp_path: Path, inputs: tuple[Path, Path], change: Callable[[Path, Path], None]
) -> None:
    data_dir = tmp_path / "data"
    reference, candidate = inputs
    killed_compare(data_dir, reference, candidate, [])
    change(data_dir, reference)

    again = main_cli("--data-dir", str(data_dir), "compare", str(reference), str(candidate), "--in-process", "--json")
    assert again.returncode == 1, again.stderr
    assert "resuming" not in again.stderr
    assert json.loads(again.stdout)["session"]["name"] == f"{NAME} (2)"
    assert sorted(str(name) for (name,) in rows(data_dir, "select name from sessions")) == [NAME, f"{NAME} (2)"]
