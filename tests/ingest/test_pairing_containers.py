"""Pairing that does not depend on how each run was packaged: a state dict in one `.pth` against the same
weights in a `.safetensors` with a `model.` prefix, an archive of per-tensor files against one dict, and a
Hugging Face checkpoint saved whole, sharded (with its index) and as a plain state dict, in every combination."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from tensor_debugger.cli.compare import run_compare
from tensor_debugger.cli.compare_output import compare_request
from tensor_debugger.services import Services

from tests.support.built_once import built_once
from tests.support.dumps import make_tar, make_zip, seeded


def compare(services: Services, capsys: pytest.CaptureFixture[str], a: Path, b: Path) -> tuple[int, dict[str, Any]]:
    code = run_compare(services, compare_request(a, b, None, None, None), True)
    return code, json.loads(capsys.readouterr().out)


def state_dict() -> dict[str, torch.Tensor]:
    names = [
        "embed_tokens.weight",
        "layers.0.q_proj.weight",
        "layers.0.k_proj.weight",
        "layers.0.v_proj.weight",
        "layers.0.o_proj.weight",
        "layers.0.mlp.weight",
        "norm.weight",
    ]
    return {name: seeded((8, 8) if "norm" not in name else (8,), n) for n, name in enumerate(names)}


def test_state_dict_pth_against_prefixed_safetensors(
    services: Services, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights = state_dict()
    torch.save(weights, tmp_path / "a.pth")
    save_file({f"model.{k}": v.contiguous() for k, v in weights.items()}, str(tmp_path / "b.safetensors"))
    code, out = compare(services, capsys, tmp_path / "a.pth", tmp_path / "b.safetensors")
    assert code == 0, out
    assert len(out["pairs"]) == 7 and out["unmatched"] == {"a": [], "b": []}
    names = {(p["a"]["name"], p["b"]["name"]) for p in out["pairs"]}
    # names shown keep the file: where to find each tensor
    assert ("a.layers.0.q_proj.weight", "b.model.layers.0.q_proj.weight") in names
    assert all(p["status"] == "pass" for p in out["pairs"])


@pytest.mark.parametrize("packed", ["zip", "tar", "folder"])
def test_archive_of_tensor_files_against_one_dict(
    services: Services, tmp_path: Path, capsys: pytest.CaptureFixture[str], packed: str
) -> None:
    folder = tmp_path / "dump"
    folder.mkdir()
    tensors = {
        f"{layer}_{stage}": seeded((4, 6), 10 * layer + n)
        for layer in range(2)
        for n, stage in enumerate(("query", "key", "post_mlp"))
    }
    for name, tensor in tensors.items():
        torch.save(tensor, folder / f"{name}.pth")
    torch.save(tensors, tmp_path / "all.pth")
    run = {
        "zip": lambda: make_zip(folder, tmp_path / "dump.zip", prefix="dump/"),
        "tar": lambda: make_tar(folder, tmp_path / "dump.tar.gz", "w:gz", prefix="dump/"),
        "folder": lambda: folder,
    }[packed]()
    for a, b in ((run, tmp_path / "all.pth"), (tmp_path / "all.pth", run)):
        code, out = compare(services, capsys, a, b)
        assert code == 0, out
        assert len(out["pairs"]) == 6 and out["unmatched"] == {"a": [], "b": []}
        # the dict's keys give layer and stage too, so the pairs come in execution order
        assert [(p["layer"], p["stage"]) for p in out["pairs"]][:3] == [(0, "query"), (0, "key"), (0, "post_mlp")]


def tiny_llama() -> Any:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def save_checkpoints(root: Path) -> dict[str, Any]:
    """The tiny Llama saved by transformers four ways, by torch.save, and one sharded save zipped, under `root`: the
    paths by name, as text, and the keys of the model's state dict."""
    model = tiny_llama()
    made = {
        "safetensors": root / "whole_safetensors",
        "bin": root / "whole_bin",
        "sharded_safetensors": root / "sharded_safetensors",
        "sharded_bin": root / "sharded_bin",
    }
    model.save_pretrained(made["safetensors"], safe_serialization=True)
    model.save_pretrained(made["bin"], safe_serialization=False)
    model.save_pretrained(made["sharded_safetensors"], safe_serialization=True, max_shard_size="20KB")
    model.save_pretrained(made["sharded_bin"], safe_serialization=False, max_shard_size="20KB")
    plain = root / "plain"
    plain.mkdir()
    torch.save(model.state_dict(), plain / "state_dict.pth")
    made["state_dict"] = plain / "state_dict.pth"
    made["sharded_zip"] = make_zip(made["sharded_safetensors"], root / "sharded.zip", prefix="checkpoint/")
    return {"paths": {name: str(path) for name, path in made.items()}, "keys": sorted(model.state_dict())}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The checkpoints of `save_checkpoints`, saved once for the run (tests/support/built_once.py), not once per
    pytest worker that runs one of the module's tests; only read by them."""
    _, made = built_once(tmp_path_factory, "hf-checkpoints", save_checkpoints)
    return {name: Path(path) for name, path in made["paths"].items()}


