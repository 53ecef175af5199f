"""A pairing file naming tensors, sent while a run of its session is still ingesting: its names cannot be checked
against the runs' tensors yet, and taken unchecked a typo would leave its tensor to the automatic strategies,
unsaid. It is refused (409 from the API, the page's upload saying so with 409), nothing changed; a file of rules
only is taken; once the runs are ready the same file is checked (a typo 400, naming it) and a good one applied.

The ingest is held while the files are sent (tests/support/ingesting.py HeldIngests: the server's one ingest child
stopped), on a server of the test's own: racing it, as on the shared server, every request before the ingest ends,
lost where the ingest was quick."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from tests.support import loopback_http as http
from tests.support.ingesting import held_session
from tests.support.servers import wait_done


def test_a_pairing_file_is_refused_while_a_run_ingests(tmp_path: Path) -> None:
    with held_session(tmp_path, "pairing while ingesting") as (server, session_id, held):
        url = f"{server.url}/api/sessions/{session_id}/pairing"
        typo = {"pairs": [{"a": "0_query", "b": "1_qurey"}]}

        refused = http.put(url, json=typo, headers=server.auth, timeout=30)
        assert refused.status_code == 409, refused.text
        assert f"session {session_id} is still ingesting run" in refused.text and "nothing was changed" in refused.text
        with httpx.Client(base_url=server.url, headers=server.auth, timeout=30) as client:
            found = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/").text)
            assert found is not None
            page = client.post(
                f"/sessions/{session_id}/pairing",
                data={"csrf_token": found.group(1)},
                files={"file": ("pairing.json", b'{"unpaired": [{"a": "0_qurey"}]}', "application/json")},
            )
        assert page.status_code == 409, page.text[:300]
        assert f"session {session_id} is still ingesting run" in page.text
        rules = http.put(url, json={"dims": {"*query*": "tokens,hidden"}}, headers=server.auth, timeout=30)
        assert rules.status_code == 200, rules.text  # no name of a tensor in it: nothing to check
        exported = http.get(url, headers=server.auth, timeout=30).json()
        assert exported["pairs"] == [] and exported["unpaired"] == []
        runs = http.get(f"{server.url}/api/sessions/{session_id}", headers=server.auth, timeout=30).json()["runs"]
        assert {r["status"] for r in runs} == {"ingesting"}, runs  # all of it while the runs ingest

        held.release()
        report = wait_done(server, session_id)
        names = sorted((p["a"]["name"], p["b"]["name"]) for p in report["pairs"])
        typo = {"pairs": [{"a": names[0][0], "b": "1_qurey"}]}
        checked = http.put(url, json=typo, headers=server.auth, timeout=30)
        assert checked.status_code == 400, checked.text
        assert "pairs[0]: the candidate has no tensor named '1_qurey'" in checked.text
        good = {"pairs": [{"a": names[0][0], "b": names[1][1]}]}
        applied = http.put(url, json=good, headers=server.auth, timeout=30)
        assert applied.status_code == 200, applied.text
        assert (names[0][0], names[1][1]) in [(p["a"], p["b"]) for p in applied.json()["pairs"]]
