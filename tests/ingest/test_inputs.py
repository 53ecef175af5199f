"""Every input kind a user hands over: archives, folders and single files, alone or several per run."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from sqlalchemy import select
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services
from tensor_debugger.store.models import TensorRecord

from tests.support.dumps import make_tar, make_zip, seeded
from tests.support.stored import read_back, same_bits, stored


def dump_folder(folder: Path) -> dict[str, torch.Tensor]:
    """Three layer/stage files in a sub-folder, as a model's hooks write them."""
    tensors = {
        "0_post_ln_pre_attn": seeded((4, 8), 0),
        "0_query": seeded((1, 2, 4, 4), 1),
        "1_post_mlp": seeded((4, 8), 2),
    }
    (folder / "dump").mkdir(parents=True)
    for name, tensor in tensors.items():
        torch.save(tensor, folder / "dump" / f"{name}.pth")
    return tensors


@pytest.mark.parametrize("kind", ["zip", "tar", "tar.gz", "tgz", "folder"])
def test_archives_and_folders(services: Services, tmp_path: Path, kind: str) -> None:
    source = tmp_path / "src"
    tensors = dump_folder(source)
    if kind == "folder":
        path = source / "dump"
    elif kind == "zip":
        path = make_zip(source, tmp_path / "ref.zip")
    else:
        path = make_tar(source, tmp_path / f"ref.{kind}", mode="w" if kind == "tar" else "w:gz")
    result = services.ingestor.ingest("kinds", "ref", [InputFile(path, path.name)])
    assert result.problems == []
    records = stored(services, result.run_id)
    assert sorted(records) == sorted(tensors)  # the shared "dump/" folder is not part of the names
    for name, tensor in tensors.items():
        assert same_bits(read_back(services, records[name]), tensor)
    assert (records["0_query"].layer, records["0_query"].stage) == (0, "query")
    assert records["1_post_mlp"].source_file == f"{path.name}/dump/1_post_mlp.pth" or kind == "folder"


