"""Bad input ends in a clear per-file message; nothing is written outside the data directory; nothing
half-ingested is visible."""

from __future__ import annotations

import io
import os
import pickle
import random
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch
from sqlalchemy import func, select
from tensor_debugger.errors import NothingUsableError
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.runs import Ingestor
from tensor_debugger.services import Services
from tensor_debugger.store.models import RunRecord, SessionRecord

from tests.support.bombs import zeros_zip
from tests.support.dumps import make_zip, seeded, tar_with


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def assert_nothing_kept(services: Services) -> None:
    with services.sessions() as db:
        assert db.scalar(select(func.count()).select_from(SessionRecord)) == 0
        assert db.scalar(select(func.count()).select_from(RunRecord)) == 0
    assert [c for c in services.store.children("runs") if c.isdigit()] == []
    staging = services.settings.staging_dir
    assert not staging.exists() or list(staging.iterdir()) == []


def refused(services: Services, path: Path) -> list[tuple[str, str]]:
    with pytest.raises(NothingUsableError) as info:
        services.ingestor.ingest("bad", "ref", [InputFile(path, path.name)])
    assert_nothing_kept(services)
    return [(p.file, p.reason) for p in info.value.problems]


def good_pth(tmp_path: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save(seeded((2, 2), 0), buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("member", ["../escape.pth", "a/../../escape.pth", "/abs/escape.pth", "C:/escape.pth"])
def test_zip_members_escaping_their_folder(services: Services, tmp_path: Path, member: str) -> None:
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("ok.pth", good_pth(tmp_path))
        z.writestr(member, good_pth(tmp_path))
    before = tree(tmp_path)
    problems = refused(services, archive)
    assert problems[0][0] == "evil.zip"
    assert "absolute path" in problems[0][1] or "escape the archive" in problems[0][1]
    assert tree(tmp_path) - before <= {p for p in tree(tmp_path) if p.startswith("data")}
    assert not (tmp_path / "escape.pth").exists() and not Path("/abs/escape.pth").exists()


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "traversal", "absolute"])
def test_tar_links_and_paths(services: Services, tmp_path: Path, kind: str) -> None:
    info = tarfile.TarInfo("0_query.pth")
    if kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    elif kind == "hardlink":
        info.type, info.linkname = tarfile.LNKTYPE, "../../outside"
    elif kind == "traversal":
        info.name = "../../outside.pth"
    else:
        info.name = "/tmp/outside.pth"
    archive = tar_with(tmp_path / "evil.tar.gz", [info], good_pth(tmp_path))
    problems = refused(services, archive)
    expected = {
        "symlink": "symbolic link",
        "hardlink": "hard link",
        "traversal": "escape the archive",
        "absolute": "absolute path",
    }[kind]
    assert problems[0][0] == "evil.tar.gz" and expected in problems[0][1]
    assert not (tmp_path.parent / "outside.pth").exists()


def test_zip_symlink_member(services: Services, tmp_path: Path) -> None:
    archive = tmp_path / "link.zip"
    with zipfile.ZipFile(archive, "w") as z:
        info = zipfile.ZipInfo("0_query.pth")
        info.external_attr = 0o120777 << 16
        z.writestr(info, "/etc/passwd")
    assert "symbolic link" in refused(services, archive)[0][1]


def test_archive_that_expands_far_beyond_its_size(services: Services, tmp_path: Path) -> None:
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("zeros.pth", b"\0" * (8 * 1024 * 1024))
    # a small floor, so the test need not write a gigabyte
    tight = services.settings.with_overrides(max_expansion_ratio=10.0, expansion_floor_bytes=1024 * 1024)
    ingestor = Ingestor(tight, services.sessions, services.store)
    with pytest.raises(NothingUsableError) as info:
        ingestor.ingest("bomb", "ref", [InputFile(archive, archive.name)])
    problem = info.value.problems[0]
    assert problem.file == "bomb.zip" and "expands more than 10 times" in problem.reason
    assert_nothing_kept(services)


