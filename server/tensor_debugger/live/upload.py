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

from tensor_debugger.errors import SessionNameTaken
from tensor_debugger.live.roles import parse_role

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
    server: str,
    session: str,
    run: str,
    folder: Path,
    token: str | None = None,
    against: str | None = None,
    found: int | None = None,
    role: str | None = None,
    new_session: bool = False,
) -> tuple[int, int]:
    """Upload every file of `folder` as run `run` of session `session`; see `upload_files`."""
    files = sorted(p for p in folder.iterdir() if p.is_file())
    return upload_files(
        server, session, run, files, token, against=against, found=found, role=role, new_session=new_session
    )


def session_on(server: str, session: str, token: str | None = None) -> int | None:
    """The id of the server's session named `session`, None where it has none."""
    with server_client(server, token) as client:
        return _listed(client, server, session)


def free_session_on(server: str, session: str, token: str | None = None) -> str:
    """`session`, or where the server has a session of that name, the name a new session takes there: `session (2)`,
    the first number free, as `compare` and the API name one (store/catalog.free_name)."""
    from tensor_debugger.store.catalog import first_free_name

    with server_client(server, token) as client:
        answer = client.get("/api/sessions", params={"q": session})
        _check(answer, server)
        listed = msgspec.json.decode(answer.content, type=list[_Session])
    return first_free_name(session, {s.name for s in listed})


def _listed(client: httpx.Client, server: str, session: str) -> int | None:
    answer = client.get("/api/sessions", params={"q": session})
    _check(answer, server)
    listed = msgspec.json.decode(answer.content, type=list[_Session])
    return next((s.id for s in listed if s.name == session), None)


def upload_files(
    server: str,
    session: str,
    run: str,
    paths: Sequence[Path],
    token: str | None = None,
    tries: int = 2,
    against: str | None = None,
    found: int | None = None,
    role: str | None = None,
    new_session: bool = False,
) -> tuple[int, int]:
    """Upload `paths` (tensor files and archives) as run `run` of session `session` (created when no session has
    that name); returns (session id, run id). `new_session`: the run makes its session, and where one of that name
    exists, or another client made it meanwhile, SessionNameTaken is raised (the server keeps nothing of it).
    `against`: the label of the session's run it is compared against (the session must exist and hold it). `found`:
    the session's id when the run's capture began (`session_on`): the run goes into that session, and a RuntimeError
    naming it says that it was deleted since (a session made again would hold this run alone). `role` "noise": a
    rerun of the reference (`parse_role`: labelled "noise"), sent in the form's field of that name. Raises
    RuntimeError with the server's reasons when it refuses."""
    parse_role(role, run, server)
    with server_client(server, token) as client:
        listed = _listed(client, server, session)
        if found is not None and listed != found:
            raise _deleted(server, session, found, run)
        existing = None if listed is None else _Session(listed, session)
        if new_session and existing is not None:
            raise SessionNameTaken(session)
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
        if found is not None and response.status_code == 404:  # deleted between the look-up and the upload
            raise _deleted(server, session, found, run)
        _check(response, server)
        body = msgspec.json.decode(response.content, type=_Uploaded)
        if new_session and body.session is not None and body.session.name != session:
            # another client made `session` between the look-up and this upload: the server named this one
            # "session (2)"; the caller takes the next free name itself
            _check(client.delete(f"/api/sessions/{body.session.id}"), server)
            raise SessionNameTaken(session)
        if existing is None and body.session is not None and body.session.name != session and tries > 1:
            # another client created `session` between the look-up and this upload, and the server named this one
            # "session (2)": the run belongs in the session of that name, so it goes there instead
            _check(client.delete(f"/api/sessions/{body.session.id}"), server)
            return upload_files(server, session, run, paths, token, tries - 1, against, found, role)
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


def _deleted(server: str, session: str, found: int, run: str) -> RuntimeError:
    return RuntimeError(
        f"{server.rstrip('/')}: session {session!r} (id {found}) was deleted during the capture, so run {run!r} was "
        "not uploaded (a session made again would hold it alone); capture it again to make the session anew"
    )


def _ids(body: _Uploaded, existing: _Session | None) -> tuple[int, int]:
    runs = body.runs or []
    made = existing if existing is not None else body.session
    if made is None or not runs:
        raise RuntimeError("the server's answer to an upload names no session or no run")
    return made.id, runs[-1].run_id
