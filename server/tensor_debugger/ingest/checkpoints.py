"""Sharded checkpoints: the index JSON beside the shards (`model.safetensors.index.json`,
`pytorch_model.bin.index.json`, as Hugging Face's `save_pretrained` writes them).

An index is read, not stored: its `weight_map` names the shard file of every weight. Every shard it names must
be among the files of the run; a missing one is reported (with how many weights it held), and the index itself
is never reported as a file that is not a tensor. Pairing drops the shards' file names from the tensors'
identities (`engine.logical_tensors.identities`), so a sharded checkpoint pairs with the same weights saved in one file.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path, PurePosixPath

from tensor_debugger.errors import FileProblem

INDEX_SUFFIX = ".index.json"
_MAX_INDEX_BYTES = 64 << 20


def is_checkpoint_index(name: str) -> bool:
    """`model.safetensors.index.json`, `pytorch_model.bin.index.json` and the like."""
    lowered = name.lower()
    return lowered.endswith(INDEX_SUFFIX) and Path(lowered[: -len(INDEX_SUFFIX)]).suffix in (
        ".safetensors",
        ".bin",
        ".pt",
        ".pth",
    )


def check_index(path: Path, label: str, folder: PurePosixPath, present: set[PurePosixPath]) -> list[FileProblem]:
    """The problems of the index at `path` (in `folder` of the run, whose files are `present`): unreadable, or
    naming shards that are not there."""
    try:
        if path.stat().st_size > _MAX_INDEX_BYTES:
            return [FileProblem(label, f"a checkpoint index over {_MAX_INDEX_BYTES >> 20} MiB; not read")]
        data = json.loads(path.read_text(encoding="utf-8"))
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError("weight_map is not an object of file names")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [FileProblem(label, f"not a readable checkpoint index ({type(exc).__name__}: {exc})")]
    shards = Counter(weight_map.values())
    return [
        FileProblem(
            label,
            f"names shard {shard!r} ({count} weights), which is not among the files; its "
            f"weights are missing from the run",
        )
        for shard, count in sorted(shards.items())
        if folder / shard not in present
    ]
