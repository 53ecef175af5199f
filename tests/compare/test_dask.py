"""Pending pairs computed by Dask workers (TENSOR_DEBUGGER_DASK_SCHEDULER): a real `dask scheduler` and two `dask
worker` processes on loopback (the run's cluster: tests/conftest.py), the same results as computed here, big pairs
one task per block, and nothing of Dask imported without the setting."""

from __future__ import annotations

import dataclasses
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from sqlalchemy import select
from tensor_debugger.compare.reports.pair_reports import session_pairs
from tensor_debugger.demo.synthetic import Plant, write_dump
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.claims import Claims
from tensor_debugger.store.models import PairRecord

from tests.support.dask_cluster import DaskCluster
from tests.support.dumps import seeded
from tests.support.polling import wait_until
from tests.support.servers import child_env

PLANT = Plant(layer=1, stage="post_attn", index=(3, 7), offset=0.5)


def computed(
    data_dir: Path, runs: tuple[Path, Path], scheduler: str, kernel: str = "compiled", top: int = 8
) -> tuple[list[dict[str, Any]], int]:
    """Every pair report of a session of `runs` computed with `scheduler` ("" here), and the chunks this process
    read doing it."""
    services = open_services(Settings(data_dir=data_dir, demo=False, dask_scheduler=scheduler, kernel=kernel, top=top))
    try:
        for label, path in zip(("reference", "candidate"), runs, strict=True):
            session_id = services.ingestor.ingest("dask", label, [InputFile(path, path.name)]).session_id
        services.plan(session_id)
        before = services.store.chunk_reads
        settled = services.compute(session_id)
        with services.sessions() as db:
            report = session_pairs(db, session_id)
        assert settled == len(report.pairs) > 0
        return [dataclasses.asdict(p) for p in report.pairs], services.store.chunk_reads - before
    finally:
        services.close()


def test_dask_workers_compute_the_same_results_as_this_process(tmp_path: Path, dask_cluster: DaskCluster) -> None:
    write_dump(tmp_path / "ref", layers=3, seed=4)
    write_dump(tmp_path / "cand", layers=3, seed=4, plant=PLANT)
    runs = (tmp_path / "ref", tmp_path / "cand")
    local, read_here = computed(tmp_path / "local", runs, "")
    remote, read_by_server = computed(tmp_path / "dask", runs, dask_cluster.address)
    assert remote == local
    assert read_here > 0 and read_by_server == 0  # every chunk was read by the Dask worker
    assert any(p["status"] == "fail" for p in remote) and any(p["status"] == "pass" for p in remote)


def test_dask_workers_keep_as_many_worst_elements_as_the_settings_say(
    tmp_path: Path, dask_cluster: DaskCluster
) -> None:
    write_dump(tmp_path / "ref", layers=2, seed=5)
    write_dump(tmp_path / "cand", layers=2, seed=6)  # every value differs: more than 3 worst elements to keep
    runs = (tmp_path / "ref", tmp_path / "cand")
    local, _ = computed(tmp_path / "local", runs, "", top=3)
    remote, _ = computed(tmp_path / "dask", runs, dask_cluster.address, top=3)
    assert remote == local
    kept = [len(p["stats"]["worst"]) for p in remote if p["stats"] is not None]
    assert kept and max(kept) == 3, kept


def test_a_big_pair_is_computed_one_task_per_block_with_the_same_statistics(
    tmp_path: Path, dask_cluster: DaskCluster
) -> None:
    """A tensor spanning three blocks: each block is a task on the cluster, and their partial statistics, merged
    here in block order, are the bits computed locally (differences in each block, so that the merge decides the
    argmax, the counts and the sums)."""
    from distributed import Client, get_task_stream

    reference = seeded((3000, 1024), seed=8)  # blocks of 1,048,576 float64 values without the chunk loop: 3
    candidate = reference.clone()
    candidate[100:400] += 1e-3  # block 1
    candidate[1500, 7] = float("nan")  # block 2: where the difference is largest (a NaN on one side)
    candidate[2900, 1000] += 0.75  # block 3
    small = seeded((16, 16), seed=9)
    for label, values in (("ref", reference), ("cand", candidate)):
        (tmp_path / label).mkdir()
        torch.save({"big": values, "small": small}, tmp_path / label / "tensors.pt")
    runs = (tmp_path / "ref", tmp_path / "cand")
    local, _ = computed(tmp_path / "local", runs, "", kernel="blocks")
    client = Client(dask_cluster.address, timeout=10, set_as_default=False)  # type: ignore[no-untyped-call]
    with client, get_task_stream(client) as stream:
        remote, read_by_server = computed(tmp_path / "dask", runs, dask_cluster.address, kernel="blocks")
    assert remote == local
    assert read_by_server == 0  # not even for where inside it the error is: its blocks read again on the workers
    big = next(p for p in remote if p["name"].endswith("big"))
    assert big["where"] == [  # the NaN outweighs every finite difference
        {"dim": 0, "name": None, "size": 3000, "ranges": [[1500, 1500]]},
        {"dim": 1, "name": None, "size": 1024, "ranges": [[7, 7]]},
    ]
    big = next(p for p in remote if "big" in p["name"])
    assert big["status"] == "fail" and big["stats"]["argmax"] == [1500, 7] and big["stats"]["nan_one_side"] == 1
    assert big["stats"]["mismatched"] == 300 * 1024 + 2  # block 1's differences pass no tolerance either
    # this test's blocks only (the cluster may run other tests' and servers' tasks meanwhile): their keys carry the
    # first 8 hex digits of their comparison's cache key
    with sqlite3.connect(tmp_path / "dask" / "metadata.sqlite3") as db:
        ours = {key.rpartition(":")[2][:8] for (key,) in db.execute("SELECT cache_key FROM comparison_results")}
    db.close()
    assert len(ours) == 2  # the big pair's and the small one's
    prefixes = tuple(f"compute_block-{key}-" for key in ours)
    blocks = [task for task in stream.data if str(task["key"]).startswith(prefixes)]
    assert len(blocks) == 3  # one task per block; the small pair went in a batch


