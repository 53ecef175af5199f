"""A first divergence stands only on what was compared before it: a pair earlier in execution order that was not
compared (incomparable: a tensor-parallel shard missing, a reshaped tensor) is named under it, in the CLI, the JSON
and the session page, as a place the divergence may have begun. With several candidates, one candidate's first
divergence is matched with its own pair, never another candidate's of the same name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from litestar.testing import TestClient
from numpy.typing import NDArray
from tensor_debugger.settings import Settings
from tensor_debugger.web.app import create_app

from tests.support.cli_main import main_cli

STAGES = ("query", "key", "attn_out")


def _dumps(folder: Path, change: dict[str, Any]) -> Path:
    """Two layers of three stages of one seeded set of values, each tensor changed by `change`'s function of it."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    for layer in range(2):
        for stage in STAGES:
            name = f"{layer}_{stage}"
            values: NDArray[Any] = rng.standard_normal((4, 8)).astype(np.float32)
            np.save(folder / f"{name}.npy", change.get(name, lambda x: x)(values))
    return folder


def _shifted(x: NDArray[Any]) -> NDArray[Any]:
    return x + np.float32(0.5)


def test_an_incomparable_pair_before_the_first_divergence_is_named(tmp_path: Path) -> None:
    ref = _dumps(tmp_path / "ref", {})
    cand = _dumps(tmp_path / "cand", {"1_query": lambda x: x[:, :6], "1_key": _shifted, "1_attn_out": _shifted})
    data = tmp_path / "data"
    done = main_cli("--data-dir", str(data), "compare", str(ref), str(cand), "--json")
    assert done.returncode == 1, done.stderr
    first = json.loads(done.stdout)["first_divergence"]
    assert first["name"] == "1_key" and first["in_execution_order"] is True
    assert first["not_compared_before"] == ["1_query (incomparable: [4, 8] vs [4, 6])"]

    table = main_cli("--data-dir", str(data), "compare", str(ref), str(cand)).stdout
    said = "1 pair before it was not compared: 1_query (incomparable: [4, 8] vs [4, 6]): the divergence may have begun"
    assert said in table

    with TestClient(create_app(Settings(data_dir=data, demo=False)), base_url="http://127.0.0.1") as client:
        page = client.get("/sessions/1")
        api = client.get("/api/sessions/1/pairs")
    assert page.status_code == 200 and api.status_code == 200
    assert 'id="not-compared-before"' in page.text and "1_query (incomparable: [4, 8] vs [4, 6])" in page.text
    assert api.json()["first_divergence"]["not_compared_before"] == ["1_query (incomparable: [4, 8] vs [4, 6])"]


def test_nothing_is_said_where_every_pair_before_it_was_compared(tmp_path: Path) -> None:
    ref = _dumps(tmp_path / "ref", {})
    cand = _dumps(tmp_path / "cand", {"1_key": _shifted, "1_attn_out": _shifted})
    done = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(ref), str(cand), "--json")
    assert done.returncode == 1, done.stderr
    first = json.loads(done.stdout)["first_divergence"]
    assert first["name"] == "1_key" and first["not_compared_before"] == []


def test_one_candidates_first_divergence_is_not_another_candidates_pair(tmp_path: Path) -> None:
    """`compare ref fails shapes`: `fails`'s first divergence is `1_query`; `shapes` holds every tensor in another
    shape, so all of its pairs are incomparable, `1_query` among them, and the CLI lists all of them as not
    compared, as the JSON does."""
    ref = _dumps(tmp_path / "ref", {})
    fails = _dumps(tmp_path / "fails", {f"1_{s}": _shifted for s in STAGES})
    shapes = _dumps(tmp_path / "shapes", {f"{layer}_{s}": lambda x: x[:, :6] for layer in range(2) for s in STAGES})
    data = str(tmp_path / "data")
    done = main_cli("--data-dir", data, "compare", str(ref), str(fails), str(shapes), "--json")
    out = json.loads(done.stdout)
    assert out["first_divergences"]["fails"]["name"] == "1_query"
    assert len(out["coverage"]["not_compared"]) == 6
    table = main_cli("--data-dir", data, "compare", str(ref), str(fails), str(shapes)).stdout
    assert "NOT COMPARED: 6 pairs could not be compared (error or incomparable)" in table, table
