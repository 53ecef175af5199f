"""The members of .zip, .tar(.gz/.bz2/.xz), .tgz and .npz archives: read in place where they can be, else
extracted safely into a staging folder.

A member the caller may read in place (`in_place`: tensor files) whose bytes lie in the archive as they are (a
zip member stored without compression, any member of an uncompressed tar) is not copied: its `span` says where
its bytes are in the archive, and readers read that byte range. A compressed zip member that its reader takes in
order (`streamed`: `.npy` and safetensors files) is read through zipfile's decompressing stream (`packed`), which
yields no more than the member's declared size. Everything else is extracted.

An archive is refused whole, before anything from it is used, when a member would land outside the folder
(absolute paths, `..`, drive letters), when it holds links or devices, or when it exceeds the limits on member
count and expanded size, counted over every archive one ingest unpacks (`ExpansionBudget`). Declared sizes are
never trusted to let anything through, only to refuse early: bytes are counted as they are written, and a member
read in place must lie inside the archive file.
"""

from __future__ import annotations

import shutil
import stat
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
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
class Span:
    """A member's bytes in place: `size` bytes from `offset` of the archive file."""

    offset: int
    size: int


@dataclass(frozen=True)
class Packed:
    """A compressed zip member read through a decompressing stream: its name in the zip, and its size (zipfile
    reads no byte past it)."""

    name: str
    size: int


@dataclass(frozen=True)
class Member:
    """One regular file of an archive: where it sits inside the archive, and where its bytes are: a file of its own
    (extracted), with a `span` the byte range of the archive file at `path`, or `packed` in the zip at `path`."""

    name: PurePosixPath
    path: Path
    span: Span | None = None
    packed: Packed | None = None


def _nowhere(name: PurePosixPath) -> bool:
    return False


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


def extract_archive(
    path: Path,
    label: str,
    dest: Path,
    budget: ExpansionBudget,
    nested: bool,
    in_place: Callable[[PurePosixPath], bool] = _nowhere,
    streamed: Callable[[PurePosixPath], bool] = _nowhere,
) -> list[Member]:
    """Every regular file of the archive at `path`, counted against the ingest's `budget` (`nested`: the archive
    was itself unpacked from one, so its size adds nothing to the ratio's allowance): those `in_place` accepts
    whose bytes lie uncompressed in the archive as spans of it, compressed zip members `streamed` accepts as
    packed members, the others extracted under `dest`. Raises FileProblem."""
    kind = archive_kind(path)
    if not nested:
        budget.add_outer(path.stat().st_size)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        if kind == "tar":
            return list(_extract_tar(path, label, dest, budget, in_place if _plain_tar(path) else _nowhere))
        if kind in ("zip", "npz"):
            return list(_extract_zip(path, label, dest, budget, in_place, streamed))
    except BaseException as exc:
        shutil.rmtree(dest, ignore_errors=True)  # a refused archive leaves nothing in staging
        if is_disk_full(exc):
            raise DiskFullError(f"the members of {label}") from exc
        if isinstance(exc, FileProblem) or not isinstance(exc, _CORRUPT):
            raise
        raise FileProblem(label, f"truncated or corrupt archive ({_describe(exc)})") from None
    raise FileProblem(label, "not an archive")


# the first bytes of the compressed files tarfile opens (gzip, bzip2, xz, and zstd for Python 3.14's)
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd")


def _plain_tar(path: Path) -> bool:
    """Whether the tar at `path` is uncompressed, so that its members' bytes lie in the file as they are."""
    with open(path, "rb") as f:
        head = f.read(6)
    return not head.startswith(_COMPRESSED_MAGIC)


def _in_archive(budget: ExpansionBudget, path: Path, label: str, name: str, span: Span) -> Span:
    """`span`, checked to lie inside the archive file at `path`, and counted like extracted bytes."""
    if span.offset < 0 or span.size < 0 or span.offset + span.size > path.stat().st_size:
        raise FileProblem(label, f"truncated or corrupt archive (member {name!r} reaches past its end)")
    budget.add_bytes(label, span.size)
    return span


def _extract_tar(
    path: Path, label: str, dest: Path, budget: ExpansionBudget, in_place: Callable[[PurePosixPath], bool]
) -> Iterator[Member]:
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
            if in_place(name) and not info.issparse():  # the stream skips its bytes when it moves on
                yield Member(name, path, _in_archive(budget, path, label, info.name, Span(info.offset_data, info.size)))
                continue
            source = tar.extractfile(info)
            if source is None:
                continue
            with source:
                yield Member(name, _write_member(source, label, dest, name, budget))


def _extract_zip(
    path: Path,
    label: str,
    dest: Path,
    budget: ExpansionBudget,
    in_place: Callable[[PurePosixPath], bool],
    streamed: Callable[[PurePosixPath], bool],
) -> Iterator[Member]:
    with zipfile.ZipFile(path) as archive, open(path, "rb") as handle:
        infos = archive.infolist()
        if infos and min(i.header_offset for i in infos) != 0:
            # zipfile found a central directory that does not start the file: that of a zip stored *inside*
            # a truncated archive (every .pth file is itself a zip), or data glued in front. Either way: corrupt.
            raise FileProblem(label, "truncated or corrupt archive (its directory does not describe the file)")
        checked: list[tuple[zipfile.ZipInfo, PurePosixPath]] = []
        for info in infos:  # validate the whole central directory before writing anything
            budget.add_member(label)
            # the name as the central directory holds it: zipfile's `filename` is cut at a NUL byte, which could
            # hide the rest ("w.npy\0../../x") from this check and from whoever unpacks the archive next
            name = parse_member_name(info.orig_filename, label)
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
            if in_place(name) and _stored(info):
                span = Span(zip_data_offset(handle, info, label), info.file_size)
                yield Member(name, path, _in_archive(budget, path, label, info.filename, span))
                continue
            if streamed(name) and info.compress_type in _STREAMED and not info.flag_bits & 0x1:
                budget.add_bytes(label, info.file_size)  # what zipfile's stream yields at most
                yield Member(name, path, packed=Packed(info.filename, info.file_size))
                continue
            with archive.open(info) as source:
                yield Member(name, _write_member(source, label, dest, name, budget))


_STREAMED = (zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # a zip member's local file header (30 bytes)


def _stored(info: zipfile.ZipInfo) -> bool:
    """Whether the member's bytes lie in the archive as they are: stored, not encrypted, its sizes agreeing."""
    plain = info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 0x1
    return plain and info.compress_size == info.file_size


def zip_data_offset(handle: IO[bytes], info: zipfile.ZipInfo, label: str) -> int:
    """Where a stored member's bytes begin in the zip file open as `handle`: after its local header, whose name and
    extra field lengths may differ from the central directory's. Raises FileProblem."""
    handle.seek(info.header_offset)
    header = handle.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
        raise FileProblem(label, f"truncated or corrupt archive (member {info.filename!r} has no local header)")
    fields = _LOCAL_HEADER.unpack(header)
    return int(info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10])


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
