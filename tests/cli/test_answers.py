"""`compare` again on unchanged inputs answers from the data dir's answer file (cli/answers.py): the same bytes and
exit code as the command that did the work, in a process that imports none of SQLAlchemy, numpy, torch, Zarr or the
comparison machinery; any change of an input, of an option, or of the database (a session deleted or renamed by
another process) is a miss, and the command does the work again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support.cli_main import main_cli
from tests.support.servers import child_env

HEAVY = ("sqlalchemy", "numpy", "torch", "zarr", "tensor_debugger.compare", "tensor_debugger.services")

# `tensor-debugger ARGS` in a child; stderr's last line lists every module it imported.
_PROBE = """
import json, sys
from tensor_debugger.cli.main import main
try:
    code = main(sys.argv[1:])
finally:
    print(json.dumps(sorted(sys.modules)), file=sys.stderr)
raise SystemExit(code)
"""


def probe(*args: str, cwd: Path) -> tuple[int, str, set[str]]:
    """Exit code, stdout and the modules imported by `tensor-debugger ARGS` in a child process."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, env=child_env(), cwd=cwd, timeout=120
    )
    return done.returncode, done.stdout, set(json.loads(done.stderr.strip().splitlines()[-1]))


def heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in HEAVY or m.startswith(HEAVY)}


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two runs of four `.pth` files saved by torch (the candidate differs from tensor 2 on), in `tmp_path`, which
    is the working folder."""
    generator = torch.Generator().manual_seed(0)
    for run in ("ref", "port"):
        (tmp_path / run).mkdir()
    for index in range(4):
        values = torch.randn(3, 64, generator=generator)
        torch.save(values, tmp_path / "ref" / f"t{index}.pth")
        torch.save(values + (1e-3 if index >= 2 else 0.0), tmp_path / "port" / f"t{index}.pth")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def compare(*more: str) -> tuple[int, str]:
    done = main_cli("--data-dir", "data", "compare", "ref", "port", *more)
    return done.returncode, done.stdout


def session_of(out: str) -> dict[str, object]:
    session: dict[str, object] = json.loads(out)["session"]
    return session


def test_again_prints_the_same_bytes_importing_nothing_heavy(runs: Path) -> None:
    code, first = compare("--json")
    assert code == 1 and session_of(first)["name"] == "ref vs port"
    again_code, again, modules = probe("--data-dir", "data", "compare", "ref", "port", "--json", cwd=runs)
    assert (again_code, again) == (code, first)  # byte for byte
    assert heavy(modules) == set()
    table_code, table = compare()  # the table is another answer (its own file), done the long way once
    assert table_code == 1 and "not the first to fail): t2" in table and "exists already" in table  # no stage: no order
    again_code, again, modules = probe("--data-dir", "data", "compare", "ref", "port", cwd=runs)
    assert (again_code, again) == (table_code, table) and heavy(modules) == set()
    # the answer is the full path's: done again without the answer files, only the session differs
    for answer in (runs / "data" / "answers").iterdir():
        answer.unlink()
    code, fresh = compare("--json")
    assert code == 1 and session_of(fresh)["name"] == "ref vs port (3)"
    assert {**json.loads(fresh), "session": None} == {**json.loads(first), "session": None}


def test_a_changed_input_or_option_misses(runs: Path) -> None:
    code, first = compare("--json")
    assert compare("--json") == (code, first)  # a hit: no new session
    # an input rewritten in place, its size and modification time set back: its change time still moved
    target = runs / "port" / "t1.pth"
    before = target.stat()
    time.sleep(0.01)
    target.write_bytes(target.read_bytes())
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    code, out = compare("--json")
    assert session_of(out)["name"] == "ref vs port (2)"
    assert compare("--json") == (code, out)
    code, out = compare("--json", "--atol", "1")  # another tolerance: another answer, all pass
    assert code == 0 and session_of(out)["name"] == "ref vs port (3)"
    code, out = compare("--json", "--name", "mine")
    assert code == 1 and session_of(out)["name"] == "mine"
    (runs / "port" / "extra.pth").write_bytes((runs / "port" / "t0.pth").read_bytes())  # a file added to a folder
    code, out = compare("--json")
    assert code == 1 and session_of(out)["name"] == "ref vs port (4)"


def test_a_change_of_the_database_misses(runs: Path) -> None:
    from tensor_debugger.services import open_services
    from tensor_debugger.settings import Settings
    from tensor_debugger.store import catalog

    code, first = compare("--json")
    services = open_services(Settings(data_dir=runs / "data", demo=False))
    try:  # another process deletes the session the answer names
        with services.sessions() as db:
            catalog.delete_session(db, services.store, int(str(session_of(first)["id"])))
    finally:
        services.close()
    code, out = compare("--json")
    assert code == 1 and session_of(out)["name"] == "ref vs port"  # the name is free again: done anew
    assert stored() == [session_of(out)["id"]]  # not an answer naming the deleted session (SQLite reuses its id)
    assert compare("--json") == (code, out)
    services = open_services(Settings(data_dir=runs / "data", demo=False))
    try:  # a rename, as the API does it
        with services.sessions.begin() as db:
            catalog.get_session(db, int(str(session_of(out)["id"]))).name = "renamed"
    finally:
        services.close()
    code, renamed = compare("--json")
    assert session_of(renamed)["name"] == "ref vs port"  # done again (the old answer named a session since renamed)
    assert session_of(renamed)["id"] != session_of(out)["id"]
    assert sorted(map(str, stored())) == sorted(str(session_of(s)["id"]) for s in (out, renamed))


def stored() -> list[object]:
    """The ids of the sessions in the data dir."""
    listed = main_cli("--data-dir", "data", "sessions", "--json")
    return [s["id"] for s in json.loads(listed.stdout)]


def test_a_database_stamped_in_the_future_keeps_no_answer_and_no_wait(tmp_path: Path) -> None:
    """A database file whose time is ahead of this clock (copied with its times from a host whose clock runs ahead,
    a network file system's server) is not waited for until that time comes: no answer is kept on it."""
    from tensor_debugger.cli.answers import quiet_database_state

    database = tmp_path / "metadata.sqlite3"
    database.write_bytes(b"not empty")
    ahead = time.time_ns() + 3600 * 10**9 + 123_456  # an hour ahead, not whole milliseconds
    os.utime(database, ns=(ahead, ahead))
    assert quiet_database_state(database) is None  # at once (before, it slept until that hour had come)
    os.utime(database, ns=(time.time_ns() - 10**9 + 123_456,) * 2)  # a second old: its state is kept
    state = quiet_database_state(database)
    assert state is not None and state[""] is not None
