"""`ingest --server` and `sessions --server`: the same commands through a running server's API (live/upload.py),
with its token (`--token`, else TENSOR_DEBUGGER_TOKEN)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx
import msgspec

from tensor_debugger.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_UNUSABLE
from tensor_debugger.cli.session_list import ListedSession, print_sessions
from tensor_debugger.live.upload import server_sessions, upload_files


def files_to_send(paths: list[Path]) -> list[Path]:
    """The files of `paths`, a folder's (at any depth) included. The server keeps only a file's base name, so
    two files of one name would collide: that is refused, naming both (send the folder as an archive instead)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.is_file()))
        elif path.is_file():
            files.append(path)
        else:
            raise ValueError(f"{path}: no such file or folder")
    seen: dict[str, Path] = {}
    for file in files:
        if file.name in seen:
            raise ValueError(
                f"{seen[file.name]} and {file} have one name, which the server cannot tell apart: "
                "send their folder as an archive (.zip, .tar) instead"
            )
        seen[file.name] = file
    return files


def failure(server: str, exc: Exception) -> str:
    """What went wrong talking to `server`, naming it where the server was not reached (httpx says only
    "[Errno 111] Connection refused"); a server's own refusal (RuntimeError) as it said it."""
    if isinstance(exc, httpx.TimeoutException):
        return f"could not reach the server at {server}: it did not answer in time"
    if isinstance(exc, httpx.TransportError):
        reason = re.sub(r"^\[Errno -?\d+\] ", "", str(exc).strip()) or type(exc).__name__
        return f"could not reach the server at {server}: {reason[:1].lower()}{reason[1:]}"
    if isinstance(exc, httpx.HTTPError):
        return f"the server at {server}: {exc}"
    return str(exc)


def remote_ingest(
    server: str, token: str | None, session: str, run: str, paths: list[Path], as_json: bool, against: str | None = None
) -> int:
    try:
        files = files_to_send(paths)
    except ValueError as exc:
        print(f"tensor-debugger: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    try:
        session_id, run_id = upload_files(server, session, run, files, token, against=against)
    except (RuntimeError, httpx.HTTPError) as exc:
        print(f"tensor-debugger: {failure(server, exc)}", file=sys.stderr)
        return EXIT_FAILED
    payload = {"session": {"id": session_id, "name": session}, "run": {"id": run_id, "label": run}, "server": server}
    if as_json:
        print(json.dumps(payload))
    else:
        sent = f"{len(files)} file{'' if len(files) == 1 else 's'}"
        print(f"sent {sent} as run {run!r} of session {session!r} to {server} (the server ingests them)")
    return EXIT_OK


def remote_sessions(server: str, token: str | None, as_json: bool) -> int:
    try:
        listed = server_sessions(server, token)
    except (RuntimeError, httpx.HTTPError) as exc:
        print(f"tensor-debugger: {failure(server, exc)}", file=sys.stderr)
        return EXIT_FAILED
    try:
        data = msgspec.convert(listed, list[ListedSession])
    except msgspec.ValidationError as exc:
        print(f"tensor-debugger: {failure(server, exc)}", file=sys.stderr)
        return EXIT_FAILED
    print_sessions(data, as_json, server)
    return EXIT_OK
