"""Send a captured trace folder to a running server as a run of a named session, streamed from disk."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

TIMEOUT_S = 600.0


def upload_run(server: str, session: str, run: str, folder: Path) -> tuple[int, int]:
    """Upload every file of `folder` as run `run` of session `session` (created when no session has that name);
    returns (session id, run id). Raises RuntimeError with the server's reasons when it refuses."""
    base = server.rstrip("/")
    with httpx.Client(timeout=TIMEOUT_S) as client:
        found = client.get(f"{base}/api/sessions", params={"q": session})
        _check(found, base)
        existing = next((s for s in found.json() if s["name"] == session), None)
        with ExitStack() as stack:
            files = [
                (run, (p.name, stack.enter_context(p.open("rb")), "application/octet-stream"))
                for p in sorted(folder.iterdir())
                if p.is_file()
            ]
            if existing is None:
                response = client.post(f"{base}/api/sessions", data={"name": session}, files=files)
            else:
                response = client.post(f"{base}/api/sessions/{existing['id']}/runs", params={"label": run}, files=files)
        _check(response, base)
        body = response.json()
    return _ids(body, existing)


def _check(response: httpx.Response, base: str) -> None:
    if response.is_success:
        return
    try:
        detail: Any = response.json()
    except ValueError:
        detail = response.text[:2000]
    raise RuntimeError(f"{base} refused the capture ({response.status_code}): {detail}")


def _ids(body: dict[str, Any], existing: dict[str, Any] | None) -> tuple[int, int]:
    runs = body.get("runs") or []
    session_id = existing["id"] if existing is not None else body["session"]["id"]
    return int(session_id), int(runs[-1]["run_id"])
