"""Nothing a careless or hostile upload does takes the server down or leaves anything behind, on the real server
process: a zip of zips, a full disk, a server killed mid-upload, two runs racing."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.bombs import nested_zip_bomb
from tests.support.polling import wait_until
from tests.support.servers import LiveServer, upload


def staging_left(server: LiveServer) -> list[str]:
    staging = server.data_dir / "staging"
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


def test_zip_of_zips_is_refused_within_seconds(shared_server: LiveServer, tmp_path: Path) -> None:
    bomb = nested_zip_bomb(tmp_path / "bomb.zip")  # about 20 KB holding eight zips of 1 GiB of zeros each
    response = upload(shared_server, "nested bomb", [("ref", bomb)])  # refused by declared sizes: nothing written
    assert response.status_code == 422, response.text
    problems = response.json()["runs"][0]["problems"]
    assert [p["file"] for p in problems] == [f"bomb.zip/inner{i}.zip" for i in range(8)]
    assert all("TENSOR_DEBUGGER_MAX_EXPANSION_RATIO" in p["reason"] for p in problems)
    wait_until(lambda: staging_left(shared_server) == [], what="staging to be emptied", timeout=10)
    assert httpx.get(shared_server.url + "/api/sessions").status_code == 200
