"""Safe extraction of .zip, .tar(.gz/.bz2/.xz), .tgz and .npz archives into a staging folder.

An archive is refused whole, before anything from it is used, when a member would land outside the folder
(absolute paths, `..`, drive letters), when it holds links or devices, or when it exceeds the limits on member
count and expanded size, counted over every archive one ingest unpacks (`ExpansionBudget`). Declared sizes are
never trusted to let anything through, only to refuse early: bytes are counted as they are written.
"""

from __future__ import annotations

import shutil
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from tensor_debugger.errors import DiskFullError, FileProblem, UnsafeArchiveError, is_disk_full

GiB = 1024**3
_COPY_BUFFER = 4 * 1024 * 1024
_CORRUPT = (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError)
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


@dataclass(frozen=True)
class ArchiveLimits:
    max_members: int
    max_expanded_bytes: int
    max_expansion_ratio: float  # applies once an archive has expanded past `ratio_floor_bytes`
    ratio_floor_bytes: int


@dataclass(frozen=True)
class Member:
    """One extracted regular file: where it sits inside the archive, and where it was written."""

    name: PurePosixPath
    path: Path


def archive_kind(path: Path) -> str | None:
    """ "zip", "tar" or "npz" from the file name, or None for anything else."""
    lower = path.name.lower()
    if lower.endswith(".zip"):
        return "zip"
    if lower.endswith(".npz"):
        return "npz"
    if lower.endswith(_TAR_SUFFIXES):
        return "tar"
    return None


def archive_stem(name: str) -> str:
    """The name without its archive suffix: "rank0.tar.gz" -> "rank0"."""
    lower = name.lower()
    for suffix in (*_TAR_SUFFIXES, ".zip", ".npz"):
        if lower.endswith(suffix):
            return name[: -len(suffix)]
    return name


def parse_member_name(raw: str, label: str) -> PurePosixPath | None:
    """The member's safe relative path; None for the archive's root entry. Raises UnsafeArchiveError."""
    if "\x00" in raw:
        raise UnsafeArchiveError(label, f"member {raw!r} has a NUL byte in its name; the archive was refused")
    text = raw.replace("\\", "/")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if text.startswith("/") or (len(text) > 1 and text[1] == ":"):
        raise UnsafeArchiveError(label, f"member {raw!r} has an absolute path; the archive was refused")
    if ".." in parts:
        raise UnsafeArchiveError(label, f"member {raw!r} would escape the archive's folder; the archive was refused")
    return PurePosixPath(*parts) if parts else None


class ExpansionBudget:
    """One budget for everything one ingest unpacks (an upload, a CLI run): members and expanded bytes are counted
    across every archive at every nesting level, and the expansion ratio is taken against the size of the
    outermost archives only, so a zip of zips gets no fresh allowance per inner archive. Raises the moment a
    limit is passed, and before writing a member whose declared size alone would pass one."""

    def __init__(self, limits: ArchiveLimits) -> None:
        self.limits = limits
        self.members = 0
        self.bytes = 0
        self.outer_bytes = 0  # the size of the outermost archives: what the ratio is taken against

    def add_outer(self, archive_bytes: int) -> None:
        self.outer_bytes += archive_bytes

    def add_member(self, label: str) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise UnsafeArchiveError(
                label,
                f"more than {self.limits.max_members} members, counted over every archive of the run (limit "
                "TENSOR_DEBUGGER_MAX_ARCHIVE_MEMBERS); the archive was refused",
            )

    def check_declared(self, label: str, n: int) -> None:
        """Refuse, before writing anything, members whose declared sizes alone would pass a limit (zip and tar
        readers never return more than a member declares, so a lie only makes the archive corrupt)."""
        self._check(label, self.bytes + n)

    def add_bytes(self, label: str, n: int) -> None:
        self.bytes += n
        self._check(label, self.bytes)

    def _check(self, label: str, total: int) -> None:
        limits = self.limits
        if total > limits.max_expanded_bytes:
            raise UnsafeArchiveError(
                label,
                f"expands past {limits.max_expanded_bytes} bytes, counted over every archive of the run (limit "
                "TENSOR_DEBUGGER_MAX_EXPANDED_BYTES); the archive was refused",
            )
        outer = max(1, self.outer_bytes)
        if total > limits.ratio_floor_bytes and total / outer > limits.max_expansion_ratio:
            raise UnsafeArchiveError(
                label,
                f"expands more than {limits.max_expansion_ratio:g} times the {outer} bytes of the run's outermost "
                "archives, counted over every archive in them (limit TENSOR_DEBUGGER_MAX_EXPANSION_RATIO); "
                "the archive was refused",
            )