@pytest.fixture(scope="module")
def llama_keys(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The keys of the saved tiny Llama's state dict (read from the model when `checkpoints` saved it)."""
    _, made = built_once(tmp_path_factory, "hf-checkpoints", save_checkpoints)
    return set(made["keys"])


def test_checkpoints_are_really_sharded(checkpoints: dict[str, Path]) -> None:
    shards = sorted(p.name for p in checkpoints["sharded_safetensors"].glob("*.safetensors"))
    assert len(shards) > 2 and shards[0].startswith("model-00001-of-")
    assert (checkpoints["sharded_safetensors"] / "model.safetensors.index.json").exists()


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("bin", "sharded_safetensors"),
        ("sharded_safetensors", "bin"),
        ("safetensors", "state_dict"),
        ("state_dict", "sharded_safetensors"),
        ("sharded_bin", "safetensors"),
        ("sharded_zip", "state_dict"),
        ("sharded_bin", "sharded_zip"),
    ],
)
def test_hugging_face_checkpoints_pair_in_any_packaging(
    services: Services,
    capsys: pytest.CaptureFixture[str],
    checkpoints: dict[str, Path],
    llama_keys: set[str],
    a: str,
    b: str,
) -> None:
    code, out = compare(services, capsys, checkpoints[a], checkpoints[b])
    assert out["unmatched"] == {"a": [], "b": []}
    assert len(out["pairs"]) == len(llama_keys)
    assert code == 0 and all(p["status"] == "pass" for p in out["pairs"])
    # the index is read, never reported as a file that is not a tensor
    assert not [p for p in out["problems"] if "index.json" in p["file"]]
    # a checkpoint's tensors are named by their keys, whichever shard or file holds them (a plain file's stem leads)
    for side, kind in (("a", a), ("b", b)):
        names = {p[side]["name"] for p in out["pairs"]}
        assert names == llama_keys or (kind == "state_dict" and names == {f"state_dict.{k}" for k in llama_keys}), names


def test_missing_shard_is_reported_by_the_index(
    services: Services, tmp_path: Path, capsys: pytest.CaptureFixture[str], checkpoints: dict[str, Path]
) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(checkpoints["sharded_safetensors"], broken)
    gone = sorted(broken.glob("model-*.safetensors"))[-1]
    gone.unlink()
    code, out = compare(services, capsys, checkpoints["safetensors"], broken)
    assert all(p["status"] == "pass" for p in out["pairs"])  # what is there pairs and passes,
    assert code == 2  # but the shard's weights are missing from the comparison: not a pass
    missing = [p for p in out["problems"] if gone.name in p["reason"] and "index.json" in p["file"]]
    assert missing and not missing[0]["ignored"]
    assert out["unmatched"]["a"] and not out["unmatched"]["b"]