def test_nested_archives_share_one_budget(services: Services, tmp_path: Path) -> None:
    """Three inner zips each under the floor on its own: counted together they pass it, and the ratio is taken
    against the outer archive's size; the second inner zip is refused before any of it is written."""
    archive = tmp_path / "nest.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for i in range(3):
            z.writestr(f"inner{i}.zip", zeros_zip("zeros.pth", 1))
    tight = services.settings.with_overrides(max_expansion_ratio=10.0, expansion_floor_bytes=1536 * 1024)
    with pytest.raises(NothingUsableError) as info:
        Ingestor(tight, services.sessions, services.store).ingest("nest", "ref", [InputFile(archive, archive.name)])
    refusals = [(p.file, p.reason) for p in info.value.problems if "TENSOR_DEBUGGER_MAX_EXPANSION_RATIO" in p.reason]
    assert [f for f, _ in refusals] == ["nest.zip/inner1.zip", "nest.zip/inner2.zip"]
    assert f"times the {archive.stat().st_size} bytes of the run's outermost archives" in refusals[0][1]
    assert_nothing_kept(services)


def test_members_are_counted_over_every_nesting_level(services: Services, tmp_path: Path) -> None:
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        for i in range(60):
            z.writestr(f"f{i}.txt", b"")
    archive = tmp_path / "many.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for i in range(3):
            z.writestr(f"inner{i}.zip", inner.getvalue())
    tight = services.settings.with_overrides(max_archive_members=100)
    with pytest.raises(NothingUsableError) as info:
        Ingestor(tight, services.sessions, services.store).ingest("many", "ref", [InputFile(archive, archive.name)])
    refusals = [p.file for p in info.value.problems if "more than 100 members" in p.reason]
    assert refusals == ["many.zip/inner1.zip", "many.zip/inner2.zip"]
    assert_nothing_kept(services)


def test_archive_over_the_expanded_byte_limit(services: Services, tmp_path: Path) -> None:
    archive = tmp_path / "big.tar"
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "a.pth").write_bytes(b"\1" * 300_000)
    with tarfile.open(archive, "w") as t:
        t.add(folder / "a.pth", "a.pth")
    ingestor = Ingestor(services.settings.with_overrides(max_expanded_bytes=100_000), services.sessions, services.store)
    with pytest.raises(NothingUsableError) as info:
        ingestor.ingest("big", "ref", [InputFile(archive, archive.name)])
    assert "expands past 100000 bytes" in info.value.problems[0].reason
    assert_nothing_kept(services)


