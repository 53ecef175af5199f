"""Turn what a user hands over (files, archives, folders) into a list of tensor files with their names.

Archives are extracted into a staging folder (nested archives too, up to a depth), a single folder shared by
every member of an archive is dropped from the names, and when a run is made of several archives or folders,
each one's stem leads its names (`rank0/3_query`), so shards of one tensor stay apart. The arrays of a `.npz`
are keys of the file, like the entries of a dict saved with torch.save.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tensor_debugger.archive import ArchiveLimits, Member, archive_kind, archive_stem, extract_archive
from tensor_debugger.errors import FileProblem
from tensor_debugger.names import natural_key
from tensor_debugger.tensor_files import is_tensor_file

MAX_NESTING = 3


@dataclass(frozen=True)
class InputFile:
    path: Path  # where it is on disk
    label: str  # how the user named it: the upload's file name or the path given on the command line


@dataclass(frozen=True)
class TensorFileEntry:
    path: Path
    relpath: PurePosixPath  # the name-giving path inside the run
    label: str  # how errors name it: "ref.tar.gz/dump/3_query.pth"
    staged: bool  # extracted by us, so deleted once read
    keys: tuple[str, ...] = ()  # leading key path (the array's name inside a .npz)


@dataclass
class Expansion:
    entries: list[TensorFileEntry]
    problems: list[FileProblem]


class _Expander:
    def __init__(self, staging: Path, limits: ArchiveLimits) -> None:
        self.staging = staging
        self.limits = limits
        self.problems: list[FileProblem] = []
        self._folders = 0

    def folder(self) -> Path:
        self._folders += 1
        return self.staging / str(self._folders)

    def container(self, path: Path, base: PurePosixPath, label: str, depth: int) -> Iterator[TensorFileEntry]:
        """A folder or a .zip/.tar archive: every file in it, named under `base`."""
        if path.is_dir():
            files = sorted((p for p in path.rglob("*") if p.is_file()), key=lambda p: natural_key(str(p)))
            members = [Member(PurePosixPath(*p.relative_to(path).parts), p) for p in files]
            names = [m.name for m in members]
            staged = False
        else:
            members = extract_archive(path, label, self.folder(), self.limits)
            names = _strip_common_folder([m.name for m in members])
            staged = True
        if not members:
            self.problems.append(FileProblem(label, "is empty: no files in it"))
        for member, name in zip(members, names, strict=True):
            try:
                yield from self.file(member.path, base / name, f"{label}/{member.name}", staged, depth + 1)
            except FileProblem as problem:
                self.problems.append(problem)

    def file(
        self, path: Path, relpath: PurePosixPath, label: str, staged: bool, depth: int
    ) -> Iterator[TensorFileEntry]:
        if path.is_symlink() and depth > 0:
            raise FileProblem(label, "is a symbolic link; skipped")
        kind = archive_kind(path)
        if kind == "npz":
            for member in extract_archive(path, label, self.folder(), self.limits):
                if member.name.suffix != ".npy":
                    self.problems.append(FileProblem(f"{label}/{member.name}", "not a .npy member; skipped"))
                    continue
                key = str(member.name.with_suffix(""))
                yield TensorFileEntry(member.path, relpath, f"{label}/{member.name}", True, (key,))
        elif kind is not None:
            if depth >= MAX_NESTING:
                raise FileProblem(label, f"archives nested more than {MAX_NESTING} deep; skipped")
            yield from self.container(path, relpath.parent / archive_stem(relpath.name), label, depth)
        elif is_tensor_file(path):
            yield TensorFileEntry(path, relpath, label, staged)
        else:
            suffix = path.suffix or "none"
            raise FileProblem(label, f"not a tensor file or archive (unknown extension {suffix!r}); skipped")


def expand_inputs(inputs: list[InputFile], staging: Path, limits: ArchiveLimits) -> Expansion:
    """Every tensor file in `inputs`, in order, and a problem for everything else."""
    expander = _Expander(staging, limits)
    containers = [i.path.is_dir() or archive_kind(i.path) in ("zip", "tar") for i in inputs]
    several = sum(containers) > 1
    entries: list[TensorFileEntry] = []
    for item, is_container in zip(inputs, containers, strict=True):
        try:
            if not item.path.exists():
                raise FileProblem(item.label, "no such file or folder")
            if is_container:
                base = PurePosixPath(archive_stem(Path(item.label).name)) if several else PurePosixPath()
                entries.extend(expander.container(item.path, base, item.label, 0))
            else:
                entries.extend(expander.file(item.path, PurePosixPath(Path(item.label).name), item.label, False, 0))
        except FileProblem as problem:
            expander.problems.append(problem)
    return Expansion(entries, expander.problems)


def _strip_common_folder(names: list[PurePosixPath]) -> list[PurePosixPath]:
    """Drop one leading folder that every member shares ("dump/0_x.pth" -> "0_x.pth")."""
    firsts = {n.parts[0] for n in names}
    if len(firsts) != 1 or any(len(n.parts) == 1 for n in names):
        return names
    return [PurePosixPath(*n.parts[1:]) for n in names]
