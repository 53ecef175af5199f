"""A pairing file naming a tensor no run has (a typo) is refused naming it, not applied in silence: its tensor
would otherwise be paired by the automatic strategies, not as the user asked."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.support.cli_main import main_cli
from tests.support.dumps import seeded


def runs(root: Path) -> tuple[Path, Path]:
    for side in ("a", "b"):
        (root / side).mkdir()
        for n, name in enumerate(["0_query", "0_key"]):
            torch.save(seeded((4, 4), n), root / side / f"{name}.pth")
    return root / "a", root / "b"


def test_a_pair_naming_a_missing_tensor_is_refused(tmp_path: Path) -> None:
    a, b = runs(tmp_path)
    data = str(tmp_path / "data")
    for entry, said in (
        ({"pairs": [{"a": "0_query", "b": "0_qurey"}]}, "pairs[0]: the candidate has no tensor named '0_qurey'"),
        ({"unpaired": [{"a": "0_value"}]}, "unpaired[0]: the reference has no tensor named '0_value'"),
    ):
        pairing = tmp_path / "pairing.json"
        pairing.write_text(json.dumps(entry))
        done = main_cli("--data-dir", data, "compare", str(a), str(b), "--pairing", str(pairing))
        assert done.returncode == 2, done.stdout
        assert f"pairing file {pairing}: {said}" in done.stderr
    assert "no sessions yet" in main_cli("--data-dir", data, "sessions").stdout  # none left half made
    pairing.write_text(json.dumps({"pairs": [{"a": "0_query", "b": "0_key"}, {"a": "0_key", "b": "0_query"}]}))
    done = main_cli("--data-dir", data, "compare", str(a), str(b), "--pairing", str(pairing), "--json")
    pairs = json.loads(done.stdout)["pairs"]
    assert [(p["a"]["name"], p["b"]["name"], p["strategy"]) for p in pairs] == [
        ("0_query", "0_key", "manual"),
        ("0_key", "0_query", "manual"),
    ]