def test_archive_with_thousands_of_members(services: Services, tmp_path: Path) -> None:
    archive = tmp_path / "many.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for i in range(3000):
            z.writestr(f"f{i}.txt", b"")
    ingestor = Ingestor(services.settings.with_overrides(max_archive_members=2000), services.sessions, services.store)
    with pytest.raises(NothingUsableError) as info:
        ingestor.ingest("many", "ref", [InputFile(archive, archive.name)])
    assert info.value.problems[0].file == "many.zip"
    assert "more than 2000 members" in info.value.problems[0].reason
    assert_nothing_kept(services)


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_truncated_archives(services: Services, tmp_path: Path, kind: str) -> None:
    folder = tmp_path / "src"
    folder.mkdir()
    for i in range(3):
        torch.save(seeded((64, 64), i), folder / f"{i}_query.pth")
    if kind == "zip":
        full = make_zip(folder, tmp_path / "full.zip").read_bytes()
    else:
        from tests.support.dumps import make_tar

        full = make_tar(folder, tmp_path / "full.tar.gz", mode="w:gz").read_bytes()
    cut = tmp_path / f"cut.{kind}"
    cut.write_bytes(full[: len(full) * 2 // 3])
    problems = refused(services, cut)
    assert problems[0][0] == f"cut.{kind}"
    assert "truncated or corrupt archive" in problems[0][1]


def test_corrupt_and_non_tensor_files(services: Services, tmp_path: Path) -> None:
    (tmp_path / "garbage.pth").write_bytes(random.Random(0).randbytes(1000))  # seeded: same bytes every run
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "broken.safetensors").write_bytes(b"\x10\0\0\0\0\0\0\0{not json")
    import numpy as np

    np.save(tmp_path / "full.npy", np.zeros(100, dtype=np.float32))
    (tmp_path / "short.npy").write_bytes((tmp_path / "full.npy").read_bytes()[:-40])
    torch.save({"text": "just a string"}, tmp_path / "strings.pth")
    (tmp_path / "text.pth").write_text("weights: see the wiki")
    names = ["garbage.pth", "notes.txt", "broken.safetensors", "short.npy", "strings.pth", "text.pth"]
    with pytest.raises(NothingUsableError) as info:
        services.ingestor.ingest("bad", "ref", [InputFile(tmp_path / n, n) for n in names])
    reasons = {p.file: p.reason for p in info.value.problems}
    assert "not a readable PyTorch file" in reasons["garbage.pth"]
    assert reasons["text.pth"].startswith(
        "not a readable PyTorch file: neither a zip archive (torch.save's format) nor a pickle: it starts with b'weig'"
    )
    assert "not a tensor file or archive" in reasons["notes.txt"]
    assert "not a readable safetensors file" in reasons["broken.safetensors"]
    assert "truncated" in reasons["short.npy"]
    assert "not a tensor (str)" in reasons["strings.pth[text]"]
    assert_nothing_kept(services)


class _RunsCode:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_pickle_that_tries_to_run_code_is_refused_never_executed(services: Services, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "0_query.pth"
    torch.save({"x": seeded((2,), 0), "evil": _RunsCode(str(marker))}, path)
    raw = tmp_path / "raw.pth"
    raw.write_bytes(pickle.dumps(_RunsCode(str(marker))))
    npy = tmp_path / "objects.npy"
    import numpy as np

    np.save(npy, np.array([_RunsCode(str(marker))], dtype=object), allow_pickle=True)
    with pytest.raises(NothingUsableError) as info:
        services.ingestor.ingest("evil", "ref", [InputFile(p, p.name) for p in (path, raw, npy)])
    reasons = {p.file: p.reason for p in info.value.problems}
    assert "refused: the pickle asks to run code (posix.system)" in reasons["0_query.pth"]
    assert "nothing in it was executed" in reasons["0_query.pth"]
    assert "nothing in it was executed" in reasons["raw.pth"]
    assert "never unpickled" in reasons["objects.npy"]
    assert not marker.exists()
    assert_nothing_kept(services)


def test_archive_without_tensors(services: Services, tmp_path: Path) -> None:
    empty = tmp_path / "empty.zip"
    zipfile.ZipFile(empty, "w").close()
    assert refused(services, empty) == [("empty.zip", "is empty: no files in it")]
    junk = tmp_path / "junk.tar.gz"
    tar_with(junk, [tarfile.TarInfo("README.md")], b"# not tensors")
    problems = refused(services, junk)
    assert problems == [("junk.tar.gz/README.md", "not a tensor file or archive (unknown extension '.md'); skipped")]


def test_problems_are_kept_beside_a_stored_run(services: Services, tmp_path: Path) -> None:
    archive = tmp_path / "mixed.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("0_query.pth", good_pth(tmp_path))
        z.writestr("1_query.pth", b"not a pickle at all")
    result = services.ingestor.ingest("mixed", "ref", [InputFile(archive, archive.name)])
    assert result.tensors == 1
    assert [(p.file, p.reason.split(": ")[0]) for p in result.problems] == [
        ("mixed.zip/1_query.pth", "not a readable PyTorch file")
    ]
    with services.sessions() as db:
        run = db.scalar(select(RunRecord))
        assert run is not None and run.status == "ready"
        assert [(p.file, p.reason) for p in run.problems] == [(p.file, p.reason) for p in result.problems]
