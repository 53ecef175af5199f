"""Turn what a user hands over (files, archives, folders) into a list of tensor files with their names.

Tensor files stored uncompressed in an archive (zip members stored as they are, members of a plain tar, the arrays
of a `.npz` written by `np.savez`) are read in place, as byte ranges of the archive; compressed `.npy` and
safetensors members of a zip (`np.savez_compressed`) are read through a decompressing stream; the rest of an archive is
extracted into a staging folder (nested archives too, up to a depth), a single folder shared by
every member of an archive is dropped from the names, and when a run is made of several archives or folders,
each one's stem leads its names (`rank0/3_query`), so shards of one tensor stay apart. The arrays of a `.npz`
are keys of the file, like the entries of a dict saved with torch.save. A folder holding a Hugging Face debugger
trace (`*_debug_tree_FULL_TENSORS.json`) gives its tensors in call order, each with its module path and place.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tensor_debugger.engine.names import natural_key
from tensor_debugger.errors import FileProblem, NotATensor, TensorDebuggerError, is_disk_full, unexpected_problem
from tensor_debugger.ingest.archives import (
    ArchiveLimits,
    ExpansionBudget,
    Member,
    Packed,
    Span,
    archive_kind,
    archive_stem,
    extract_archive,
)
from tensor_debugger.ingest.checkpoints import check_index, is_checkpoint_index
from tensor_debugger.ingest.tensor_files import is_tensor_file
from tensor_debugger.ingest.traces import Trace, TraceTensor, choose_trace_json, is_trace_json, read_trace

MAX_NESTING = 3


@dataclass(frozen=True)
class InputFile:
    path: Path  # where it is on disk
    label: str  # how the user named it: the upload's file name or the path given on the command line


@dataclass(frozen=True)
class TensorFileEntry:
    path: Path  # with a `span`, the archive that holds the file
    relpath: PurePosixPath  # the name-giving path inside the run
    label: str  # how errors name it: "ref.tar.gz/dump/3_query.pth"
    staged: bool  # extracted by us, so deleted once read
    keys: tuple[str, ...] = ()  # leading key path (the array's name inside a .npz)
    module_path: str | None = None  # from a module trace: the module whose input or output this is
    place: str | None = None  # from a module trace: "inputs_args_0", "outputs", ...
    source: str | None = None  # a captured op's caller, or the caller of a captured module it is an input of
    parameter: str | None = None  # a captured module input: the parameter of the module's `forward` it binds to
    span: Span | None = None  # read in place: the file's bytes in the archive at `path`
    packed: Packed | None = None  # read through a decompressing stream: a compressed member of the zip at `path`

    @property
    def nbytes(self) -> int:
        if self.span is not None:
            return self.span.size
        if self.packed is not None:
            return self.packed.size
        return self.path.stat().st_size


@dataclass(frozen=True)
class RunTrace:
    """A module trace found among the inputs; `prefix` leads its tensors' names ("" or "rank0/")."""

    prefix: str
    label: str
    trace: Trace

    def summary_name(self, tensor: TraceTensor) -> str:
        return self.prefix + tensor.name


@dataclass
class Expansion:
    entries: list[TensorFileEntry]
    problems: list[FileProblem]
    traces: list[RunTrace]


