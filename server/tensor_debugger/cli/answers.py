"""`compare` again on unchanged inputs: the answer printed last time, from a small file, importing nothing else.

A `compare` done in this process (no server on the data dir) keeps what it printed and its exit code (0 or 1) in
`<data dir>/answers/<key>.json`, where the key is a digest of everything the answer is made from that can be known
without opening the database: the tool's version and its code (each module file's size and modification time),
the working folder, the command line as parsed (paths as typed, tolerances, pairing, flags, `--json`) and the
settings. Beside the answer it keeps the state of what it read, checked at the next lookup:
- each input as the ingest reads it (a folder: every file in it), each file's resolved path, size, modification
  and change times, inode and device, and the pairing file's likewise. Any write to a file sets its change time,
  so an edit in place that keeps the size is seen without hashing the file (the ingest's fingerprint also hashes
  each file's ends: 0.1 s for two runs of 200 MB, the whole budget of this path);
- the SQLite database's file, its write-ahead log and its rollback journal (exists, size, times, inode), taken
  once the command has closed the database. Every write transaction of any process appends to the log or writes
  the file (and so changes its modification time): a session deleted, renamed, its tolerances changed, or any
  other write, makes the next lookup miss. A file's time comes from a clock that moves in ticks of a few
  milliseconds: the state is only kept once that clock has moved past the newest of those times (Linux stamps a
  file with its coarse real-time clock, or a finer time that is never earlier: CLOCK_REALTIME_COARSE, a tick
  at most; elsewhere, once the newest time is `QUIET_NS` old), so that a later write cannot leave the same time
  behind; on a file system whose times are whole milliseconds (or coarser), never.
- no server on the data dir (its address file absent): with one, the warm path answers (`warm.py`).

A lookup that finds any difference (or no file, or a database that is not SQLite) misses, and the command does
the whole work, making a new session as before. A hit imports only the standard library: no SQLAlchemy, numpy,
torch, Zarr, nor the comparison machinery.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tensor_debugger import __version__
from tensor_debugger.settings import Settings

FORMAT = 1  # of the answer files; raise it when what they hold changes
FOLDER = "answers"
KEPT = 64  # answer files kept in a data dir, the newest
QUIET_NS = 30_000_000  # how old the database's newest file time must be before its state is kept (not Linux)
# a file time further ahead of the clock than this: stamped by another clock (a copy kept its times, a network file
# system's server): no answer is kept on it, rather than waiting for that time to come
FUTURE_NS = 1_000_000_000
LINUX_CLOCK_REALTIME_COARSE = 5  # <linux/time.h>; the time module names no such clock
CACHED_EXITS = (0, 1)  # a pass, a divergence; an unusable input (2) is always done again
PACKAGE = Path(__file__).resolve().parent.parent


@dataclass
class Answers:
    """The answer file of one `compare` command line: `cached()` looks it up, `recording()` and `keep()` write it."""

    settings: Settings
    database: Path
    key: str
    described: dict[str, Any]  # what `key` is the digest of, kept in the file too
    inputs: list[Any]  # the inputs' state when the command started
    printed: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, settings: Settings, args: argparse.Namespace) -> Answers | None:
        """The answers of this command line, or None where none is kept: a database other than a SQLite file, a
        server on the data dir, an input that cannot be read."""
        database = sqlite_file(settings.database_url)
        if database is None or (settings.data_dir / settings.address_file).exists():
            return None
        inputs = inputs_state(args)
        if inputs is None:
            return None
        options = {k: [str(v) for v in value] if isinstance(value, list) else value for k, value in vars(args).items()}
        described = {
            "format": FORMAT,
            "version": __version__,
            "code": code_digest(),
            "cwd": os.getcwd(),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in sorted(options.items())},
            "settings": repr(settings),  # secrets are left out of it
        }
        canonical = json.dumps(described, sort_keys=True, separators=(",", ":"), default=str)
        return cls(settings, database, hashlib.sha256(canonical.encode()).hexdigest(), described, inputs)

    @property
    def path(self) -> Path:
        return self.settings.data_dir / FOLDER / f"{self.key}.json"

    def cached(self) -> tuple[str, int] | None:
        """What the command printed last time and its exit code, where nothing it was made from changed since."""
        try:
            entry = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("described") != self.described:
            return None
        if entry.get("inputs") != self.inputs or entry.get("exit_code") not in CACHED_EXITS:
            return None
        if self.server_found() or entry.get("database") != database_state(self.database):
            return None
        return str(entry["stdout"]), int(entry["exit_code"])

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Everything printed to stdout meanwhile is printed and kept."""
        original = sys.stdout
        sys.stdout = _Tee(original, self.printed)
        try:
            yield
        finally:
            sys.stdout = original

    def keep(self, exit_code: int) -> None:
        """Write the answer file, once the command has closed the database (it may have written it as it closed).
        Nothing is kept for an unusable input, where a server came up meanwhile, or where the database's file times
        cannot tell a later write (see the module's docstring); a file that cannot be written is left out."""
        if exit_code not in CACHED_EXITS or self.server_found():
            return
        state = quiet_database_state(self.database)
        if state is None:
            return
        entry = {
            "described": self.described,
            "inputs": self.inputs,
            "database": state,
            "exit_code": exit_code,
            "stdout": "".join(self.printed),
        }
        folder = self.path.parent
        try:
            folder.mkdir(exist_ok=True)
            temporary = folder / f".{self.key}.{os.getpid()}.tmp"
            temporary.write_text(json.dumps(entry))
            os.replace(temporary, self.path)
            _prune(folder)
        except OSError:
            return

    def server_found(self) -> bool:
        return (self.settings.data_dir / self.settings.address_file).exists()


