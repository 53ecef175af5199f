"""Tensor files inside archives read without staged copies where they can be: stored zip members, members of a
plain tar and the arrays of an `np.savez` file are read as byte ranges of the archive; compressed `.npy` and
safetensors zip members through a decompressing stream; the rest (a compressed `.pth`, members of a tar.gz) is
extracted. Every way, each tensor is stored bit for bit as from a folder, and the user's archive is left as it
was."""

from __future__ import annotations

import hashlib
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tensor_debugger.errors import FileProblem
from tensor_debugger.ingest.archives import ArchiveLimits, ExpansionBudget, extract_archive
from tensor_debugger.ingest.inputs import InputFile, TensorFileEntry, expand_inputs
from tensor_debugger.ingest.tensor_files import open_tensor_file
from tensor_debugger.services import Services

from tests.support.dumps import seeded
from tests.support.stored import read_back, same_bits, stored

LIMITS = ArchiveLimits(1000, 1 << 30, 1000.0, 1 << 20)


def dump(folder: Path) -> dict[str, torch.Tensor]:
    """One file of each format, a .pth holding a dict with a strided view, a .pth in torch's legacy format, and a
    Fortran-ordered .npy. Returns every tensor by the name ingest gives it."""
    folder.mkdir(parents=True)
    base = seeded((6, 10), 1)
    torch.save({"weight": base, "view": base.t()[2:5]}, folder / "0_query.pth")
    torch.save(seeded((3, 4), 2), folder / "1_legacy.pth", _use_new_zipfile_serialization=False)
    save_file({"b": seeded((5,), 3, torch.bfloat16), "a": seeded((2, 3), 4)}, folder / "2_value.safetensors")
    np.save(folder / "3_key.npy", seeded((4, 7), 5).numpy())
    np.save(folder / "4_post_mlp.npy", np.asfortranarray(seeded((5, 3), 6).numpy()))
    return {
        "0_query.weight": base,
        "0_query.view": base.t()[2:5].contiguous(),
        "1_legacy": seeded((3, 4), 2),
        "2_value.a": seeded((2, 3), 4),
        "2_value.b": seeded((5,), 3, torch.bfloat16),
        "3_key": seeded((4, 7), 5),
        "4_post_mlp": seeded((5, 3), 6),
    }


def zipped(folder: Path, target: Path, compression: int) -> Path:
    with zipfile.ZipFile(target, "w", compression) as archive:
        archive.writestr("dump/README.txt", "not a tensor")  # ahead of the tensors: their offsets are not 0
        for path in sorted(folder.iterdir()):
            archive.write(path, f"dump/{path.name}")
    return target


def tarred(folder: Path, target: Path, mode: str) -> Path:
    with tarfile.open(target, mode) as archive:  # type: ignore[call-overload]
        for path in sorted(folder.iterdir()):
            archive.add(path, f"dump/{path.name}")
    return target


def how_read(entry: TensorFileEntry) -> str:
    if entry.span is not None:
        return "in place"
    return "streamed" if entry.packed is not None else "extracted"


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("stored.zip", {".pth": "in place", ".npy": "in place", ".safetensors": "in place"}),
        ("deflated.zip", {".pth": "extracted", ".npy": "streamed", ".safetensors": "streamed"}),
        ("plain.tar", {".pth": "in place", ".npy": "in place", ".safetensors": "in place"}),
        ("packed.tar.gz", {".pth": "extracted", ".npy": "extracted", ".safetensors": "extracted"}),
    ],
)
def test_archive_members_read_in_place_streamed_or_extracted(
    services: Services, tmp_path: Path, kind: str, expected: dict[str, str]
) -> None:
    tensors = dump(tmp_path / "src")
    target = tmp_path / kind
    if kind.endswith(".zip"):
        zipped(tmp_path / "src", target, zipfile.ZIP_STORED if kind == "stored.zip" else zipfile.ZIP_DEFLATED)
    else:
        tarred(tmp_path / "src", target, "w" if kind == "plain.tar" else "w:gz")
    before = hashlib.sha256(target.read_bytes()).hexdigest()

    expansion = expand_inputs([InputFile(target, kind)], tmp_path / "staging", LIMITS)
    assert len(expansion.entries) == 5
    for entry in expansion.entries:
        assert how_read(entry) == expected[entry.relpath.suffix], entry.label
        assert entry.staged == (how_read(entry) == "extracted")
        assert entry.path.is_relative_to(tmp_path / "staging") == entry.staged
    staged = [p for p in (tmp_path / "staging").rglob("*") if p.is_file() and p.suffix != ".txt"]
    assert len(staged) == sum(how_read(e) == "extracted" for e in expansion.entries)  # no copy of the others

    result = services.ingestor.ingest("in-place", kind, [InputFile(target, kind)])
    records = stored(services, result.run_id)
    assert sorted(records) == sorted(tensors), result.problems
    for name, tensor in tensors.items():
        assert same_bits(read_back(services, records[name]), tensor), name
    assert hashlib.sha256(target.read_bytes()).hexdigest() == before  # the archive is left alone
    folder = services.ingestor.ingest("in-place-folder", kind, [InputFile(tmp_path / "src", "src")])
    assert {n: r.digest for n, r in stored(services, folder.run_id).items()} == {
        n: r.digest for n, r in records.items()
    }


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_arrays(services: Services, tmp_path: Path, compressed: bool) -> None:
    arrays = {"x": seeded((3, 8), 7).numpy(), "y": np.arange(12, dtype=np.int16).reshape(3, 4)}
    path = tmp_path / "3_acts.npz"
    save = np.savez_compressed if compressed else np.savez
    save(path, x=arrays["x"], y=arrays["y"])
    expansion = expand_inputs([InputFile(path, path.name)], tmp_path / "staging", LIMITS)
    assert [how_read(e) for e in expansion.entries] == ["streamed" if compressed else "in place"] * 2
    result = services.ingestor.ingest("npz", f"run-{compressed}", [InputFile(path, path.name)])
    records = stored(services, result.run_id)
    for key, values in arrays.items():
        assert np.array_equal(read_back(services, records[f"3_acts.{key}"]).numpy(), values)


