"""A pair of empty tensors (0 elements: an expert given no token, an empty cache) has null statistics: the session
page, its pairs API and the pair page read them without failing, and the pair page offers no heatmap of no cell."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from litestar.testing import TestClient
from tensor_debugger import capture
from tensor_debugger.settings import Settings
from tensor_debugger.web.app import create_app
from torch import nn

from tests.support.cli_main import main_cli


class _Empty(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(x)[:, :0] * 2
        return out


def test_a_capture_holding_an_empty_tensor_reads_on_every_page(tmp_path: Path) -> None:
    data = tmp_path / "data"
    torch.manual_seed(0)
    model = _Empty().eval()
    x = torch.randn(2, 4)
    for run in ("reference", "candidate"):
        with torch.no_grad(), capture(model, "empty", run, data_dir=data):
            model(x)
    with TestClient(create_app(Settings(data_dir=data, demo=False)), base_url="http://127.0.0.1") as client:
        page = client.get("/sessions/1")
        api = client.get("/api/sessions/1/pairs")
        assert (page.status_code, api.status_code) == (200, 200), (page.text[-2000:], api.text[-2000:])
        empty = next(p for p in api.json()["pairs"] if p["name"] == "_Empty_outputs")
        assert empty["status"] == "pass" and empty["stats"]["numel"] == 0 and empty["stats"]["cosine"] is None
        pair_page = client.get(f"/pairs/{empty['id']}")
        assert pair_page.status_code == 200 and "heatmap.png" not in pair_page.text


def test_an_empty_dump_pairs_page_reads(tmp_path: Path) -> None:
    for side in ("ref", "cand"):
        (tmp_path / side).mkdir()
        np.save(tmp_path / side / "x.npy", np.zeros((2, 0), np.float32))
    data = tmp_path / "data"
    done = main_cli("--data-dir", str(data), "compare", str(tmp_path / "ref"), str(tmp_path / "cand"))
    assert done.returncode == 0, done.stdout + done.stderr
    with TestClient(create_app(Settings(data_dir=data, demo=False)), base_url="http://127.0.0.1") as client:
        assert client.get("/pairs/1").status_code == 200
