"""A session deleted while one of its runs is still being ingested: refused (409, naming the run), nothing deleted.
The ingest would go on writing that run's rows and arrays after the deletion, and SQLite gives a deleted run's id to
the next run made: another upload's session then showed the deleted upload's tensors. Once ingested, it deletes.

The ingest is held while the deletion is asked for: the server ingests in one child process (one slot), which is
stopped (SIGSTOP) before the upload and let go after. The test used to race the ingest (64 MiB a run) with its
request, and lost where the ingest was quick: a run of the same bytes already ingested (another test's, on a shared
server) is copied, not read."""

from __future__ import annotations

from pathlib import Path

from tests.support import loopback_http
from tests.support.ingesting import held_session
from tests.support.servers import wait_done


def test_a_session_still_ingesting_is_not_deleted(tmp_path: Path) -> None:
    with held_session(tmp_path, "deleted while ingesting") as (server, session_id, held):
        url = f"{server.url}/api/sessions/{session_id}"
        runs = loopback_http.get(url, headers=server.auth, timeout=30).json()["runs"]
        assert [(r["label"], r["status"]) for r in runs] == [("reference", "ingesting"), ("candidate", "ingesting")]
        refused = loopback_http.delete(url, headers=server.auth, timeout=30)
        assert refused.status_code == 409, refused.text
        assert f"session {session_id} is still ingesting runs 'reference', 'candidate'" in refused.text
        assert "nothing was deleted" in refused.text
        assert loopback_http.get(url, headers=server.auth, timeout=30).status_code == 200
        held.release()
        report = wait_done(server, session_id)
        assert report["progress"] == {
            "total": 8,
            "done": 8,
            "pending": 0,
            "failing": 8,
            "errors": 0,
            "not_compared": 0,
        }
        assert loopback_http.delete(url, headers=server.auth, timeout=30).status_code == 204
        assert loopback_http.get(url, headers=server.auth, timeout=30).status_code == 404
