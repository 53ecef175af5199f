"""A session deleted while one of its runs is still being ingested: refused (409, naming the run), nothing deleted.
The ingest would go on writing that run's rows and arrays after the deletion, and SQLite gives a deleted run's id to
the next run made: another upload's session then showed the deleted upload's tensors. Once ingested, it deletes."""

from __future__ import annotations

from pathlib import Path

from tests.support import loopback_http
from tests.support.ingesting import upload_still_ingesting
from tests.support.servers import LiveServer, wait_done


def test_a_session_still_ingesting_is_not_deleted(shared_server: LiveServer, tmp_path: Path) -> None:
    session_id = upload_still_ingesting(shared_server, tmp_path, "deleted while ingesting")
    url = f"{shared_server.url}/api/sessions/{session_id}"
    refused = loopback_http.delete(url, headers=shared_server.auth, timeout=30)
    assert refused.status_code == 409, refused.text
    assert f"session {session_id} is still ingesting run" in refused.text and "'reference'" in refused.text
    assert "nothing was deleted" in refused.text
    report = wait_done(shared_server, session_id)
    assert report["progress"] == {"total": 8, "done": 8, "pending": 0, "failing": 8, "errors": 0, "not_compared": 0}
    assert loopback_http.delete(url, headers=shared_server.auth, timeout=30).status_code == 204
    assert loopback_http.get(url, headers=shared_server.auth, timeout=30).status_code == 404
