"""Tensors every tensor-parallel rank holds whole (a norm weight, an embedding) are replicas, not shards: each rank's
copy is compared with the reference and a wrong one fails its pair, naming the rank; real splits (q/k/v along dim 0,
o_proj along dim 1) still merge. Dumps written by torch.save, run through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from litestar.testing import TestClient
from tensor_debugger.settings import Settings
from tensor_debugger.web.app import create_app

from tests.support.cli_main import main_cli
from tests.support.dumps import seeded

HIDDEN, VOCAB = 32, 50


def model(seed: int = 3) -> dict[str, torch.Tensor]:
    """A tensor-parallel-1 layer's weights: two replicated on every rank, four split."""
    return {
        "model.norm.weight": seeded((HIDDEN,), seed),
        "model.embed_tokens.weight": seeded((VOCAB, HIDDEN), seed + 1),
        "layers.0.q_proj.weight": seeded((HIDDEN, HIDDEN), seed + 2),
        "layers.0.k_proj.weight": seeded((HIDDEN, HIDDEN), seed + 3),
        "layers.0.v_proj.weight": seeded((HIDDEN, HIDDEN), seed + 4),
        "layers.0.o_proj.weight": seeded((HIDDEN, HIDDEN), seed + 5),
    }


def rank_weights(full: dict[str, torch.Tensor], ranks: int, wrong: int | None) -> list[dict[str, torch.Tensor]]:
    """Each rank's weights: the replicated ones whole (rank `wrong`'s off by +1 everywhere), q/k/v cut along dim 0
    and o_proj along dim 1."""
    found = []
    for k in range(ranks):
        rows = slice(k * HIDDEN // ranks, (k + 1) * HIDDEN // ranks)
        weights = {}
        for name, tensor in full.items():
            if "proj" not in name:
                weights[name] = tensor.clone() + (1.0 if k == wrong else 0.0)
            elif "o_proj" in name:
                weights[name] = tensor[:, rows].clone()
            else:
                weights[name] = tensor[rows].clone()
        found.append(weights)
    return found


def write_runs(tmp_path: Path, ranks: int, wrong: int | None, layout: str) -> tuple[Path, Path]:
    """The reference (one state dict) and the candidate: `rank{k}/model.pth` folders or `model_rank{k}.pth` files."""
    full = model()
    reference = tmp_path / "tp1"
    reference.mkdir()
    torch.save(full, reference / "model.pth")
    candidate = tmp_path / f"tp{ranks}"
    candidate.mkdir()
    for k, weights in enumerate(rank_weights(full, ranks, wrong)):
        if layout == "folders":
            (candidate / f"rank{k}").mkdir()
            torch.save(weights, candidate / f"rank{k}" / "model.pth")
        else:
            torch.save(weights, candidate / f"model_rank{k}.pth")
    return reference, candidate


def compare(tmp_path: Path, reference: Path, candidate: Path, *more: str) -> tuple[int, str]:
    done = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(reference), str(candidate), *more)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, done.stdout


def by_tensor(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["a"]["name"].rpartition("model.")[2] or p["a"]["name"]: p for p in payload["pairs"]}


def assert_splits_merge(pairs: dict[str, dict[str, Any]], ranks: int) -> None:
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        pair = next(p for key, p in pairs.items() if name in key)
        dim = 1 if name == "o_proj" else 0
        assert pair["status"] == "pass" and pair["replicas"] is None
        assert pair["alignment"] == f"candidate shards concatenated along dim {dim} -> [{HIDDEN}, {HIDDEN}]"
        assert pair["b"]["shape"] == [HIDDEN, HIDDEN] and pair["stats"]["numel"] == HIDDEN * HIDDEN