class _Expander:
    def __init__(self, staging: Path, limits: ArchiveLimits) -> None:
        self.staging = staging
        self.budget = ExpansionBudget(limits)  # one for every archive of the run, however deeply nested
        self.problems: list[FileProblem] = []
        self.traces: list[RunTrace] = []
        self._folders = 0

    def folder(self) -> Path:
        self._folders += 1
        return self.staging / str(self._folders)

    def container(
        self, path: Path, base: PurePosixPath, label: str, depth: int, nested: bool = False
    ) -> Iterator[TensorFileEntry]:
        """A folder or a .zip/.tar archive (`nested`: itself unpacked from an archive): every file in it, named
        under `base`."""
        if path.is_dir():
            found = list(path.rglob("*"))
            for link in (p for p in found if p.is_symlink() and not p.is_file()):  # a file's link is read
                relative = PurePosixPath(*link.relative_to(path).parts)
                why = "a symbolic link to a folder; not followed" if link.is_dir() else "a symbolic link to nothing"
                self.problems.append(FileProblem(f"{label}/{relative}", f"is {why}: its tensors were not read"))
            files = sorted((p for p in found if p.is_file()), key=lambda p: natural_key(str(p)))
            members = [Member(PurePosixPath(*p.relative_to(path).parts), p) for p in files]
            names = [m.name for m in members]
            staged = False
        else:
            members = extract_archive(path, label, self.folder(), self.budget, nested, _readable_in_place, _streamed)
            names = _strip_common_folder([m.name for m in members])
            staged = True
        if not members:
            self.problems.append(FileProblem(label, "is empty: no files in it"))
        members, names = yield from self.traced(members, names, base, label, staged)
        members, names = self.indexes(members, names, label)
        for member, name in zip(members, names, strict=True):
            try:
                yield from self.file(member.path, base / name, f"{label}/{member.name}", staged, depth + 1, member)
            except FileProblem as problem:
                self.problems.append(problem)
            except Exception as exc:
                if not _ones_own(exc):
                    raise
                self.problems.append(unexpected_problem(f"{label}/{member.name}", exc))

    def traced(
        self, members: list[Member], names: list[PurePosixPath], base: PurePosixPath, label: str, staged: bool
    ) -> Generator[TensorFileEntry, None, tuple[list[Member], list[PurePosixPath]]]:
        """The tensors of every module trace among `members`, in call order; returns the members left over."""
        folders: dict[PurePosixPath, dict[str, int]] = {}
        for index, name in enumerate(names):
            folders.setdefault(name.parent, {})[name.name] = index
        used: set[int] = set()
        for folder, files in folders.items():
            chosen = choose_trace_json(files)
            if chosen is None:
                continue
            used.update(i for f, i in files.items() if is_trace_json(f))
            member = members[files[chosen]]
            json_label = f"{label}/{member.name}" if label else str(member.name)
            try:
                trace = read_trace(member.path, json_label, files)
            except FileProblem as problem:
                self.problems.append(problem)
                continue
            prefix = "" if str(base / folder) == "." else f"{base / folder}/"
            self.traces.append(RunTrace(prefix, json_label, trace))
            for tensor in trace.tensors:
                if tensor.file is None:
                    continue
                index = files[tensor.file]
                used.add(index)
                found = members[index]
                yield TensorFileEntry(
                    found.path,
                    base / folder / tensor.relpath(tensor.file),
                    f"{label}/{found.name}" if label else str(found.name),
                    staged and found.span is None and found.packed is None,
                    module_path=tensor.module_path,
                    place=tensor.place,
                    source=tensor.source,
                    parameter=tensor.parameter,
                    span=found.span,
                    packed=found.packed,
                )
        rest = [i for i in range(len(members)) if i not in used]
        return [members[i] for i in rest], [names[i] for i in rest]

    def indexes(
        self, members: list[Member], names: list[PurePosixPath], label: str
    ) -> tuple[list[Member], list[PurePosixPath]]:
        """Read the index of every sharded checkpoint among `members` (checking that its shards are there); returns
        the members left over, indexes taken out."""
        present = set(names)
        kept: list[tuple[Member, PurePosixPath]] = []
        for member, name in zip(members, names, strict=True):
            if is_checkpoint_index(name.name):
                self.problems.extend(check_index(member.path, f"{label}/{member.name}", name.parent, present))
            else:
                kept.append((member, name))
        return [m for m, _ in kept], [n for _, n in kept]

    def file(
        self, path: Path, relpath: PurePosixPath, label: str, staged: bool, depth: int, member: Member | None = None
    ) -> Iterator[TensorFileEntry]:
        if member is not None and (member.span or member.packed):  # a tensor file not extracted: `path` holds it
            yield TensorFileEntry(path, relpath, label, False, span=member.span, packed=member.packed)
            return
        if path.is_symlink() and depth > 0 and staged:  # never made by our unpacking, which refuses links
            raise FileProblem(label, "is a symbolic link; skipped")
        kind = archive_kind(path)
        if kind == "npz":
            for member in extract_archive(
                path, label, self.folder(), self.budget, staged, _readable_in_place, _streamed
            ):
                if member.name.suffix != ".npy":
                    self.problems.append(NotATensor(f"{label}/{member.name}", "not a .npy member; skipped"))
                    continue
                key = str(member.name.with_suffix(""))
                extracted = member.span is None and member.packed is None
                yield TensorFileEntry(
                    member.path,
                    relpath,
                    f"{label}/{member.name}",
                    extracted,
                    (key,),
                    span=member.span,
                    packed=member.packed,
                )
        elif kind is not None:
            if depth >= MAX_NESTING:
                raise FileProblem(label, f"archives nested more than {MAX_NESTING} deep; skipped")
            yield from self.container(path, relpath.parent / archive_stem(relpath.name), label, depth, staged)
        elif is_tensor_file(path):
            yield TensorFileEntry(path, relpath, label, staged)
        else:
            suffix = path.suffix or "none"
            raise NotATensor(label, f"not a tensor file or archive (unknown extension {suffix!r}); skipped")