@pytest.mark.parametrize("suffix", [".pth", ".pt", ".bin"])
def test_single_torch_files(services: Services, tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"5_post_attn{suffix}"
    tensor = seeded((3, 5), 9)
    torch.save(tensor, path)
    result = services.ingestor.ingest("single", "ref", [InputFile(path, path.name)])
    record = stored(services, result.run_id)["5_post_attn"]
    assert (record.layer, record.stage) == (5, "post_attn")
    assert same_bits(read_back(services, record), tensor)


def test_legacy_torch_format_loads(services: Services, tmp_path: Path) -> None:
    path = tmp_path / "old.pth"
    tensor = seeded((4, 4), 1)
    torch.save({"w": tensor}, path, _use_new_zipfile_serialization=False)
    result = services.ingestor.ingest("legacy", "ref", [InputFile(path, path.name)])
    assert same_bits(read_back(services, stored(services, result.run_id)["old.w"]), tensor)


def test_safetensors_every_key(services: Services, tmp_path: Path) -> None:
    tensors = {
        "model.layers.0.mlp.weight": seeded((6, 4), 1, torch.bfloat16),
        "model.layers.1.attn.bias": seeded((4,), 2),
        "ids": torch.arange(5, dtype=torch.int32),
        "fp8": seeded((3, 3), 3).to(torch.float8_e4m3fn),
    }
    path = tmp_path / "weights.safetensors"
    save_file(tensors, path)
    result = services.ingestor.ingest("st", "ref", [InputFile(path, path.name)])
    records = stored(services, result.run_id)
    assert sorted(records) == sorted(f"weights.{k}" for k in tensors)
    for key, tensor in tensors.items():
        assert same_bits(read_back(services, records[f"weights.{key}"]), tensor), key
    assert records["weights.model.layers.1.attn.bias"].layer == 1
    assert records["weights.ids"].key_path == ["ids"]


def test_npy_and_npz(services: Services, tmp_path: Path) -> None:
    a = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    fortran = np.asfortranarray(np.arange(24, dtype=np.int16).reshape(4, 6))
    np.save(tmp_path / "2_value.npy", a)
    np.save(tmp_path / "f.npy", fortran)
    np.savez_compressed(tmp_path / "bundle.npz", first=a, second=np.array(3.5))
    inputs = [InputFile(tmp_path / n, n) for n in ("2_value.npy", "f.npy", "bundle.npz")]
    result = services.ingestor.ingest("numpy", "ref", inputs)
    records = stored(services, result.run_id)
    assert sorted(records) == ["2_value", "bundle.first", "bundle.second", "f"]
    assert np.array_equal(read_back(services, records["2_value"]).numpy(), a)
    assert np.array_equal(read_back(services, records["f"]).numpy(), fortran)
    assert read_back(services, records["bundle.second"]).item() == 3.5
    assert records["bundle.first"].digest == records["2_value"].digest


def test_several_archives_form_one_run(services: Services, tmp_path: Path) -> None:
    for rank in range(2):
        folder = tmp_path / f"r{rank}"
        (folder).mkdir()
        torch.save(seeded((2, 4), rank), folder / "0_query.pth")
        make_zip(folder, tmp_path / f"rank{rank}.zip")
    inputs = [InputFile(tmp_path / f"rank{r}.zip", f"rank{r}.zip") for r in range(2)]
    result = services.ingestor.ingest("tp", "ref", inputs)
    assert sorted(stored(services, result.run_id)) == ["rank0/0_query", "rank1/0_query"]


def test_folder_of_archives_and_nested_archive(services: Services, tmp_path: Path) -> None:
    ranks = tmp_path / "tp2"
    ranks.mkdir()
    for rank in range(2):
        folder = tmp_path / f"r{rank}"
        folder.mkdir()
        torch.save(seeded((2, 4), rank), folder / "0_query.pth")
        make_tar(folder, ranks / f"rank{rank}.tar.gz", mode="w:gz")
    outer = make_zip(ranks, tmp_path / "outer.zip")
    for path in (ranks, outer):
        result = services.ingestor.ingest(f"nested {path.name}", "ref", [InputFile(path, path.name)])
        assert sorted(stored(services, result.run_id)) == ["rank0/0_query", "rank1/0_query"]


def test_names_with_spaces_and_non_ascii(services: Services, tmp_path: Path) -> None:
    folder = tmp_path / "src"
    folder.mkdir()
    tensor = seeded((3,), 4)
    torch.save(tensor, folder / "0_post attn ü.pth")
    torch.save(tensor, folder / "Ausgabe ß 日本.pth")
    archive = make_zip(folder, tmp_path / "dump mit Ümlaut.zip")
    result = services.ingestor.ingest("Sitzung ü 日本", "Referenz ä", [InputFile(archive, archive.name)])
    assert result.problems == []
    assert sorted(stored(services, result.run_id)) == ["0_post attn ü", "Ausgabe ß 日本"]
    with zipfile.ZipFile(archive) as z:
        assert len(z.namelist()) == 2


def test_more_than_two_runs_per_session(services: Services, tmp_path: Path) -> None:
    path = tmp_path / "x.pth"
    torch.save(seeded((2,), 1), path)
    for label in ("reference", "bf16", "tp8"):
        services.ingestor.ingest("three", label, [InputFile(path, path.name)])
    with services.sessions() as db:
        rows = db.scalars(select(TensorRecord)).all()
    assert len(rows) == 3
    from tensor_debugger.store import catalog

    with services.sessions() as db:
        session = catalog.list_sessions(db)[0]
        assert [(r.label, r.role, r.position) for r in session.runs] == [
            ("reference", "reference", 0),
            ("bf16", "candidate", 1),
            ("tp8", "candidate", 2),
        ]


def test_a_hub_cache_snapshot_of_symbolic_links_is_read(services: Services, tmp_path: Path) -> None:
    """A Hugging Face hub cache keeps a model's files as blobs named by hash, and each snapshot folder holds
    symbolic links to them under the files' names (sub-folders real). A folder a user names is theirs to read: its
    links were skipped ("no tensors found in any of 2 input files"); now each is read under its link's name. (Links
    inside an archive are still refused: tests/ingest/test_bad_input.py.)"""
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshots" / "abc123"
    blobs.mkdir()
    (snapshot / "sub").mkdir(parents=True)
    weights = {"model.embed.weight": seeded((8, 4), 0), "model.norm.weight": seeded((4,), 1)}
    save_file(weights, blobs / "0a1b2c")
    np.save(blobs / "3d4e5f.npy", seeded((2, 3), 2).numpy())
    (snapshot / "model.safetensors").symlink_to("../../blobs/0a1b2c")
    (snapshot / "sub" / "extra.npy").symlink_to("../../../blobs/3d4e5f.npy")
    result = services.ingestor.ingest("hub", "ref", [InputFile(snapshot, "abc123")])
    assert result.problems == []
    got = stored(services, result.run_id)
    assert sorted(got) == ["model.embed.weight", "model.norm.weight", "sub/extra"]
    assert same_bits(read_back(services, got["model.embed.weight"]), weights["model.embed.weight"])


def test_a_folders_link_to_nothing_or_to_a_folder_is_a_problem_that_names_it(
    services: Services, tmp_path: Path
) -> None:
    """A snapshot whose blob was never downloaded (a link to nothing), or a link to a folder (not followed): both
    passed over in silence before, so a compare of what was left could pass. Now each is a problem of its file: the
    run is incomplete (`compare` exits 2), and the rest is read."""
    folder = tmp_path / "snapshot"
    (tmp_path / "elsewhere").mkdir()
    folder.mkdir()
    np.save(folder / "a.npy", seeded((2, 3), 0).numpy())
    (folder / "b.npy").symlink_to(tmp_path / "missing.npy")
    (folder / "sub").symlink_to(tmp_path / "elsewhere")
    result = services.ingestor.ingest("links", "ref", [InputFile(folder, "snapshot")])
    assert sorted(stored(services, result.run_id)) == ["a"]
    assert sorted((p.file, p.reason) for p in result.problems) == [
        ("snapshot/b.npy", "is a symbolic link to nothing: its tensors were not read"),
        ("snapshot/sub", "is a symbolic link to a folder; not followed: its tensors were not read"),
    ]
