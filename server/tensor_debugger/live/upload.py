"""Talking to a running server: send a run's files as a run of a named session (streamed from disk), list its
sessions. A server with a token (TENSOR_DEBUGGER_TOKEN) is sent it as `Authorization: Bearer`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import msgspec

TIMEOUT_S = 600.0
TOKEN_VARIABLE = "TENSOR_DEBUGGER_TOKEN"


class _Session(msgspec.Struct):
    """What an upload reads of a session the server lists or creates."""

    id: int
    name: str


class _Run(msgspec.Struct):
    run_id: int


class _Uploaded(msgspec.Struct):
    """What an upload reads of the server's answer: the session made (POST /api/sessions only) and the runs."""

    session: _Session | None = None
    runs: list[_Run] | None = None


def server_client(server: str, token: str | None = None) -> httpx.Client:
    """A client of `server` that sends `token`, else the TENSOR_DEBUGGER_TOKEN variable's, when there is one."""
    token = token or os.environ.get(TOKEN_VARIABLE) or None
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=TIMEOUT_S)


def upload_run(
    server: str, session: str, run: str, folder: Path, token: str | None = None, against: str | None = None
) -> tuple[int, int]:
    """Upload every file of `folder` as run `run` of session `session`; see `upload_files`."""
    files = sorted(p for p in folder.iterdir() if p.is_file())
    return upload_files(server, session, run, files, token, against=against)


def upload_files(
    server: str,
    session: str,
    run: str,
    paths: Sequence[Path],
    token: str | None = None,
    tries: int = 2,
    against: str | None = None,
) -> tuple[int, int]:
    """Upload `paths` (tensor files and archives) as run `run` of session `session` (created when no session has
    that name); returns (session id, run id). `against`: the label of the session's run it is compared against (the
    session must exist and hold it). Raises RuntimeError with the server's reasons when it refuses."""
    with server_client(server, token) as client:
        found = client.get("/api/sessions", params={"q": session})
        _check(found, server)
        listed = msgspec.json.decode(found.content, type=list[_Session])
        existing = next((s for s in listed if s.name == session), None)
        with ExitStack() as stack:
            files = [(run, (p.name, stack.enter_context(p.open("rb")), "application/octet-stream")) for p in paths]
            if existing is None and against is not None:
                raise RuntimeError(
                    f"{server.rstrip('/')} has no session {session!r}, so no run {against!r} to compare against"
                )
            if existing is None:
                response = client.post("/api/sessions", data={"name": session}, files=files)
            else:
                params = {"label": run, **({"against": against} if against is not None else {})}
                response = client.post(f"/api/sessions/{existing.id}/runs", params=params, files=files)
        _check(response, server)
        body = msgspec.json.decode(response.content, type=_Uploaded)
        if existing is None and body.session is not None and body.session.name != session and tries > 1:
            # another client created `session` between the look-up and this upload, and the server named this one
            # "session (2)": the run belongs in the session of that name, so it goes there instead
            _check(client.delete(f"/api/sessions/{body.session.id}"), server)
            return upload_files(server, session, run, paths, token, tries - 1, against)
    return _ids(body, existing)


def server_sessions(server: str, token: str | None = None) -> list[dict[str, Any]]:
    """The server's sessions as GET /api/sessions lists them: the answer as sent (JSON), which the caller checks
    against the fields it shows (cli/remote.py)."""
    with server_client(server, token) as client:
        response = client.get("/api/sessions")
        _check(response, server)
        sessions: list[dict[str, Any]] = response.json()
    return sessions


def _check(response: httpx.Response, server: str) -> None:
    if response.is_success:
        return
    try:
        detail: Any = response.json()
    except ValueError:
        detail = response.text[:2000]
    if isinstance(detail, dict) and isinstance(detail.get("detail"), str):  # the API's error: its words
        detail = detail["detail"]
    hint = ""
    if response.status_code == 401:
        hint = f" (this server needs a token: --token, or the {TOKEN_VARIABLE} variable)"
    raise RuntimeError(f"{server.rstrip('/')} refused the request ({response.status_code}){hint}: {detail}")


def _ids(body: _Uploaded, existing: _Session | None) -> tuple[int, int]:
    runs = body.runs or []
    made = existing if existing is not None else body.session
    if made is None or not runs:
        raise RuntimeError("the server's answer to an upload names no session or no run")
    return made.id, runs[-1].run_id
