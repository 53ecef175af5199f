"""Coverage through the API of a live server: the pairs report's verdict and coverage, each unmatched reference
tensor's place and closest candidates, and `PATCH /api/sessions/{id}` with `allow_unmatched` globs."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.support import loopback_http
from tests.support.dumps import layered_dump, make_zip
from tests.support.servers import LiveServer, upload, wait_done


def test_allow_unmatched_through_the_api(shared_server: LiveServer, tmp_path: Path) -> None:
    a = layered_dump(tmp_path / "ref", None, layers=3)
    b = layered_dump(tmp_path / "cand", None, layers=3)
    (b / "2_mlp.pth").unlink()
    tensor = torch.load(b / "2_attn.pth", weights_only=True)
    (b / "2_attn.pth").unlink()
    torch.save(tensor.t().contiguous(), b / "attention_heads_first.pth")
    response = upload(
        shared_server,
        f"coverage api {tmp_path.name}",
        [("reference", make_zip(a, tmp_path / "a.zip")), ("candidate", make_zip(b, tmp_path / "b.zip"))],
    )
    assert response.status_code == 201, response.text
    session_id = response.json()["session"]["id"]
    report = wait_done(shared_server, session_id)
    assert report["verdict"] == "incomplete"
    assert report["coverage"]["reference_tensors"] == 6 and report["coverage"]["compared"] == 4
    assert report["coverage"]["unmatched"] == ["2_attn", "2_mlp"]
    missing = {u["name"]: u for u in report["unmatched"] if u["before_position"] is not None}
    assert set(missing) == {"2_attn", "2_mlp"} and not any(u["allowed"] for u in missing.values())
    assert missing["2_attn"]["before_position"] == 4  # after the four pairs of layers 0 and 1
    closest = missing["2_attn"]["closest"]
    assert closest == [
        {"name": "attention_heads_first", "score": closest[0]["score"], "same_numel": True, "alignment_fits": True}
    ]
    url = f"{shared_server.url}/api/sessions/{session_id}"
    first = loopback_http.get(url + "/first-divergence", headers=shared_server.auth).json()
    assert first["verdict"] == "incomplete" and first["coverage"]["unmatched"] == ["2_attn", "2_mlp"]
    changed = loopback_http.patch(url, json={"allow_unmatched": ["2_*"]}, headers=shared_server.auth)
    assert changed.status_code == 200, changed.text
    assert changed.json()["allow_unmatched"] == ["2_*"]
    report = wait_done(shared_server, session_id)
    assert report["verdict"] == "no_divergence"
    assert report["coverage"]["unmatched"] == [] and report["coverage"]["allowed_unmatched"] == ["2_attn", "2_mlp"]
    changed = loopback_http.patch(url, json={"allow_unmatched": ["2_attn"]}, headers=shared_server.auth)
    assert wait_done(shared_server, session_id)["coverage"]["unmatched"] == ["2_mlp"]
    changed = loopback_http.patch(url, json={"allow_unmatched": []}, headers=shared_server.auth)
    assert changed.json()["allow_unmatched"] == []
    assert wait_done(shared_server, session_id)["verdict"] == "incomplete"
