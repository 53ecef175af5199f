"""Staging folders, where uploads and extracted archive members wait while they are ingested, named for the process
that owns them, so that what a killed process left behind is found and removed.

A folder is `<kind>-<host>-<pid>.<start>-<random>`: `host` a short digest of the host name, `pid` and `start` the
owner's process id and start time (Linux's /proc/<pid>/stat, in clock ticks since boot; "0" elsewhere), so that a
process id reused by another process, or the same id after a container restarts, is not taken for the owner.
`sweep` removes every folder whose owner on this host is gone (but an accepted upload's, kept until its runs are
ingested, by whichever process takes them over): at every start (`open_services`) and, in a server,
every `staging_sweep_seconds`. Folders of a live process, and of other hosts sharing the data dir, are left alone.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection
from pathlib import Path

from tensor_debugger.ingest.recovery import process_alive

log = logging.getLogger(__name__)

LEGACY_AGE_SECONDS = 3600  # a folder named by an older version (no owner in its name) is removed once this old


def host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def start_time(pid: int) -> str:
    """The process's start time as /proc tells it, "0" where it cannot (another OS, a process gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "0"
    fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces and parentheses
    return fields[19] if len(fields) > 19 else "0"


def new_folder(staging_dir: Path, kind: str) -> Path:
    """A new empty folder under `staging_dir` owned by this process (`kind`: "upload", "ingest", "demo")."""
    pid = os.getpid()
    folder = staging_dir / f"{kind}-{host_tag()}-{pid}.{start_time(pid)}-{uuid.uuid4().hex}"
    folder.mkdir(parents=True)
    return folder


def owner_alive(name: str, host: str, now: float, modified: float) -> bool:
    """Whether the process that made the folder called `name` may still be using it."""
    parts = name.split("-")
    if len(parts) != 4 or "." not in parts[2]:
        return now - modified < LEGACY_AGE_SECONDS
    if parts[1] != host:
        return True  # another host's: its processes cannot be checked from here
    pid_text, _, started = parts[2].partition(".")
    if not pid_text.isdigit():
        return True
    pid = int(pid_text)
    if not process_alive(pid):
        return False
    return started == "0" or start_time(pid) in ("0", started)


def sweep(staging_dir: Path, keep: Collection[str] = frozenset()) -> int:
    """Remove every staging folder whose owner is gone, but those named in `keep` (an accepted upload's, whose
    runs wait to be ingested: `Ingestor.staged_folders`); returns how many were removed."""
    if not staging_dir.is_dir():
        return 0
    host, now, removed = host_tag(), time.time(), 0
    for folder in staging_dir.iterdir():
        if folder.name in keep:
            continue
        try:
            modified = folder.stat().st_mtime
        except FileNotFoundError:
            continue  # removed by its owner meanwhile
        if owner_alive(folder.name, host, now, modified):
            continue
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder, ignore_errors=True)
        else:
            folder.unlink(missing_ok=True)
        removed += 1
    return removed


class Sweeper:
    """Calls `sweep_once` every `interval` seconds in a daemon thread until `stop`."""

    def __init__(self, sweep_once: Callable[[], object], interval: float) -> None:
        self.sweep_once = sweep_once
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="staging-sweep", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sweep_once()
            except Exception:  # a sweep that fails (a database busy past its timeout) is tried again next time
                log.exception("sweeping staging and killed ingests failed")
