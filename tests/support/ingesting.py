"""A session whose runs are still being ingested when the test's next request comes."""

from __future__ import annotations

from pathlib import Path

import psutil
import torch

from tests.support.servers import LiveServer, upload


def ingest_children(server: LiveServer) -> list[psutil.Process]:
    """The server's ingest children (its pools' processes, started by multiprocessing's spawn)."""
    assert server.process is not None
    return [p for p in psutil.Process(server.process.pid).children() if any("spawn_main" in a for a in p.cmdline())]


def upload_still_ingesting(server: LiveServer, folder: Path, name: str) -> int:
    """Upload a reference and a candidate (8 tensors, 64 MiB a run, each of the candidate's off by 1) as session
    `name` without waiting (`?wait=false`, 202): its id, while the server is still ingesting them."""
    generator = torch.Generator().manual_seed(0)
    tensors = {f"{n}_query": torch.randn(2048, 1024, generator=generator) for n in range(8)}
    torch.save(tensors, folder / "ref.pth")
    torch.save({k: v + 1 for k, v in tensors.items()}, folder / "cand.pth")
    files = [("reference", folder / "ref.pth"), ("candidate", folder / "cand.pth")]
    accepted = upload(server, name, files, url="/api/sessions?wait=false")
    assert accepted.status_code == 202, accepted.text
    return int(accepted.json()["session"]["id"])