def test_a_pth_stored_in_a_zip_is_read_without_torch_by_offset(tmp_path: Path) -> None:
    """The .pth (itself a zip) inside the outer zip: its storages read at their offsets in the outer file."""
    torch.save({"w": seeded((64, 32), 8)}, tmp_path / "inner.pth")
    outer = tmp_path / "outer.zip"
    with zipfile.ZipFile(outer, "w") as archive:
        archive.writestr("padding.bin", b"\0" * 1000)
        archive.write(tmp_path / "inner.pth", "inner.pth")
    (member,) = [
        m
        for m in extract_archive(
            outer, "outer.zip", tmp_path / "x", ExpansionBudget(LIMITS), False, lambda n: n.suffix == ".pth"
        )
        if m.span is not None
    ]
    with open_tensor_file(member.path, "outer.zip/inner.pth", span=member.span) as opened:
        (leaf,) = opened.leaves
        values = leaf.reader.read((slice(0, 64), slice(0, 32)))
        assert np.array_equal(values, seeded((64, 32), 8).numpy())


def test_a_tar_cut_short_inside_a_member_is_refused(tmp_path: Path) -> None:
    dump(tmp_path / "src")
    target = tarred(tmp_path / "src", tmp_path / "cut.tar", "w")
    target.write_bytes(target.read_bytes()[:3000])  # inside the first member's data
    with pytest.raises(FileProblem, match="truncated or corrupt archive"):
        extract_archive(target, "cut.tar", tmp_path / "x", ExpansionBudget(LIMITS), False, lambda n: True)


def test_a_bad_safetensors_member_names_the_member(tmp_path: Path) -> None:
    """safetensors' own checks, made on the byte range: data offsets that overlap are refused."""
    save_file({"a": seeded((4,), 1), "b": seeded((4,), 2)}, tmp_path / "ok.safetensors")
    raw = bytearray((tmp_path / "ok.safetensors").read_bytes())
    text = raw.decode("latin1")
    raw[:] = text.replace('"data_offsets":[16,32]', '"data_offsets":[0,16]').encode("latin1")
    target = tmp_path / "bad.zip"
    with zipfile.ZipFile(target, "w") as archive:
        archive.writestr("0_query.safetensors", bytes(raw))
    (member,) = extract_archive(target, "bad.zip", tmp_path / "x", ExpansionBudget(LIMITS), False, lambda n: True)
    assert member.span is not None
    with pytest.raises(FileProblem, match=r"bad.zip/0_query.safetensors: not a readable safetensors file"):
        open_tensor_file(member.path, "bad.zip/0_query.safetensors", span=member.span)


def test_a_corrupt_compressed_member_is_a_problem_naming_it(services: Services, tmp_path: Path) -> None:
    """A deflated .npy whose data is damaged: zipfile's stream fails while the tensor is read; the ingest reports
    the file and keeps the others."""
    target = tmp_path / "run.zip"
    big = np.arange(400_000, dtype=np.float32)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("0_query.npy", "w") as out:
            np.save(out, big)
        with archive.open("1_query.npy", "w") as out:
            np.save(out, big + 1)
    with zipfile.ZipFile(target) as archive:
        info = archive.getinfo("0_query.npy")
    raw = bytearray(target.read_bytes())
    middle = info.header_offset + 30 + len(info.filename) + info.compress_size // 2
    raw[middle : middle + 64] = bytes(64)
    target.write_bytes(bytes(raw))
    result = services.ingestor.ingest("corrupt", "run", [InputFile(target, "run.zip")])
    assert sorted(stored(services, result.run_id)) == ["1_query"]
    (problem,) = result.problems
    assert problem.file == "run.zip/0_query.npy" and "could not be read" in problem.reason
