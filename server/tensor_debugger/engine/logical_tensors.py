"""From the tensors a run stores to its logical tensors: tensor-parallel shards merged (`_rank{k}`, `_tp{k}`
suffixes, `rank{k}/` or `tp{k}/` folders, or a name pattern's `rank` group), each with its identity (its name
less what only packages it)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_SHARD_SUFFIX = re.compile(r"^(?P<base>.+?)_(?:rank|tp)(?P<rank>\d+)(?P<rest>(?:\..*)?)$", re.IGNORECASE)
_SHARD_FOLDER = re.compile(r"(?:^|/)(?:rank|tp)[_-]?(?P<rank>\d+)(?:/|$)", re.IGNORECASE)
_SHARD_FILE = re.compile(r"^(?P<stem>.+?)-\d+-of-\d+$")  # model-00001-of-00004 (Hugging Face shards)


@dataclass(frozen=True)
class TensorRef:
    """What the engine needs to know of a stored tensor."""

    id: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    position: int
    layer: int | None = None
    stage: str | None = None
    key_path: tuple[str, ...] = ()
    digest: str = ""
    module_path: str | None = None  # from a module trace or a capture
    place: str | None = None
    parameter: str | None = None  # a captured module input's: the parameter of the module's `forward` it binds to


@dataclass(frozen=True)
class LogicalTensor:
    """One tensor of a run: a stored tensor, or the shards of one split across tensor-parallel ranks."""

    name: str
    shards: tuple[TensorRef, ...]  # in rank order
    identity: str = ""  # the name less what only packages it (`identities`); set by `pair_runs`

    @property
    def first(self) -> TensorRef:
        return self.shards[0]

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [s.shape for s in self.shards]

    @property
    def layer(self) -> int | None:
        return self.first.layer

    @property
    def stage(self) -> str | None:
        return self.first.stage

    @property
    def position(self) -> int:
        return min(s.position for s in self.shards)


def shard_of(name: str, pattern: re.Pattern[str] | None = None) -> tuple[str, int | None]:
    """(logical name, rank) of a stored tensor's name; rank None when it is not a shard. A name pattern's `rank`
    group, where it matches, decides instead (the logical name is the name less that group's text)."""
    if pattern is not None and "rank" in pattern.groupindex:
        found = pattern.search(name)
        if found and found.group("rank") is not None and found.group("rank").isdigit():
            start, end = found.span("rank")
            return name[:start] + name[end:], int(found.group("rank"))
    folder = _SHARD_FOLDER.search(name)
    if folder:
        start, end = folder.span()
        joined = name[:start] + ("/" if start and end < len(name) else "") + name[end:]
        return joined.strip("/"), int(folder.group("rank"))
    suffix = _SHARD_SUFFIX.match(name)
    if suffix:
        return suffix.group("base") + suffix.group("rest"), int(suffix.group("rank"))
    return name, None


def group_shards(tensors: Iterable[TensorRef], pattern: re.Pattern[str] | None = None) -> list[LogicalTensor]:
    """Merge shards of one tensor; a lone `_rank0` stays a tensor of its own name without the mark."""
    groups: dict[str, list[tuple[int, TensorRef]]] = {}
    for tensor in tensors:
        logical, rank = shard_of(tensor.name, pattern)
        groups.setdefault(logical, []).append((rank if rank is not None else -1, tensor))
    merged: list[LogicalTensor] = []
    for logical, members in groups.items():
        ranks = [r for r, _ in members]
        if len(members) > 1 and (-1 in ranks or len(set(ranks)) != len(ranks)):
            # not a clean set of shards (a plain tensor beside ranked ones): keep each under its own name
            merged.extend(LogicalTensor(t.name, (t,)) for _, t in members)
            continue
        merged.append(LogicalTensor(logical, tuple(t for _, t in sorted(members, key=lambda m: m[0]))))
    return merged


def _file_and_key(t: LogicalTensor) -> tuple[str, str]:
    """The part of a logical tensor's name that names its file, and the part that is its key path inside it."""
    key = ".".join(t.first.key_path)
    if key:
        logical_key = shard_of(key)[0]
        for tail in (key, logical_key):
            if t.name.endswith("." + tail):
                return t.name[: -len(tail) - 1], logical_key
    return t.name, ""


def identities(tensors: Sequence[LogicalTensor]) -> list[str]:
    """Each tensor's name less what only packages it, decided over the whole run:

    - the file names of a sharded checkpoint (`model-00001-of-00004`) become one (`model`);
    - folders that every file of the run sits in are dropped;
    - when every tensor comes from one file and has a key path inside it (a state dict, a checkpoint, however
      many shards), the file's name is dropped: `a.pth` holding `layers.0.w` gives `layers.0.w`.
    Files holding one tensor each keep their names (`0_query`): there the file name is the tensor's name."""
    parts = [_file_and_key(t) for t in tensors]
    files = []
    for file, _ in parts:
        folder, _, stem = file.rpartition("/")
        shard = _SHARD_FILE.match(stem)
        files.append(f"{folder}/{shard.group('stem')}" if shard and folder else shard.group("stem") if shard else file)
    folders = [f.split("/")[:-1] for f in files]
    common = 0
    if folders:
        shortest = min(len(f) for f in folders)
        while common < shortest and len({f[common] for f in folders}) == 1:
            common += 1
    if common:
        files = ["/".join(f.split("/")[common:]) for f in files]
    if len(set(files)) == 1 and all(key for _, key in parts):
        files = [""] * len(files)
    return [f"{file}.{key}" if file and key else file or key for file, (_, key) in zip(files, parts, strict=True)]
