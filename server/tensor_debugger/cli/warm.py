"""The warm path: `compare` and `ingest` hand their work to a server running on the same data dir (found through
`<data dir>/server.json`, `web/address.py`) and print what the server's answer says, exactly as they would have
printed it themselves: the server has its imports done and its database open, the command then has nothing to
start. No server, or one that does not answer as the data dir's (a stale file): the command does the work itself.

Only the standard library, msgspec and the light `compare_output` are imported here, so finding out costs next to
nothing (urllib's HTTP client, about 25 ms, only once a server's address file is found).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from tensor_debugger.cli.compare_output import show_compare
from tensor_debugger.cli.progress_bar import StatusLine
from tensor_debugger.compare.planning.requests import (
    EXIT_UNUSABLE,
    CompareRequest,
    IngestRequest,
    ServerIdentity,
    wanted_name,
)
from tensor_debugger.compare.reports.compare_report import CompareEvent, CompareOutcome, IngestOutcome, IngestReport
from tensor_debugger.settings import Settings
from tensor_debugger.web.address import TOKEN_HEADER, ServerAddress, process_alive, read_address

PROBE_SECONDS = 2.0  # a server that takes longer to say who it is is treated as not there


class ServerGone(Exception):  # noqa: N818 (a condition, reported in words)
    """The server stopped answering part way: what it did is unknown to this command."""


@dataclass(frozen=True)
class ServerProbe:
    """What asking this data dir's server found: `answered`, the server that said it is this data dir's (the work
    goes to it); `silent`, one whose address the data dir holds and whose process lives, but that did not answer in
    `PROBE_SECONDS` (busy, or stopped): the command does the work itself, and its session's page is on that server."""

    answered: ServerAddress | None = None
    silent: ServerAddress | None = None


def probe_server(settings: Settings) -> ServerProbe:
    """Ask the server whose address this data dir holds who it is (see `ServerProbe`). An address nothing listens
    at (refused: a stale file whose process id was reused) or a server of another database is no server."""
    address = read_address(settings.data_dir, settings.address_file)
    if address is None or not process_alive(address.pid):
        return ServerProbe()
    try:
        with _call(address, "GET", "/api/local/", None, PROBE_SECONDS) as answer:
            found = msgspec.json.decode(answer.read(), type=ServerIdentity)
    except OSError as exc:
        timed_out = isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError)
        return ServerProbe(silent=address if timed_out else None)
    except msgspec.DecodeError:
        return ServerProbe()
    same = found.database_url == settings.database_url and found.store_url == settings.store_url
    return ServerProbe(answered=address if same and found.pid == address.pid else None)


def silent_words(address: ServerAddress) -> str:
    """The note a command prints when it does the work itself because the server did not answer in time."""
    return (
        f"note: the server at {address.url} (this data dir's) did not answer in {PROBE_SECONDS:g} s: "
        "this command does the work in its own process"
    )


def remote_compare(address: ServerAddress, request: CompareRequest, as_json: bool) -> int | None:
    """Have the server compare; print and return the exit code. None when the server could not be reached at
    all (nothing was done: the caller does the work itself)."""
    try:
        answer = _call(address, "POST", "/api/local/compare", json.dumps(request.to_json()).encode(), None)
    except OSError:
        return None
    line = StatusLine()
    outcome: CompareOutcome | None = None
    try:
        for raw in answer:
            event = msgspec.json.decode(raw, type=CompareEvent, strict=True)
            if event.step is not None:
                line.update(event.step, event.done, event.total)
            elif event.outcome is not None:
                outcome = event.outcome
            else:
                raise ServerGone(str(event.failure))
    except (OSError, ValueError, msgspec.DecodeError, ServerGone) as exc:
        line.close()
        print(f"tensor-debugger: the server at {address.url} failed while comparing: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    finally:
        line.close()
        answer.close()
    if outcome is None:
        print(f"tensor-debugger: the server at {address.url} stopped answering while comparing", file=sys.stderr)
        return EXIT_UNUSABLE
    return show_compare(outcome, as_json, wanted=wanted_name(request))


def remote_ingest(
    address: ServerAddress, session: str, run: str, paths: list[Path], against: str | None = None
) -> IngestOutcome | None:
    """Have the server ingest the run; None when it could not be reached (nothing was done)."""
    import urllib.error

    body = msgspec.json.encode(
        IngestRequest(session, run, [str(p.absolute()) for p in paths], [str(p) for p in paths], against)
    )
    try:
        answer = _call(address, "POST", "/api/local/ingest", body, None)
    except urllib.error.HTTPError as exc:  # refused (a malformed request): said as the command would say it
        return IngestOutcome(EXIT_UNUSABLE, IngestReport(session=None, run=None, problems=[], error=str(exc)), str(exc))
    except OSError:
        return None
    with answer:
        return msgspec.json.decode(answer.read(), type=IngestOutcome, strict=True)


def _call(address: ServerAddress, method: str, path: str, body: bytes | None, timeout: float | None) -> Any:
    import urllib.request

    request = urllib.request.Request(
        address.url + path,
        data=body,
        method=method,
        headers={TOKEN_HEADER: address.token, "content-type": "application/json"},
    )
    # No proxy: the address is this machine's own server, whatever the environment says of proxies.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return opener.open(request, timeout=timeout)
