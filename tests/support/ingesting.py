"""A session whose runs are still being ingested when the test's next request comes: uploaded without waiting,
into a server whose one ingest child is held (stopped) till the test lets it go."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

import numpy as np
import psutil
import torch

from tests.support.servers import LiveServer, started_server, upload


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


class HeldIngests:
    """A server's ingests held: its one ingest child (the server started with TENSOR_DEBUGGER_INGEST_WORKERS=1),
    started by a first upload (ingest children are kept for the next ones), then stopped (SIGSTOP), so that no
    ingest of the server goes on till `release` (or the block's end) continues it. Racing the ingest instead loses
    where it is quick: a run of the same bytes already ingested (another test's, on a shared server) is copied, not
    read."""

    def __init__(self, server: LiveServer, folder: Path) -> None:
        self.server, self.folder = server, folder
        self.children: list[psutil.Process] = []

    def __enter__(self) -> HeldIngests:
        for side in ("reference", "candidate"):
            (self.folder / side).mkdir()
            np.save(self.folder / side / "0_warm.npy", np.arange(4, dtype=np.float32))
        files = [(side, self.folder / side / "0_warm.npy") for side in ("reference", "candidate")]
        warm = upload(self.server, "warm up", files)
        assert warm.status_code == 201, warm.text
        children = ingest_children(self.server)
        assert len(children) == 1, children  # TENSOR_DEBUGGER_INGEST_WORKERS=1: every ingest goes to this one
        for child in children:
            child.send_signal(signal.SIGSTOP)
        self.children = children
        return self

    def release(self) -> None:
        """Continue the held ingest child."""
        for child in self.children:
            child.send_signal(signal.SIGCONT)
        self.children = []

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()


@contextmanager
def held_session(folder: Path, name: str) -> Iterator[tuple[LiveServer, int, HeldIngests]]:
    """A server of the test's own with one ingest child (held: `HeldIngests`), and session `name` uploaded to it
    still ingesting (`upload_still_ingesting`): the server, the session's id, and the hold to release. The server
    is stopped on the way out."""
    server = started_server(folder / "server", env={"TENSOR_DEBUGGER_INGEST_WORKERS": "1"})
    try:
        with HeldIngests(server, folder) as held:
            yield server, upload_still_ingesting(server, folder, name), held
    finally:
        server.stop()
