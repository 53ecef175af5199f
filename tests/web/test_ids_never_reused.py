"""A deleted session's ids (its own, its runs', tensors' and pairs') are never given to anything made after it: an
old link (/sessions/16, /runs/35, a pair's page) or an API client's id answers 404, never another upload's data.
SQLite without AUTOINCREMENT gave a new row the highest id plus one, so deleting the newest session handed its ids
to the next upload's; PostgreSQL's sequences never go back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support import loopback_http as http
from tests.support.postgres import DATABASES
from tests.support.servers import LiveServer, upload, wait_done


def dumps(tmp_path: Path) -> list[tuple[str, Path]]:
    generator = torch.Generator().manual_seed(0)
    tensors = {f"{layer}_{stage}": torch.randn(8, 4, generator=generator) for layer in range(2) for stage in "qk"}
    torch.save(tensors, tmp_path / "reference.pth")
    torch.save({k: v + 0.5 for k, v in tensors.items()}, tmp_path / "candidate.pth")
    return [("reference", tmp_path / "reference.pth"), ("candidate", tmp_path / "candidate.pth")]


def ids_of(server: LiveServer, session_id: int) -> dict[str, set[int]]:
    """The ids the API gives of the session, its runs, their tensors and its pairs."""
    session = http.get(f"{server.url}/api/sessions/{session_id}").json()
    runs = {int(r["id"]) for r in session["runs"]}
    tensors = {int(t["id"]) for r in runs for t in http.get(f"{server.url}/api/runs/{r}/tensors").json()}
    pairs = {int(p["id"]) for p in wait_done(server, session_id)["pairs"]}
    assert len(runs) == 2 and len(tensors) == 8 and len(pairs) == 4
    return {"session": {session_id}, "runs": runs, "tensors": tensors, "pairs": pairs}


@pytest.mark.parametrize("database_url", DATABASES, indirect=True)
def test_a_deleted_sessions_ids_are_never_given_again(live_server: LiveServer, tmp_path: Path) -> None:
    files = dumps(tmp_path)
    created = upload(live_server, "first", files)
    assert created.status_code == 201, created.text
    old = ids_of(live_server, int(created.json()["session"]["id"]))
    (old_session,) = old["session"]
    assert http.delete(f"{live_server.url}/api/sessions/{old_session}").status_code == 204

    again = upload(live_server, "second", files)  # the newest session gone: SQLite's highest ids are free again
    assert again.status_code == 201, again.text
    new = ids_of(live_server, int(again.json()["session"]["id"]))
    for kind, ids in new.items():
        assert min(ids) > max(old[kind]), (kind, old[kind], ids)

    old_run, old_tensor, old_pair = min(old["runs"]), min(old["tensors"]), min(old["pairs"])
    for path in (
        f"/sessions/{old_session}",
        f"/runs/{old_run}",
        f"/pairs/{old_pair}",
        f"/api/sessions/{old_session}",
        f"/api/runs/{old_run}",
        f"/api/runs/{old_run}/tensors",
        f"/api/tensors/{old_tensor}",
        f"/api/pairs/{old_pair}",
    ):
        answer = http.get(live_server.url + path)
        assert answer.status_code == 404, (path, answer.status_code, answer.text[:200])
