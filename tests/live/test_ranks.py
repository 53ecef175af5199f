"""`capture` inside torch.distributed: two gloo ranks on loopback, each holding half the heads of an attention
block, captured into one run whose shards merge and pair with the single-process run's tensors."""

from __future__ import annotations

import multiprocessing
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import torch.distributed as dist
from tensor_debugger import capture
from tensor_debugger.compare.reports.pair_reports import SessionPairs, pair_detail
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from torch import nn

from tests.support.built_once import built_once, copy_of
from tests.support.polling import wait_until
from tests.support.servers import LiveServer
from tests.support.sessions import compared as compared_session

DIM, HEADS, WORLD = 8, 4, 2


class Core(nn.Module):
    """Scaled dot-product attention over the heads this rank holds."""

    def __init__(self, heads: int, bug: bool) -> None:
        super().__init__()
        self.heads, self.bug = heads, bug

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, t, _ = q.shape
        q, k, v = (x.view(b, t, self.heads, -1).transpose(1, 2) for x in (q, k, v))
        scores = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5)
        if self.bug:
            scores = scores * 1.5  # the planted bug: a wrong scale on this rank's heads
        out = torch.softmax(scores, dim=-1) @ v
        return out.transpose(1, 2).reshape(b, t, -1)


class Attention(nn.Module):
    """Column-parallel q/k/v (this rank's heads), the heads' outputs gathered, o_proj replicated: as TP does."""

    def __init__(self, rank: int, world: int, bug: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        full = [nn.Linear(DIM, DIM, bias=False) for _ in range(4)]
        part = DIM // world
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(DIM, part, bias=False) for _ in range(3))
        with torch.no_grad():
            for mine, whole in zip((self.q_proj, self.k_proj, self.v_proj), full, strict=False):
                mine.weight.copy_(whole.weight[rank * part : (rank + 1) * part])
        self.core = Core(HEADS // world, bug)
        self.o_proj = full[3]
        self.world = world

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads = self.core(self.q_proj(x), self.k_proj(x), self.v_proj(x))
        if self.world > 1:
            pieces = [torch.empty_like(heads) for _ in range(self.world)]
            dist.all_gather(pieces, heads.contiguous())
            heads = torch.cat(pieces, dim=-1)
        out: torch.Tensor = self.o_proj(heads)
        return out


class Model(nn.Module):
    def __init__(self, rank: int = 0, world: int = 1, bug: bool = False) -> None:
        super().__init__()
        self.attn = Attention(rank, world, bug)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.attn(x)
        return out


def inputs() -> torch.Tensor:
    return torch.randn(2, 3, DIM, generator=torch.Generator().manual_seed(1))


# a rank's job: capture's `data_dir=` or `server=`, the session, the rank with the bug (-1: none)
Job = tuple[dict[str, str], str, int]


def _rank(rank: int, port: int, jobs: list[Job], run: str, done: Any) -> None:
    """One rank, capturing each job's session in turn (the ranks meet at a barrier after each). The ranks leave
    together, as a launcher's do: a gloo rank whose peer has exited may abort in its own teardown ("terminate called
    without an active exception"), which is gloo's, not capture's."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        for where, session, bug_on in jobs:
            model = Model(rank, WORLD, bug=rank == bug_on)
            with torch.no_grad(), capture(model, session=session, run=run, workers=1, **where) as result:
                model(inputs())
            assert result.rank == rank and result.run_id is not None  # every rank knows the run
            dist.barrier()
    finally:
        dist.destroy_process_group()
        done.wait(timeout=60)


def run_ranks(jobs: list[Job]) -> None:
    """Two gloo ranks in processes of their own (spawned: each imports torch and this module again, seconds of CPU),
    started once for all of `jobs`."""
    spawn = multiprocessing.get_context("spawn")
    args = (free_port(), jobs, "ranks", spawn.Barrier(WORLD))
    processes = [spawn.Process(target=_rank, args=(k, *args)) for k in range(WORLD)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=300)
    assert [p.exitcode for p in processes] == [0] * WORLD  # each rank's own checks passed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# the sessions the tests on a data dir compare: (session, rank with the bug, the reference's values)
IN_DATA_DIR = {
    "tp": (-1, "full"),
    "tp bug": (1, "full"),
    "tp summary": (-1, "summary"),
    "tp summary bug": (1, "summary"),
}
OVER_HTTP = "tp over http"


@dataclass(frozen=True)
class Captured:
    settings: Settings  # the data dir of the IN_DATA_DIR sessions (this worker's copy of the one built)
    session_ids: dict[str, int]  # every IN_DATA_DIR session's id
    over_http: dict[str, Any]  # the server's report of OVER_HTTP's session (GET /api/sessions/{id}/pairs), compared


def capture_all(folder: Path, server: LiveServer) -> dict[str, Any]:
    """Each session's reference captured in this process (one model, no ranks), then the ranks' run of every
    session captured by one pair of rank processes: the IN_DATA_DIR sessions into a data dir under `folder`,
    OVER_HTTP to `server`, whose report of it is read once its pairs are compared (the server is the building
    worker's, gone when that worker ends: a test on another worker reads the report kept here)."""
    assert server.alive(), f"the shared server has exited; its log: {server.log}"
    data_dir = folder / "data"
    ids: dict[str, int] = {}
    references: list[tuple[str, dict[str, Any]]] = [
        (name, {"data_dir": data_dir, "values": values}) for name, (_, values) in IN_DATA_DIR.items()
    ]
    references.append((OVER_HTTP, {"server": server.url}))
    for name, where in references:
        model = Model()
        with torch.no_grad(), capture(model, session=name, run="reference", **where) as result:
            model(inputs())
        assert result.session_id is not None
        ids[name] = result.session_id
    jobs: list[Job] = [({"data_dir": str(data_dir)}, name, bug) for name, (bug, _) in IN_DATA_DIR.items()]
    jobs.append(({"server": server.url}, OVER_HTTP, -1))
    run_ranks(jobs)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        report: dict[str, Any] = wait_until(
            lambda: client.get(f"/api/sessions/{ids[OVER_HTTP]}/pairs").json(),
            until=lambda r: r["pairs"] and not r["progress"]["pending"],
            what="the ranks' session to be compared",
            timeout=120,
            interval=0.05,
        )
    return {"session_ids": ids, "over_http": report}


@pytest.fixture(scope="module")
def ranks_captured(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Captured:
    """The sessions of `capture_all`, captured once for the whole run (tests/support/built_once.py: a pair of rank
    processes imports torch and this module, seconds of CPU, and `--dist worksteal` may share this module's tests
    out between workers), OVER_HTTP's to the building worker's shared server (`shared_server`'s, session-scoped
    underneath). Each worker compares in a copy of the data dir; each test compares and reads only its own
    session."""
    built, found = built_once(
        tmp_path_factory, "ranks", lambda folder: capture_all(folder, request.getfixturevalue("_shared_server"))
    )
    copy = copy_of(built, tmp_path_factory.mktemp("ranks") / "built")
    ids = {str(name): int(session_id) for name, session_id in found["session_ids"].items()}
    return Captured(Settings(data_dir=copy / "data", demo=False), ids, found["over_http"])


def compared(captured: Captured, session: str) -> SessionPairs:
    """The session's pairs, planned and computed here."""
    return compared_session(captured.settings, captured.session_ids[session])


def test_two_gloo_ranks_capture_one_run_whose_shards_merge_and_pass(ranks_captured: Captured) -> None:
    report = compared(ranks_captured, "tp")
    assert report.first_divergence is None
    assert all(p.status == "pass" for p in report.pairs), [(p.name, p.status) for p in report.pairs]
    core = next(p for p in report.pairs if p.module_path == "Model.attn.core" and p.place == "outputs")
    assert core.b.shards == WORLD and core.a.shards == 1  # rank0/ and rank1/ merged into one logical tensor
    q_proj = next(p for p in report.pairs if p.module_path == "Model.attn.q_proj" and p.place == "outputs")
    assert q_proj.b.shards == WORLD and q_proj.b.shape == q_proj.a.shape
    output = next(p for p in report.pairs if p.module_path == "Model" and p.place == "outputs")
    assert output.replicas is not None and output.replicas.ranks == WORLD  # every rank holds the whole output
    assert not report.not_compared


def test_a_bug_on_rank_1_only_is_the_first_divergence_and_its_shard_is_named(ranks_captured: Captured) -> None:
    report = compared(ranks_captured, "tp bug")
    first = report.first_divergence
    assert first is not None and first.module_path == "Model.attn.core", first
    services = open_services(ranks_captured.settings)
    try:
        with services.sessions() as db:
            detail = pair_detail(db, services.context, first.pair_id)
    finally:
        services.close()
    assert detail.argmax is not None
    assert detail.argmax.b.tensor.startswith("rank1/"), detail.argmax  # the largest difference is rank 1's shard
    assert detail.argmax.aligned[-1] >= DIM // WORLD  # in the heads rank 1 holds


def test_a_summary_reference_against_sharded_ranks_compares_the_merged_shards_and_each_replica(
    ranks_captured: Captured,
) -> None:
    """A summary is of one whole tensor: the ranks' shards are read together into the merged tensor's summary (never
    one shard's statistics against the whole), and each rank's replica is compared on its own."""
    report = compared(ranks_captured, "tp summary")
    split = [p for p in report.pairs if p.b.shards > 1]
    assert split and all(p.status == "pass" for p in split), [(p.name, p.status, p.error) for p in split]
    reasons = {p.name: str(p.summary.reason if p.summary is not None else None) for p in split}
    core = next(p for p in split if p.module_path == "Model.attn.core" and p.place == "outputs")
    assert "no difference found in the summary" in reasons[core.name]
    assert "held as 2 shards (concatenated along dim 2)" in reasons[core.name], reasons[core.name]
    assert "bit-identity is not checked" in reasons[core.name] and (
        core.summary is None or core.summary.identical is not True
    )
    output = next(p for p in split if p.module_path == "Model" and p.place == "outputs")
    assert "each of the candidate's 2 replicas compared" in reasons[output.name], reasons[output.name]
    whole = [p for p in report.pairs if p.b.shards == 1]
    assert all(p.status == "pass" for p in whole), [(p.name, p.status, p.error) for p in whole]
    assert report.first_divergence is None


def test_a_bug_on_one_rank_against_a_summary_reference_fails_the_merged_shards_first(ranks_captured: Captured) -> None:
    """The planted scale on rank 1's heads, seen from a summary reference: the merged shards of the attention core
    fail (first divergence), and the replicated output names the rank whose copy differs."""
    report = compared(ranks_captured, "tp summary bug")
    first = report.first_divergence
    assert first is not None and first.module_path == "Model.attn.core", first
    assert first.basis == "summary" and "shards" in str(first.summary_reason), first
    output = next(p for p in report.pairs if p.module_path == "Model" and p.place == "outputs")
    assert output.status == "fail", (output.status, output.summary)
    reason = str(output.summary.reason if output.summary is not None else None)
    # o_proj runs after the gather: every rank's output holds rank 1's wrong heads, so every replica differs
    assert "rank 0's replica of the candidate, one of 2; 1 more of the 2 replicas differ" in reason, reason


def test_ranks_send_one_run_to_a_server(ranks_captured: Captured) -> None:
    report = ranks_captured.over_http  # the server's, once it had compared the session (`capture_all`)
    assert report["first_divergence"] is None
    assert {p["status"] for p in report["pairs"]} == {"pass"}
    core = next(p for p in report["pairs"] if p["module_path"] == "Model.attn.core" and p["place"] == "outputs")
    assert core["b"]["shards"] == WORLD and core["a"]["shards"] == 1  # one .tar per rank, merged as shards
