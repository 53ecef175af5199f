"""A chunk file deleted from a stored tensor of a run in the data dir: comparing the runs again (read back from the
store) says the pair's error naming the chunk and the session is incomplete, never a false fail (ones read as the
fill value's zeros) or a false pass (zeros on both sides, where the fill value would have matched)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support import loopback_http
from tests.support.cli_main import main_cli
from tests.support.servers import LiveServer, free_port, wait_done


@pytest.mark.parametrize("value", [1.0, 0.0], ids=["would-fail", "would-pass"])
def test_a_deleted_chunk_file_is_the_pairs_error(tmp_path: Path, value: float) -> None:
    ref, cand, data = tmp_path / "ref", tmp_path / "cand", tmp_path / "data"
    ref.mkdir()
    cand.mkdir()
    tensor = torch.full((4096, 1024), value)
    tensor[0, 0] = 2.0  # the two runs' tensors differ from a tensor of the fill value
    torch.save(tensor, ref / "0_query.pth")
    close = tensor.clone()
    close[0, 0] = 2.0000002  # within the tolerance: the runs pass, and are stored apart
    torch.save(close, cand / "0_query.pth")
    first = main_cli("--data-dir", str(data), "compare", str(ref), str(cand), "--json")
    assert first.returncode == 0, first.stderr
    arrays = sorted(p for p in data.rglob("zarr.json") if json.loads(p.read_text())["node_type"] == "array")
    assert len(arrays) == 2, arrays  # the reference's, the candidate's
    names = (p for p in arrays[0].parent.iterdir() if p.name != "zarr.json")
    chunks = sorted(names, key=lambda p: [int(c) for c in p.name.split(".")[1:]])  # "c.15.0": in the grid's order
    assert len(chunks) > 1, chunks
    chunks[-1].unlink()  # the last rows: `value` in both runs
    # another tolerance: the pair is compared again, its runs read back from the store
    again = main_cli(
        "--data-dir", str(data), "compare", str(ref), str(cand), "--json", "--name", "again", "--rtol", "1e-4"
    )
    out = json.loads(again.stdout)
    (pair,) = out["pairs"]
    assert pair["status"] == "error", pair
    assert (
        pair["error"]
        == f"the stored chunk file {chunks[-1]} of tensor 0_query in run ref is missing: the data dir is damaged"
    )
    assert out["verdict"] == "incomplete" and out["first_divergence"] is None
    assert again.returncode != 0
    server = LiveServer(data, free_port()).start()  # the app on the same data dir: the pair's JSON and page
    try:
        sessions = loopback_http.get(f"{server.url}/api/sessions").json()
        report = wait_done(server, next(s["id"] for s in sessions if s["name"] == "again"))
        assert report["verdict"] == "incomplete", report
        (listed,) = report["pairs"]
        detail = loopback_http.get(f"{server.url}/api/pairs/{listed['id']}").json()
        assert detail["status"] == "error" and "is missing: the data dir is damaged" in detail["error"], detail
        page = loopback_http.get(f"{server.url}/pairs/{listed['id']}")
        assert page.status_code == 200 and "is missing: the data dir is damaged" in page.text
        window = loopback_http.get(f"{server.url}/api/pairs/{listed['id']}/slice", params={"index": "4095,:"})
        assert window.status_code == 500 and f"chunk file {chunks[-1]} is missing" in window.json()["detail"], (
            window.text
        )  # no values
        assert loopback_http.get(f"{server.url}/api/sessions").status_code == 200  # the server stays up
    finally:
        server.stop()
