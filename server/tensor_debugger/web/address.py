"""Where a running server can be found: `<data dir>/server.json` (the address_file setting), written when it
starts (its process id, its URL and a token drawn at start-up) and removed when it stops. `tensor-debugger compare`
and `ingest` read it to hand their work to that server instead of starting up themselves (`cli/warm.py`); a file
left by a server that died (its process gone, or nothing answering with its token at its URL) is ignored.

The file is readable by its owner only (0600): the token is what lets a caller have the server read local paths
(`controllers/local.py`), so only whoever may read the data dir anyway may do it. Imports nothing of the web
framework: the command line that reads it stays light."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ADDRESS_FILE = "server.json"
TOKEN_HEADER = "x-tensor-debugger-token"


@dataclass(frozen=True)
class ServerAddress:
    pid: int
    url: str  # http://host:port, no trailing slash
    token: str

    @classmethod
    def drawn(cls, host: str, port: int) -> ServerAddress:
        """This process's address, as a client on this machine reaches it, with a new token."""
        if host in ("0.0.0.0", ""):  # noqa: S104 (what `serve --host` may bind, not what we bind)
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        shown = f"[{host}]" if ":" in host else host
        return cls(os.getpid(), f"http://{shown}:{port}", secrets.token_urlsafe(32))


def address_path(data_dir: Path, name: str = ADDRESS_FILE) -> Path:
    """The file, `name` in the data dir (the address_file setting: replicas sharing a data dir each have one)."""
    return data_dir / name


def write_address(data_dir: Path, address: ServerAddress, name: str = ADDRESS_FILE) -> None:
    """Write the file whole (a reader never sees half of it), readable by its owner only."""
    target = address_path(data_dir, name)
    partial = target.with_name(f".{name}.{address.pid}")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump({"pid": address.pid, "url": address.url, "token": address.token}, handle)
    os.replace(partial, target)


def remove_address(data_dir: Path, address: ServerAddress, name: str = ADDRESS_FILE) -> None:
    """Remove the file if it is still this server's (another may have started on the data dir since)."""
    if read_address(data_dir, name) == address:
        address_path(data_dir, name).unlink(missing_ok=True)


def read_address(data_dir: Path, name: str = ADDRESS_FILE) -> ServerAddress | None:
    """The address the file holds; None when there is none or it is not one."""
    try:
        data: Any = json.loads(address_path(data_dir, name).read_text(encoding="utf-8"))
        return ServerAddress(int(data["pid"]), str(data["url"]), str(data["token"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True
