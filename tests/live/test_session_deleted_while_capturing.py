"""A capture whose session a user deletes (DELETE /api/sessions/{id}) while it records, through a real server.

Into a data dir the server also serves, the capture's run exists from the block's start, status "ingesting": the
deletion is refused (409, naming the session and the run) and the capture ends storing its run whole. Through the
server, nothing of the run is there until the block ends: a capture (compared `against` a run of the deleted
session, or not) ends with an error naming the session, keeps nothing (no session made again, no staged file left),
and the server answers on."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import torch
from tensor_debugger import capture

from tests.support import loopback_http as http
from tests.support.servers import LiveServer


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def session_id(server: LiveServer, name: str) -> int | None:
    listed = http.get(f"{server.url}/api/sessions", params={"q": name}, headers=server.auth, timeout=30).json()
    return next((int(s["id"]) for s in listed if s["name"] == name), None)


def test_a_capture_into_the_data_dir_keeps_its_session_from_deletion(shared_server: LiveServer) -> None:
    model, x = net(), torch.randn(2, 16)
    with (
        torch.no_grad(),
        capture(model, "deleted while capturing: data dir", "reference", data_dir=shared_server.data_dir),
    ):
        model(x)
    with (
        torch.no_grad(),
        capture(model, "deleted while capturing: data dir", "candidate", data_dir=shared_server.data_dir) as result,
    ):
        model(x)
        found = session_id(shared_server, "deleted while capturing: data dir")
        assert found is not None
        refused = http.delete(f"{shared_server.url}/api/sessions/{found}", headers=shared_server.auth, timeout=30)
        assert refused.status_code == 409, refused.text
        assert f"session {found} is still ingesting run 'candidate'" in refused.text
        assert "nothing was deleted" in refused.text
    assert result.session_id == found and result.tensors > 0
    run = http.get(f"{shared_server.url}/api/runs/{result.run_id}", headers=shared_server.auth, timeout=30).json()
    assert (run["status"], run["tensors"]) == ("ready", result.tensors)
    with sqlite3.connect(shared_server.data_dir / "metadata.sqlite3") as conn:
        assert conn.execute("SELECT count(*) FROM runs WHERE session_id = ?", (found,)).fetchone()[0] == 2
    conn.close()
    deleted = http.delete(f"{shared_server.url}/api/sessions/{found}", headers=shared_server.auth, timeout=30)
    assert deleted.status_code == 204  # once the capture has ended
    assert not (shared_server.data_dir / "arrays" / "runs" / str(result.run_id)).exists()


@pytest.mark.parametrize(
    ("name", "against"),
    [
        ("deleted while capturing: server", "reference"),  # compared against a run of the deleted session
        # without `against`: the session the capture found as its block opened is gone when the run is sent. The
        # run is not uploaded into a session made again under the same name (it would hold the candidate alone, as
        # its reference)
        ("deleted while capturing: no against", None),
    ],
    ids=["against its run", "no against"],
)
def test_a_capture_through_the_server_into_a_session_deleted_meanwhile_says_so(
    shared_server: LiveServer, tmp_path: Path, name: str, against: str | None
) -> None:
    """The capture fails naming the session, and keeps nothing: no session made again, no staged file left."""
    model, x = net(), torch.randn(2, 16)
    with torch.no_grad(), capture(model, name, "reference", server=shared_server.url):
        model(x)
    found = session_id(shared_server, name)
    assert found is not None
    staging = tmp_path / "staging"
    staging.mkdir()
    with (
        pytest.raises(RuntimeError) as raised,
        torch.no_grad(),
        capture(model, name, "candidate", server=shared_server.url, against=against, staging=staging),
    ):
        model(x)
        deleted = http.delete(f"{shared_server.url}/api/sessions/{found}", headers=shared_server.auth, timeout=30)
        assert deleted.status_code == 204, deleted.text
    assert f"session {name!r} (id {found}) was deleted during the capture" in str(raised.value)
    assert "run 'candidate' was not uploaded" in str(raised.value)
    assert session_id(shared_server, name) is None  # not made again with the candidate alone
    assert list(staging.iterdir()) == []  # the staged run's files removed
    assert (
        http.get(f"{shared_server.url}/api/sessions/{found}", headers=shared_server.auth, timeout=30).status_code == 404
    )
    assert http.get(f"{shared_server.url}/healthz", timeout=30).status_code == 200
