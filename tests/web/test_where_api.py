"""`where` through the API and the pages, and the session setting `dims` that names dimensions: PATCH, the pairing
file, the pair page, the error profiles grouped by named dimension."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support import loopback_http
from tests.support.dumps import make_zip
from tests.support.servers import LiveServer, upload, wait_done

DIMS = {"*attn*": "batch,heads,tokens,head_dim", "*mlp*": "batch,tokens,hidden"}
HEAD_BUG = [
    {"dim": 1, "name": "heads", "size": 16, "ranges": [[5, 5]]},
    {"dim": 2, "name": "tokens", "size": 64, "ranges": [[10, 12]]},
]


@pytest.fixture
def session(shared_server: LiveServer, tmp_path: Path) -> int:
    """Layer 1's attention (1 x 16 heads x 64 tokens x 32) off in head 5 at tokens 10 to 12; layer 2's MLP
    (1 x 64 tokens x 128) off at tokens 20 and 21; layer 0's equal."""
    values = torch.Generator().manual_seed(7)
    tensors = {
        "0_attn": torch.randn(1, 16, 64, 32, generator=values),
        "1_attn": torch.randn(1, 16, 64, 32, generator=values),
        "2_mlp": torch.randn(1, 64, 128, generator=values),
    }
    changed = {name: t.clone() for name, t in tensors.items()}
    changed["1_attn"][0, 5, 10:13, :] -= 0.25
    changed["2_mlp"][0, 20:22, :] += 1.0
    for side, values_of in (("ref", tensors), ("cand", changed)):
        (tmp_path / side).mkdir()
        for name, tensor in values_of.items():
            torch.save(tensor, tmp_path / side / f"{name}.pth")
    files = [
        (label, make_zip(tmp_path / side, tmp_path / f"{side}.zip"))
        for label, side in (("reference", "ref"), ("candidate", "cand"))
    ]
    response = upload(shared_server, f"where {tmp_path.name}", files)
    assert response.status_code == 201, response.text
    session_id = int(response.json()["session"]["id"])
    wait_done(shared_server, session_id)
    return session_id


def get(server: LiveServer, path: str, **params: Any) -> Any:
    response = loopback_http.get(server.url + path, params=params, headers=server.auth, timeout=60)
    assert response.status_code == 200, response.text
    return response.json() if path.startswith("/api/") else response.text


def test_where_named_by_the_session(shared_server: LiveServer, session: int) -> None:
    pairs = get(shared_server, f"/api/sessions/{session}/pairs")
    by_name = {p["name"]: p for p in pairs["pairs"]}
    assert by_name["0_attn"]["where"] is None  # passes
    unnamed = [{**w, "name": None} for w in HEAD_BUG]
    assert by_name["1_attn"]["where"] == unnamed
    assert pairs["first_divergence"]["where"] == unnamed
    attn_id, mlp_id = by_name["1_attn"]["id"], by_name["2_mlp"]["id"]

    url = f"{shared_server.url}/api/sessions/{session}"
    for bad, said in (({"*": "a,,b"}, "is not a dimension name"), ({"*": "a,a"}, "names a dimension twice")):
        refused = loopback_http.patch(url, json={"dims": bad}, headers=shared_server.auth)
        assert refused.status_code == 400 and said in refused.text, refused.text
    patched = loopback_http.patch(url, json={"dims": DIMS}, headers=shared_server.auth)
    assert patched.status_code == 200 and patched.json()["dims"] == DIMS, patched.text

    assert get(shared_server, f"/api/pairs/{attn_id}")["where"] == HEAD_BUG
    assert get(shared_server, f"/api/pairs/{mlp_id}")["where"] == [
        {"dim": 1, "name": "tokens", "size": 64, "ranges": [[20, 21]]}
    ]
    assert get(shared_server, f"/api/sessions/{session}/first-divergence")["first_divergence"]["where"] == HEAD_BUG
    assert "in heads 5, tokens 10-12" in get(shared_server, f"/pairs/{attn_id}")
    assert "in heads 5, tokens 10-12" in get(shared_server, f"/sessions/{session}")  # the first divergence's

    # the error profiles along each pair's own "tokens": the attention's dimension 2, the MLP's 1
    profiles = get(shared_server, f"/api/sessions/{session}/profiles", dim="tokens")
    assert (profiles["dim"], profiles["name"]) == (None, "tokens")
    rows = {r["name"]: r for r in profiles["rows"]}
    assert {n: r["dim"] for n, r in rows.items()} == {"0_attn": 2, "1_attn": 2, "2_mlp": 1}
    assert [t for t, v in enumerate(rows["1_attn"]["max_abs_diff"]) if v > 0] == [10, 11, 12]
    assert [t for t, v in enumerate(rows["2_mlp"]["max_abs_diff"]) if v > 0] == [20, 21]
    assert rows["2_mlp"]["dim_names"] == ["batch", "tokens", "hidden"]
    heads = get(shared_server, f"/api/sessions/{session}/profiles", dim="heads")
    assert [r["name"] for r in heads["rows"]] == ["0_attn", "1_attn"]
    assert [s["name"] for s in heads["skipped"]] == ["2_mlp"]
    page = get(shared_server, f"/sessions/{session}/profiles", dim="tokens")
    assert "each pair&#39;s dimension named tokens" in page or "each pair's dimension named tokens" in page

    # the pairing file carries the names, and clears them
    pairing_url = f"{shared_server.url}/api/sessions/{session}/pairing"
    assert get(shared_server, f"/api/sessions/{session}/pairing")["dims"] == DIMS
    cleared = loopback_http.put(pairing_url, json={"dims": None}, headers=shared_server.auth)
    assert cleared.status_code == 200 and cleared.json()["dims"] is None, cleared.text
    wait_done(shared_server, session)
    assert get(shared_server, f"/api/sessions/{session}/first-divergence")["first_divergence"]["where"] == unnamed
    refused = loopback_http.put(pairing_url, json={"dims": {"*attn*": 3}}, headers=shared_server.auth)
    assert refused.status_code == 400 and "dims" in refused.text, refused.text
