"""What a run is ingested from: every input file's resolved path, size, modification time and content digest.

An ingest records its inputs' fingerprint on the run; an ingest of inputs with the same fingerprint (the same
files, unchanged, under the same labels, read by the same rules) reuses that run's tensors instead of reading the
files again (`runs.Ingestor`). A folder's fingerprint lists every file in it, so adding, removing, touching or
rewriting any of them makes it another fingerprint.

The digest is sha256 over the whole file, the files hashed in parallel threads (hashlib lets go of the GIL while
it hashes): at about 1 GB/s a core (SHA-NI) it costs a fraction of reading and storing the tensors again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensor_debugger.ingest.archives import ArchiveLimits
from tensor_debugger.ingest.inputs import InputFile

# Raise it when the same files would be stored differently (new formats, names or statistics): runs recorded
# under an older version are then never reused.
FINGERPRINT_VERSION = 1
_READ_BYTES = 1 << 20


@dataclass(frozen=True)
class Fingerprint:
    data: dict[str, Any]  # JSON: {"version", "limits", "inputs": [{"label", "path", "files": [...]}]}
    key: str  # "sha256:<hex>" of `data` as canonical JSON


def fingerprint_inputs(inputs: list[InputFile], limits: ArchiveLimits, threads: int) -> Fingerprint | None:
    """The fingerprint of `inputs`, or None when one cannot be read (a path that does not exist, a file that
    cannot be opened): such an ingest is neither reused nor reusable."""
    try:
        listed = [_listing(item) for item in inputs]
        files = [path for _, _, paths in listed for path in paths]
        stats = [path.stat() for path in files]
        with ThreadPoolExecutor(max(1, min(threads, len(files))), thread_name_prefix="fingerprint") as pool:
            digests = list(pool.map(file_digest, files))
    except OSError:
        return None
    described = iter(zip(files, stats, digests, strict=True))
    entries = []
    for item, root, paths in listed:
        entries.append({"label": item.label, "path": str(root), "files": [
            {"name": _name(root, path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "digest": digest}
            for path, stat, digest in (next(described) for _ in paths)
        ]})
    data = {"version": FINGERPRINT_VERSION, "limits": dataclasses.asdict(limits), "inputs": entries}
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return Fingerprint(data, "sha256:" + hashlib.sha256(canonical).hexdigest())


def file_digest(path: Path) -> str:
    with path.open("rb") as f:
        return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()


def _listing(item: InputFile) -> tuple[InputFile, Path, list[Path]]:
    root = item.path.resolve(strict=True)
    paths = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    return item, root, paths


def _name(root: Path, path: Path) -> str:
    return "" if path == root else path.relative_to(root).as_posix()