class _Tee(io.TextIOBase):
    """stdout that also keeps what is written to it."""

    def __init__(self, stream: TextIO, kept: list[str]) -> None:
        self.stream, self.kept = stream, kept

    def write(self, text: str) -> int:
        self.kept.append(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()


def sqlite_file(url: str) -> Path | None:
    """The file of a `sqlite:///` database URL; None for another database or SQLite in memory."""
    if not url.startswith("sqlite:///"):
        return None
    name = url.removeprefix("sqlite:///").split("?", 1)[0]
    return None if name in ("", ":memory:") else Path(name)


def _stat(path: Path) -> list[int] | None:
    try:
        s = path.stat()
    except FileNotFoundError:
        return None
    return [s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino, s.st_dev]


def database_state(database: Path) -> dict[str, list[int] | None]:
    """The database's file, write-ahead log and rollback journal as they are (None: absent)."""
    return {suffix: _stat(Path(f"{database}{suffix}")) for suffix in ("", "-wal", "-journal")}


def quiet_database_state(database: Path) -> dict[str, list[int] | None] | None:
    """`database_state` once the clock that stamps files has moved past its newest time (waiting a tick or so;
    elsewhere than Linux, until that time is `QUIET_NS` old); None where the file is missing or the file system
    keeps whole milliseconds only."""
    coarse = LINUX_CLOCK_REALTIME_COARSE if sys.platform == "linux" else None  # what Linux stamps files with
    for _ in range(5):
        state = database_state(database)
        main = state[""]
        if main is None or main[1] % 1_000_000 == 0:
            return None
        newest = max(max(s[1], s[2]) for s in state.values() if s is not None)
        if coarse is not None:  # a later write is stamped at least this clock's time: past `newest` once it is
            wait = newest - time.clock_gettime_ns(coarse)
            if wait < 0:
                return state
            if wait > FUTURE_NS:  # stamped ahead of this clock (copied with its times, another host's): not kept
                return None
            time.sleep(wait / 1e9 + time.clock_getres(coarse))
            continue
        wait = newest + QUIET_NS - time.time_ns()
        if wait <= 0:
            return state
        if wait > QUIET_NS + FUTURE_NS:
            return None
        time.sleep(wait / 1e9)
    return None


def inputs_state(args: argparse.Namespace) -> list[Any] | None:
    """Each input's files (as the ingest lists a folder's: every file under it, recursively) and the pairing
    file: path, size, times, inode, device. None where one cannot be read."""
    paths: list[Path] = [args.a, args.b, *args.more]
    if args.noise is not None:
        paths.append(args.noise)
    state: list[Any] = []
    try:
        for typed in paths:
            root = Path(typed).resolve(strict=True)
            files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
            state.append([str(root), [[str(p), *_described(p)] for p in files]])
        if args.pairing is not None:
            pairing = Path(args.pairing).resolve(strict=True)
            state.append(["pairing", str(pairing), *_described(pairing)])
    except OSError:
        return None
    return state


def _described(path: Path) -> list[int]:
    s = path.stat()
    return [s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino, s.st_dev]


def code_digest() -> str:
    """A digest of the package's files (name, size, modification time): a changed module, or another install of the
    same version, makes other answers."""
    digest = hashlib.sha256()
    stack = [str(PACKAGE)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        stack.append(entry.path)
                elif entry.name.endswith((".py", ".so", ".c", ".h", ".html", ".js", ".css")):
                    s = entry.stat()
                    digest.update(f"{entry.path}\0{s.st_size}\0{s.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _prune(folder: Path) -> None:
    """Keep the `KEPT` newest answer files."""
    files = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in files[KEPT:]:
        old.unlink(missing_ok=True)
