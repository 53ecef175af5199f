"""Safe extraction of .zip, .tar(.gz/.bz2/.xz), .tgz and .npz archives into a staging folder.

An archive is refused whole, before anything from it is used, when a member would land outside the folder
(absolute paths, `..`, drive letters), when it holds links or devices, or when it exceeds the limits on member
count and expanded size. Declared sizes are never trusted: bytes are counted as they are written.
"""

from __future__ import annotations

import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from tensor_debugger.errors import FileProblem, UnsafeArchiveError

GiB = 1024**3
_COPY_BUFFER = 4 * 1024 * 1024
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


class _Budget:
    """Counts members and bytes across one archive; raises the moment a limit is passed."""

    def __init__(self, label: str, archive_bytes: int, limits: ArchiveLimits) -> None:
        self.label = label
        self.archive_bytes = max(1, archive_bytes)
        self.limits = limits
        self.members = 0
        self.bytes = 0

    def add_member(self) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise UnsafeArchiveError(
                self.label,
                f"more than {self.limits.max_members} members (limit TENSOR_DEBUGGER_MAX_ARCHIVE_MEMBERS); "
                "the archive was refused",
            )

    def add_bytes(self, n: int) -> None:
        self.bytes += n
        limits = self.limits
        if self.bytes > limits.max_expanded_bytes:
            raise UnsafeArchiveError(
                self.label,
                f"expands past {limits.max_expanded_bytes} bytes (limit TENSOR_DEBUGGER_MAX_EXPANDED_BYTES); "
                "the archive was refused",
            )
        ratio = self.bytes / self.archive_bytes
        if self.bytes > limits.ratio_floor_bytes and ratio > limits.max_expansion_ratio:
            raise UnsafeArchiveError(
                self.label,
                f"expands more than {limits.max_expansion_ratio:g} times its size of {self.archive_bytes} bytes "
                "(limit TENSOR_DEBUGGER_MAX_EXPANSION_RATIO); the archive was refused",
            )


def extract_archive(path: Path, label: str, dest: Path, limits: ArchiveLimits) -> list[Member]:
    """Extract every regular file of the archive at `path` under `dest`. Raises FileProblem."""
    kind = archive_kind(path)
    budget = _Budget(label, path.stat().st_size, limits)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        if kind == "tar":
            return list(_extract_tar(path, label, dest, budget))
        if kind in ("zip", "npz"):
            return list(_extract_zip(path, label, dest, budget))
    except FileProblem:
        raise
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as exc:
        raise FileProblem(label, f"truncated or corrupt archive ({_describe(exc)})") from None
    raise FileProblem(label, "not an archive")


def _extract_tar(path: Path, label: str, dest: Path, budget: _Budget) -> Iterator[Member]:
    with tarfile.open(path, mode="r|*") as tar:  # streaming: one pass, whatever the compression
        for info in tar:
            budget.add_member()
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
            source = tar.extractfile(info)
            if source is None:
                continue
            with source:
                yield Member(name, _write_member(source, dest, name, budget))


def _extract_zip(path: Path, label: str, dest: Path, budget: _Budget) -> Iterator[Member]:
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        if infos and min(i.header_offset for i in infos) != 0:
            # zipfile found a central directory that does not start the file: that of a zip stored *inside*
            # a truncated archive (every .pth file is itself a zip), or data glued in front. Either way: corrupt.
            raise FileProblem(label, "truncated or corrupt archive (its directory does not describe the file)")
        checked: list[tuple[zipfile.ZipInfo, PurePosixPath]] = []
        for info in infos:  # validate the whole central directory before writing anything
            budget.add_member()
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
        for info, name in checked:
            with archive.open(info) as source:
                yield Member(name, _write_member(source, dest, name, budget))


def _write_member(source: IO[bytes], dest: Path, name: PurePosixPath, budget: _Budget) -> Path:
    target = dest.joinpath(*name.parts)
    if not target.resolve().is_relative_to(dest.resolve()):
        raise UnsafeArchiveError(budget.label, f"member {str(name)!r} would escape the archive's folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as out:
        while block := source.read(_COPY_BUFFER):
            budget.add_bytes(len(block))
            out.write(block)
    return target


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]
