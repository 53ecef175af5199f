"""Pending pairs computed by Dask workers on the cluster's stack, as processes on this machine: PostgreSQL, arrays in
S3 (a SeaweedFS server) and a `dask scheduler` with two `dask worker` processes (the run's: tests/conftest.py). The
workers fetch the chunk objects from the bucket themselves, and what they compute is what this process computes on
the same session."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import obstore
from sqlalchemy import delete, update
from tensor_debugger.compare.reports.pair_reports import session_pairs
from tensor_debugger.demo.synthetic import DumpShape, Plant, write_dump
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import ComparisonResultRecord, PairRecord

from tests.support.dask_cluster import DaskCluster
from tests.support.postgres import PostgresCluster
from tests.support.s3 import SeaweedS3

# tensors of 640 x 512 float32 (1.25 MiB): two chunk objects each (1 MiB and a short one), so that a pair's
# statistics are fetched from several objects per side
SHAPE = DumpShape(tokens=640, heads=4, head_dim=128)
PLANT = Plant(layer=1, stage="post_attn", index=(300, 7), offset=0.5)


def report(services: Services, session_id: int) -> dict[str, Any]:
    """The session's pairs (their verdicts and statistics) and first divergence, as the API would give them."""
    with services.sessions() as db:
        found = session_pairs(db, session_id)
    assert found.pairs
    first = None if found.first_divergence is None else dataclasses.asdict(found.first_divergence)
    return {"pairs": [dataclasses.asdict(p) for p in found.pairs], "first": first}


def worker_reads(dask_cluster: DaskCluster, store_url: str) -> dict[str, int]:
    """The chunks each Dask worker process has read from the store at `store_url`, by worker address: what the
    stores of the contexts the workers opened for it (compare/compute/dask_workers.py) counted."""
    from distributed import Client

    def reads() -> int:
        from tensor_debugger.compare.compute import dask_workers

        return sum(c.store.chunk_reads for s, c in dask_workers._opened.items() if s.store_url == store_url)

    with Client(dask_cluster.address, timeout=10, set_as_default=False) as client:  # type: ignore[no-untyped-call]
        counted: dict[str, int] = client.run(reads)
    return counted


def test_dask_workers_fetch_the_chunk_objects_and_compute_what_this_process_does(
    tmp_path: Path, postgres: PostgresCluster, s3: SeaweedS3, dask_cluster: DaskCluster
) -> None:
    write_dump(tmp_path / "ref", layers=2, seed=4, shape=SHAPE)
    write_dump(tmp_path / "cand", layers=2, seed=4, plant=PLANT, shape=SHAPE)
    store_url = s3.new_url()
    settings = Settings(
        data_dir=tmp_path / "data",
        demo=False,
        database_url=postgres.create_database(),
        store_url=store_url,
        dask_scheduler=dask_cluster.address,
    )
    on_dask = open_services(settings, s3.environ)
    try:
        for label in ("ref", "cand"):
            path = tmp_path / label
            session_id = on_dask.ingestor.ingest("dask on s3", label, [InputFile(path, label)]).session_id
        on_dask.plan(session_id)
        objects = [item["path"] for item in obstore.list(s3.bucket(store_url), prefix="runs/").collect()]
        chunk_objects = sum("/c/" in path for path in objects)
        workers_before = worker_reads(dask_cluster, store_url)
        read_here = on_dask.store.chunk_reads
        settled = on_dask.compute(session_id)
        read_here = on_dask.store.chunk_reads - read_here
        by_workers = report(on_dask, session_id)
        workers_after = worker_reads(dask_cluster, store_url)
    finally:
        on_dask.close()
    assert settled == len(by_workers["pairs"])
    assert read_here == 0  # this process fetched no chunk object: none of their bytes went from here to a worker
    fetched = {w: workers_after[w] - workers_before.get(w, 0) for w in workers_after}

    # the same session computed again, in this process: its results forgotten, every pair pending once more
    here = open_services(dataclasses.replace(settings, dask_scheduler=""), s3.environ)
    try:
        with here.sessions.begin() as db:
            db.execute(update(PairRecord).values(result_id=None, status="pending"))
            db.execute(delete(ComparisonResultRecord))
        assert {p["status"] for p in report(here, session_id)["pairs"]} == {"pending"}
        read_before = here.store.chunk_reads
        assert here.compute(session_id) == settled
        in_process = report(here, session_id)
        read_in_process = here.store.chunk_reads - read_before
    finally:
        here.close()

    assert by_workers == in_process  # verdicts, statistics (worst elements, where) and the first divergence
    assert by_workers["first"]["name"] == "1_post_attn" and by_workers["first"]["where"][0]["ranges"] == [[300, 300]]
    statuses = [p["status"] for p in by_workers["pairs"]]
    assert statuses.count("fail") >= 1 and statuses.count("pass") >= 1
    # the workers read every chunk the computation here read, from the bucket: every chunk object ingest put there
    assert sum(fetched.values()) == read_in_process >= chunk_objects >= 2 * len(statuses), (fetched, chunk_objects)