def extract_archive(path: Path, label: str, dest: Path, budget: ExpansionBudget, nested: bool) -> list[Member]:
    """Extract every regular file of the archive at `path` under `dest`, counted against the ingest's `budget`
    (`nested`: the archive was itself unpacked from one, so its size adds nothing to the ratio's allowance).
    Raises FileProblem."""
    kind = archive_kind(path)
    if not nested:
        budget.add_outer(path.stat().st_size)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        if kind == "tar":
            return list(_extract_tar(path, label, dest, budget))
        if kind in ("zip", "npz"):
            return list(_extract_zip(path, label, dest, budget))
    except BaseException as exc:
        shutil.rmtree(dest, ignore_errors=True)  # a refused archive leaves nothing in staging
        if is_disk_full(exc):
            raise DiskFullError(f"the members of {label}") from exc
        if isinstance(exc, FileProblem) or not isinstance(exc, _CORRUPT):
            raise
        raise FileProblem(label, f"truncated or corrupt archive ({_describe(exc)})") from None
    raise FileProblem(label, "not an archive")


def _extract_tar(path: Path, label: str, dest: Path, budget: ExpansionBudget) -> Iterator[Member]:
    with tarfile.open(path, mode="r|*") as tar:  # streaming: one pass, whatever the compression
        for info in tar:
            budget.add_member(label)
            name = parse_member_name(info.name, label)
            if info.issym() or info.islnk():
                raise UnsafeArchiveError(
                    label,
                    f"member {info.name!r} is a {'symbolic' if info.issym() else 'hard'} link "
                    f"(to {info.linkname!r}); links are not allowed and the archive was refused",
                )
            if info.isdir() or name is None:
                continue
            if not info.isfile():
                raise UnsafeArchiveError(label, f"member {info.name!r} is a device or FIFO; the archive was refused")
            budget.check_declared(label, info.size)
            source = tar.extractfile(info)
            if source is None:
                continue
            with source:
                yield Member(name, _write_member(source, label, dest, name, budget))


def _extract_zip(path: Path, label: str, dest: Path, budget: ExpansionBudget) -> Iterator[Member]:
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        if infos and min(i.header_offset for i in infos) != 0:
            # zipfile found a central directory that does not start the file: that of a zip stored *inside*
            # a truncated archive (every .pth file is itself a zip), or data glued in front. Either way: corrupt.
            raise FileProblem(label, "truncated or corrupt archive (its directory does not describe the file)")
        checked: list[tuple[zipfile.ZipInfo, PurePosixPath]] = []
        for info in infos:  # validate the whole central directory before writing anything
            budget.add_member(label)
            name = parse_member_name(info.filename, label)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise UnsafeArchiveError(
                    label,
                    f"member {info.filename!r} is a symbolic link; links are not allowed and the archive was refused",
                )
            if info.is_dir() or name is None:
                continue
            checked.append((info, name))
        budget.check_declared(label, sum(info.file_size for info, _ in checked))
        for info, name in checked:
            with archive.open(info) as source:
                yield Member(name, _write_member(source, label, dest, name, budget))


def _write_member(source: IO[bytes], label: str, dest: Path, name: PurePosixPath, budget: ExpansionBudget) -> Path:
    target = dest.joinpath(*name.parts)
    if not target.resolve().is_relative_to(dest.resolve()):
        raise UnsafeArchiveError(label, f"member {str(name)!r} would escape the archive's folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as out:
        while block := source.read(_COPY_BUFFER):
            budget.add_bytes(label, len(block))
            out.write(block)
    return target


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]