def test_without_the_setting_nothing_of_dask_is_imported(tmp_path: Path) -> None:
    write_dump(tmp_path / "ref", layers=1, seed=4)
    write_dump(tmp_path / "cand", layers=1, seed=4, plant=Plant(layer=0, stage="post_attn", index=(1, 1), offset=1))
    script = (
        "import sys; from tensor_debugger.cli.main import main; "
        f"code = main(['--data-dir', {str(tmp_path / 'data')!r}, 'compare', {str(tmp_path / 'ref')!r}, "
        f"{str(tmp_path / 'cand')!r}]); "
        "print(code, sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=child_env(), timeout=120)
    assert done.stdout.splitlines()[-1] == "1 []", done.stderr


def test_the_workers_leave_pairs_another_process_holds_to_it(tmp_path: Path, dask_cluster: DaskCluster) -> None:
    """Claims split the work between the Dask workers and other processes: pairs another replica holds are not
    computed by the workers, the session's computation waits for them, and takes them over once let go."""
    write_dump(tmp_path / "ref", layers=3, seed=4)
    write_dump(tmp_path / "cand", layers=3, seed=4, plant=PLANT)
    services = open_services(Settings(data_dir=tmp_path / "data", demo=False, dask_scheduler=dask_cluster.address))
    try:
        for label in ("ref", "cand"):
            path = tmp_path / label
            session_id = services.ingestor.ingest("held", label, [InputFile(path, label)]).session_id
        services.plan(session_id)
        other = Claims(services.sessions, 60)  # another replica's, computing two of the pairs
        held = other.claim_pairs(session_id, 2)
        assert len(held) == 2

        def statuses() -> dict[int, str]:
            with services.sessions() as db:
                return {pair: status for pair, status in db.execute(select(PairRecord.id, PairRecord.status))}

        with ThreadPoolExecutor(1) as pool:
            computing = pool.submit(services.compute, session_id)
            wait_until(
                lambda: all(status != "pending" for pair, status in statuses().items() if pair not in held),
                what="the workers to settle the pairs nobody else holds",
                timeout=120,
            )
            assert [statuses()[pair] for pair in held] == ["pending", "pending"]  # in the same batch, left alone
            assert not computing.done()  # the session's computation waits for the other replica
            other.release_pairs()  # it stops: what it held is taken over
            assert computing.result(timeout=120) == len(statuses())
        assert "pending" not in statuses().values()
    finally:
        services.close()


def test_replicas_are_compared_rank_by_rank_on_the_workers(tmp_path: Path, dask_cluster: DaskCluster) -> None:
    """A norm weight each of two ranks holds whole, rank 1's copy wrong: the workers compare both copies (the
    stacked views), and the rank whose copy differs is named as when computed here."""
    norm = seeded((64,), seed=10)
    (tmp_path / "ref").mkdir()
    torch.save({"norm.weight": norm}, tmp_path / "ref" / "model.pt")
    for rank in range(2):
        (tmp_path / "cand" / f"rank{rank}").mkdir(parents=True)
        torch.save({"norm.weight": norm + rank}, tmp_path / "cand" / f"rank{rank}" / "model.pt")
    runs = (tmp_path / "ref", tmp_path / "cand")
    local, _ = computed(tmp_path / "local", runs, "")
    remote, _ = computed(tmp_path / "dask", runs, dask_cluster.address)
    assert remote == local
    (pair,) = remote
    assert pair["status"] == "fail" and pair["replicas"] == {"ranks": 2, "side": "b", "differing": [1]}
    assert pair["stats"]["argmax"][0] == 1 and pair["stats"]["mismatched"] == 64


def test_a_chunk_file_deleted_before_the_workers_read_it_is_the_pairs_error(
    tmp_path: Path, dask_cluster: DaskCluster
) -> None:
    """A Dask worker reads the data dir's arrays as this process does: a chunk file missing from an array written
    with every chunk is the pair's error naming it, never the fill value's zeros (which would fail the pair)."""
    for side in ("ref", "cand"):
        (tmp_path / side).mkdir()
        tensor = torch.ones((1024, 1024))
        tensor[0, 0] = 2.0 if side == "ref" else 2.0000002  # stored apart, within the tolerance
        torch.save(tensor, tmp_path / side / "0_query.pth")
    data = tmp_path / "data"
    services = open_services(Settings(data_dir=data, demo=False, dask_scheduler=dask_cluster.address))
    try:
        for label in ("ref", "cand"):
            path = tmp_path / label
            session_id = services.ingestor.ingest("gone", label, [InputFile(path, path.name)]).session_id
        chunk = sorted((data / "arrays" / "runs").glob("*/0/c.3.0"))[0]  # rows 768 to 1023 of the first run's
        chunk.unlink()
        services.plan(session_id)
        before = services.store.chunk_reads
        services.compute(session_id)
        assert services.store.chunk_reads == before  # read by a worker, not here
        with services.sessions() as db:
            (pair,) = session_pairs(db, session_id).pairs
    finally:
        services.close()
    assert pair.status == "error", pair
    assert pair.error is not None and f"the stored chunk file {chunk} of tensor 0_query in run " in pair.error
    assert pair.error.endswith("is missing: the data dir is damaged")
