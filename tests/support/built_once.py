"""Data that a test module's servers start from, built once for the whole run: under pytest-xdist the first worker
to ask builds it while any other waits for it, instead of each worker building its own when the module's tests are
shared out between them (`--dist worksteal` splits a module where a worker steals from another)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this run's own: under pytest-xdist the one that holds each worker's base temp (shared by the
    run's workers, and by no other run), else the base temp itself."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], dict[str, Any]]
) -> tuple[Path, dict[str, Any]]:
    """The folder that `build` filled, and what it returned (JSON: session ids, say), built once for the run: the
    first caller builds it, holding a lock that any other worker waits on. Not to be changed: a server of a module's
    own starts on a copy of it (`copy_of`). A build that raised is done again by the next caller."""
    root = run_folder(tmp_path_factory) / f"built-{name}"
    root.mkdir(exist_ok=True)
    folder, done = root / "built", root / "built.json"
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a build that raised left
            folder.mkdir()
            done.write_text(json.dumps(build(folder)))
    found: dict[str, Any] = json.loads(done.read_text())
    return folder, found


def copy_of(built: Path, to: Path) -> Path:
    """A copy of a built folder, for a server of this worker's own to change."""
    shutil.copytree(built, to)
    return to