def expand_inputs(inputs: list[InputFile], staging: Path, limits: ArchiveLimits) -> Expansion:
    """Every tensor file in `inputs`, in order, and a problem for everything else."""
    expander = _Expander(staging, limits)
    containers = [i.path.is_dir() or archive_kind(i.path) in ("zip", "tar") for i in inputs]
    several = sum(containers) > 1
    entries, traced = _loose_trace(expander, [i for i, c in zip(inputs, containers, strict=True) if not c])
    for item, is_container in zip(inputs, containers, strict=True):
        if id(item) in traced:
            continue
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
        except Exception as exc:
            if not _ones_own(exc):
                raise
            expander.problems.append(unexpected_problem(item.label, exc))
    return Expansion(entries, expander.problems, expander.traces)


def _ones_own(exc: Exception) -> bool:
    """Whether `exc`, raised while unpacking or looking at one input, is that input's alone (so it fails, named, and
    the others go on): not one of ours (they say what stops the whole run), not a full disk, not out of memory."""
    return not isinstance(exc, TensorDebuggerError | MemoryError) and not is_disk_full(exc)


def _loose_trace(expander: _Expander, loose: list[InputFile]) -> tuple[list[TensorFileEntry], set[int]]:
    """A trace handed over as loose files (its JSON among them, the browser's upload of a folder's files): its
    tensors, and the ids of the inputs it used."""
    present = [i for i in loose if i.path.is_file()]
    if not any(is_trace_json(Path(i.label).name) for i in present):
        return [], set()
    members = [Member(PurePosixPath(Path(i.label).name), i.path) for i in present]
    names = [m.name for m in members]
    entries: list[TensorFileEntry] = []
    walk = expander.traced(members, names, PurePosixPath(), "", False)
    try:
        while True:
            entries.append(next(walk))
    except StopIteration as stop:
        left, _ = stop.value
    left_paths = {m.path for m in left}
    return entries, {id(i) for i in present if i.path not in left_paths}


def _readable_in_place(name: PurePosixPath) -> bool:
    """Archive members that are read as byte ranges of their archive when stored uncompressed: tensor files."""
    return is_tensor_file(Path(name.name))


def _streamed(name: PurePosixPath) -> bool:
    """Compressed zip members read through a decompressing stream: files whose reader takes their bytes in order
    (a `.pth` is a zip, read from its end first: those are extracted)."""
    return name.suffix.lower() in (".npy", ".safetensors")


def _strip_common_folder(names: list[PurePosixPath]) -> list[PurePosixPath]:
    """Drop one leading folder that every member shares ("dump/0_x.pth" -> "0_x.pth")."""
    firsts = {n.parts[0] for n in names}
    if len(firsts) != 1 or any(len(n.parts) == 1 for n in names):
        return names
    return [PurePosixPath(*n.parts[1:]) for n in names]