@pytest.mark.parametrize("layout", ["folders", "files"])
def test_a_wrong_replica_fails_naming_its_rank(tmp_path: Path, layout: str) -> None:
    reference, candidate = write_runs(tmp_path, 2, wrong=1, layout=layout)
    code, out = compare(tmp_path, reference, candidate, "--json")
    assert code == 1
    payload = json.loads(out)
    pairs = by_tensor(payload)
    assert len(pairs) == 6 and payload["unmatched"] == {"a": [], "b": []}
    for name, shape in (("norm.weight", [HIDDEN]), ("embed_tokens.weight", [VOCAB, HIDDEN])):
        pair = next(p for key, p in pairs.items() if key.endswith(name))
        assert pair["status"] == "fail"
        assert pair["replicas"] == {"ranks": 2, "side": "b", "differing": [1]}
        assert "candidate replicated on 2 ranks" in pair["alignment"]
        assert pair["b"]["shape"] == shape  # one copy's shape: nothing concatenated
        stats = pair["stats"]
        # every element of both copies compared: rank 0's all equal, rank 1's all off by one
        assert stats["numel"] == 2 * shape[0] * (shape[1] if len(shape) > 1 else 1)
        assert stats["mismatched"] == stats["numel"] // 2
        assert stats["argmax"][0] == 1 and stats["max_abs_diff"] == pytest.approx(1.0, abs=1e-6)
    assert_splits_merge(pairs, 2)
    first = payload["first_divergence"]["name"]
    assert first.endswith(("norm.weight", "embed_tokens.weight"))

    code, table = compare(tmp_path, reference, candidate)
    assert code == 1
    # a state dict's weights: in no known execution order, so not "first"
    line = next(x for x in table.splitlines() if x.startswith("DIVERGENCE (no execution order is known"))
    assert f"not the first to fail): {first} (no layer): rank 1's replica differs: max |diff| 1 at [1, " in line


@pytest.mark.parametrize("layout", ["folders", "files"])
def test_right_replicas_pass(tmp_path: Path, layout: str) -> None:
    reference, candidate = write_runs(tmp_path, 2, wrong=None, layout=layout)
    code, out = compare(tmp_path, reference, candidate, "--json")
    assert code == 0
    pairs = by_tensor(json.loads(out))
    for name in ("norm.weight", "embed_tokens.weight"):
        pair = next(p for key, p in pairs.items() if key.endswith(name))
        assert pair["status"] == "pass" and "replicated on 2 ranks" in pair["alignment"]
        assert pair["replicas"] == {"ranks": 2, "side": "b", "differing": []}
    assert_splits_merge(pairs, 2)
    code, table = compare(tmp_path, reference, candidate)
    assert code == 0 and "no divergence: 6 of 6 pairs pass" in table
    assert "candidate replicated on 2 ranks" in table


def test_four_ranks_with_rank_two_wrong(tmp_path: Path) -> None:
    reference, candidate = write_runs(tmp_path, 4, wrong=2, layout="folders")
    code, out = compare(tmp_path, reference, candidate, "--json")
    assert code == 1
    pairs = by_tensor(json.loads(out))
    norm = next(p for key, p in pairs.items() if key.endswith("norm.weight"))
    assert norm["replicas"] == {"ranks": 4, "side": "b", "differing": [2]}
    assert "replicated on 4 ranks" in norm["alignment"] and norm["stats"]["mismatched"] == HIDDEN
    assert norm["stats"]["argmax"][0] == 2
    assert_splits_merge(pairs, 4)
    code, table = compare(tmp_path, reference, candidate)
    assert code == 1 and "rank 2's replica differs" in table


def test_the_pair_page_names_the_wrong_rank(tmp_path: Path) -> None:
    """The page of a failing replicated pair: its steps, the rank whose copy differs, the largest difference in
    that rank's own tensor, and a window of values read through the stacked views."""
    reference, candidate = write_runs(tmp_path, 2, wrong=1, layout="folders")
    code, out = compare(tmp_path, reference, candidate, "--json")
    assert code == 1
    session_id = json.loads(out)["session"]["id"]
    with TestClient(
        create_app(Settings(data_dir=tmp_path / "data", demo=False)), base_url="http://127.0.0.1"
    ) as client:
        pairs = client.get(f"/api/sessions/{session_id}/pairs").json()["pairs"]
        norm = next(p for p in pairs if p["name"].endswith("norm.weight"))
        assert norm["replicas"] == {"ranks": 2, "side": "b", "differing": [1]}
        detail = client.get(f"/api/pairs/{norm['id']}").json()
        assert detail["argmax"]["b"]["tensor"] == "rank1/model.model.norm.weight"
        assert detail["argmax"]["a"]["index"] == detail["argmax"]["aligned"][1:]
        window = client.get(f"/api/pairs/{norm['id']}/slice", params={"index": ":,:", "count": f"2,{HIDDEN}"})
        assert window.status_code == 200, window.text
        values = window.json()
        assert values["a"][0] == values["a"][1]  # the reference, once per rank
        assert values["b"][1][0] == pytest.approx(values["a"][1][0] + 1.0, abs=1e-5)
        assert values["b"][0] == values["a"][0]
        page = client.get(f"/pairs/{norm['id']}")
        assert page.status_code == 200
        assert "candidate replicated on 2 ranks" in page.text
        assert "rank 1&#39;s replica differs" in page.text or "rank 1's replica differs" in page.text
