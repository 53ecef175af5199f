"""What a run is ingested from: every input file's resolved path, size, modification and change times and a
digest of its content.

An ingest records its inputs' fingerprint on the run; an ingest of inputs with the same fingerprint (the same
files, unchanged, under the same labels, read by the same rules) reuses that run's tensors instead of reading the
files again (`runs.Ingestor`). A folder's fingerprint lists every file in it, so adding, removing, touching or
rewriting any of them makes it another fingerprint.

The digest is sha256 over the file's size, first MiB and last MiB (the whole file when it is smaller), the files
hashed in parallel threads. Hashing whole files would cost about 0.35 s of CPU for two runs of 200 MB here (sha256
at about 1.1 GB/s a core), most of the time a re-run is allowed; the ends cost milliseconds. What the ends miss,
a change inside the file that keeps its size, its modification time and its change time, takes a clock set
back: any write sets the change time (st_ctime) to now, and no tool copying files (cp -p, tar, rsync) can set it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensor_debugger.ingest.archives import ArchiveLimits
from tensor_debugger.ingest.inputs import InputFile

# Raise it when the same files would be stored differently (new formats, names or statistics): runs recorded
# under an older version are then never reused.
FINGERPRINT_VERSION = 1
SAMPLE_BYTES = 1 << 20  # hashed at each end of a file


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
        entries.append(
            {
                "label": item.label,
                "path": str(root),
                "files": [
                    {
                        "name": _name(root, path),
                        "size": stat.st_size,
                        "mtime_ns": stat.st_mtime_ns,
                        "ctime_ns": stat.st_ctime_ns,
                        "digest": digest,
                    }
                    for path, stat, digest in (next(described) for _ in paths)
                ],
            }
        )
    data = {"version": FINGERPRINT_VERSION, "limits": dataclasses.asdict(limits), "inputs": entries}
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return Fingerprint(data, "sha256:" + hashlib.sha256(canonical).hexdigest())


def file_digest(path: Path) -> str:
    """ "sha256-ends:<hex>" of the file's size, first MiB and last MiB (of the whole file when it is smaller)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        digest.update(size.to_bytes(8, "little"))
        if size <= 2 * SAMPLE_BYTES:
            digest.update(f.read())
        else:
            digest.update(f.read(SAMPLE_BYTES))
            f.seek(size - SAMPLE_BYTES)
            digest.update(f.read(SAMPLE_BYTES))
    return "sha256-ends:" + digest.hexdigest()


def _listing(item: InputFile) -> tuple[InputFile, Path, list[Path]]:
    root = item.path.resolve(strict=True)
    paths = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    return item, root, paths


def _name(root: Path, path: Path) -> str:
    return "" if path == root else path.relative_to(root).as_posix()
