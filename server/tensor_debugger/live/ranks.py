"""A capture inside torch.distributed: each rank's tensors are one shard of the run.

Where a process group is initialised with more than one rank, every rank of `capture(...)` writes its tensors and
its module tree as a trace folder `rank{k}/` of one staging folder that rank 0 makes and names to the others (so on
several hosts `staging=` must be a folder every rank sees). When the block ends, the ranks wait for each other;
rank 0 then sends the folders as one run (into the data directory, or to the server as one plain `.tar` per rank),
and every rank's result gets its ids. Names are led by the folder (`rank1/Model.attn.q_proj_outputs`), the
tensor-parallel convention ingest and pairing already know: each tensor's shards merge into one logical tensor
(`engine/logical_tensors.py`), concatenated where they are pieces of it, compared copy by copy where every rank
holds the whole of it (replicas), and a rank whose shard differs is named.
"""

from __future__ import annotations

import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Ranks:
    """This process's place in the process group."""

    rank: int
    world: int

    @property
    def folder(self) -> str:
        return f"rank{self.rank}"


def process_ranks() -> Ranks | None:
    """The process group's rank and size, where one is initialised with more than one rank; None otherwise."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    world = dist.get_world_size()
    return Ranks(dist.get_rank(), world) if world > 1 else None


def _broadcast(value: Any) -> Any:
    """Rank 0's `value`, on every rank."""
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gather(value: Any, world: int) -> list[Any]:
    """Every rank's `value`, in rank order, on every rank."""
    import torch.distributed as dist

    values: list[Any] = [None] * world
    dist.all_gather_object(values, value)
    return values


def shared_staging(ranks: Ranks, staging: str | Path | None) -> Path:
    """The staging folder of the whole capture: made by rank 0, its path sent to the others, each of which must see
    it. Raises RuntimeError on a rank that cannot."""
    made = str(tempfile.mkdtemp(prefix="capture-", dir=staging)) if ranks.rank == 0 else None
    shared = Path(_broadcast(made))
    if not shared.is_dir():
        raise RuntimeError(
            f"capture on rank {ranks.rank}: rank 0's staging folder {shared} is not on this host; "
            "pass staging= a folder every rank sees"
        )
    return shared


def rank_folder(shared: Path, ranks: Ranks) -> Path:
    folder = shared / ranks.folder
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def gather_counts(ranks: Ranks, tensors: int, skipped: list[str]) -> tuple[int, list[str]]:
    """Wait for every rank's trace; the tensors and skipped values of all ranks (skipped ones led by the rank)."""
    everyone = _gather((tensors, skipped), ranks.world)
    return sum(n for n, _ in everyone), [f"rank{k}/{s}" for k, (_, kept) in enumerate(everyone) for s in kept]


def send_from_rank0(
    ranks: Ranks,
    shared: Path,
    session: str,
    run: str,
    data_dir: str | Path | None,
    server: str | None,
    token: str | None,
    against: str | None = None,
    found: int | None = None,
    role: str | None = None,
) -> tuple[int, int]:
    """Rank 0 sends the ranks' folders as one run (compared against the session's run labelled `against`, where
    given; to a server, into the session of id `found` where its capture found one as it began); every rank gets
    (session id, run id), or raises rank 0's error."""
    outcome: tuple[int, int] | str
    if ranks.rank == 0:
        try:
            outcome = _send(shared, ranks.world, session, run, data_dir, server, token, against, found, role)
        except Exception as exc:  # every rank raises it, not only rank 0
            outcome = f"{type(exc).__name__}: {exc}"
    else:
        outcome = ""
    outcome = _broadcast(outcome)
    if isinstance(outcome, str):
        raise RuntimeError(f"capture of run {run!r}: rank 0 could not store the ranks' tensors: {outcome}")
    return outcome


def _send(
    shared: Path,
    world: int,
    session: str,
    run: str,
    data_dir: str | Path | None,
    server: str | None,
    token: str | None,
    against: str | None = None,
    found: int | None = None,
    role: str | None = None,
) -> tuple[int, int]:
    folders = [shared / f"rank{k}" for k in range(world)]
    if server is not None:
        from tensor_debugger.live.upload import upload_files

        archives = []
        for folder in folders:  # plain tars: read in place by offset, no copy on the server
            archive = shared / f"{folder.name}.tar"
            with tarfile.open(archive, "w") as tar:
                tar.add(folder, arcname=folder.name)
            archives.append(archive)
        return upload_files(server, session, run, archives, token, against=against, found=found, role=role)
    from tensor_debugger.ingest.inputs import InputFile
    from tensor_debugger.services import open_services
    from tensor_debugger.settings import Settings

    settings = Settings.from_environ() if data_dir is None else Settings.from_environ(data_dir=Path(data_dir))
    services = open_services(settings)
    try:
        result = services.ingestor.ingest(
            session, run, [InputFile(f, f.name) for f in folders], reuse=False, against=against, role=role
        )
        services.plan(result.session_id)
        return result.session_id, result.run_id
    finally:
        services.close()
