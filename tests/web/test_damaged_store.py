"""A chunk file deleted from the server's data dir: the API's reads of stored values (a slice, a profile) answer
500 naming the chunk (a profile once answered 400, as if the request were wrong), and the OpenAPI document the server
serves declares that 500 for each of them, with the body it has (an `ErrorReport`), so a client generated from it
knows the answer; the session's profiles list the damaged pair as skipped, saying why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tests.support import loopback_http as http
from tests.support.servers import LiveServer, upload, wait_done


def _declared(document: dict[str, Any], path: str, status: str) -> dict[str, Any] | None:
    response: dict[str, Any] | None = document["paths"][path]["get"]["responses"].get(status)
    return response


def test_reads_of_a_missing_chunk_answer_a_declared_500(live_server: LiveServer, tmp_path: Path) -> None:
    rng = np.random.default_rng(20)
    values = rng.standard_normal((64, 32)).astype(np.float32)
    for side, shift in (("reference", 0.0), ("candidate", 1.0)):
        (tmp_path / side).mkdir()
        np.save(tmp_path / side / "0_query.npy", values + shift)  # fails: a profile is read from the chunks
    files = [(side, tmp_path / side / "0_query.npy") for side in ("reference", "candidate")]
    created = upload(live_server, "damaged store", files)
    assert created.status_code == 201, created.text
    (pair,) = wait_done(live_server, created.json()["session"]["id"])["pairs"]
    assert pair["status"] == "fail", pair
    arrays = [p for p in live_server.data_dir.rglob("zarr.json") if json.loads(p.read_text())["node_type"] == "array"]
    assert len(arrays) == 2, arrays
    gone = [p for p in arrays[0].parent.iterdir() if p.name != "zarr.json"]
    assert gone, arrays[0].parent
    for chunk in gone:
        chunk.unlink()

    document = http.get(live_server.url + "/schema/openapi.json").json()
    schemas = document["components"]["schemas"]
    for path, params in (
        ("/api/pairs/{pair_id}/slice", {"index": ":,:", "count": "64,32"}),
        ("/api/pairs/{pair_id}/profile", {"dim": "1"}),
    ):
        answer = http.get(live_server.url + path.replace("{pair_id}", str(pair["id"])), params=params)
        assert answer.status_code == 500, (path, answer.text)
        body = answer.json()
        assert body["status_code"] == 500 and "is missing: the data dir is damaged" in body["detail"], body
        declared = _declared(document, path, "500")
        assert declared is not None, f"GET {path} answers 500 but the document does not declare it"
        assert "damaged" in declared["description"], declared
        ref = declared["content"]["application/json"]["schema"]["$ref"].removeprefix("#/components/schemas/")
        assert set(body) <= set(schemas[ref]["properties"]) and set(schemas[ref]["required"]) <= set(body), ref
    # the session's profiles: the damaged pair skipped, saying why, beside the others
    session_id = created.json()["session"]["id"]
    profiles = http.get(f"{live_server.url}/api/sessions/{session_id}/profiles", params={"dim": "1"})
    assert profiles.status_code == 200, profiles.text
    (skipped,) = profiles.json()["skipped"]
    assert "is missing: the data dir is damaged" in skipped["reason"], skipped
    # an operation that reads no stored value declares no 500
    assert _declared(document, "/api/sessions/{session_id}", "500") is None
