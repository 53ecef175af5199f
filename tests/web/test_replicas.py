"""Two `serve` processes on one PostgreSQL database and one array store serve the same sessions: what is uploaded
to one is seen, compared and changed through the other, and each pending pair is computed once, by whichever
replica claims it (store/claims.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from tensor_debugger.demo.synthetic import Plant, write_dump
from tensor_debugger.store.database import create_db_engine, make_sessionmaker
from tensor_debugger.store.models import PairRecord

from tests.support import loopback_http as http
from tests.support.dumps import make_zip
from tests.support.polling import wait_until
from tests.support.postgres import PostgresCluster
from tests.support.servers import LiveServer, free_port, upload, wait_done

CLAIM_SECONDS = "3"  # leases renewed every second: the heartbeat runs during the test


@pytest.fixture
def replicas(tmp_path: Path, postgres: PostgresCluster) -> Iterator[tuple[LiveServer, LiveServer]]:
    url = postgres.create_database("replicas")
    data = tmp_path / "data"
    data.mkdir()
    servers = [
        LiveServer(data, free_port(), database_url=url, env={"TENSOR_DEBUGGER_CLAIM_SECONDS": CLAIM_SECONDS})
        for _ in range(2)
    ]
    for server in servers:
        server.launch()  # both start at once: recovery on start-up must not take the other's work for dead
    try:
        for server in servers:
            wait_until(server.answers, what=f"the replica on port {server.port} to answer", timeout=60, interval=0.1)
        yield servers[0], servers[1]
    finally:
        for server in servers:
            server.stop()


def test_an_upload_to_one_replica_is_served_and_changed_through_the_other(
    replicas: tuple[LiveServer, LiveServer], tmp_path: Path
) -> None:
    one, other = replicas
    write_dump(tmp_path / "ref", layers=3, seed=5)
    write_dump(tmp_path / "cand", layers=3, seed=5, plant=Plant(2, "post_mlp", (1, 2), 0.25))
    files = [("reference", make_zip(tmp_path / "ref", tmp_path / "ref.zip"))]
    files.append(("candidate", make_zip(tmp_path / "cand", tmp_path / "cand.zip")))
    created = upload(one, "replicated", files)
    assert created.status_code == 201, created.text
    session_id = created.json()["session"]["id"]

    report = wait_done(other, session_id)
    assert report["first_divergence"]["name"] == "2_post_mlp"
    assert wait_done(one, session_id) == report
    pair = next(p for p in report["pairs"] if p["name"] == "2_post_mlp")
    sliced = http.get(
        f"{other.url}/api/pairs/{pair['id']}/slice", params={"index": "1,:", "start": "0", "count": "8"}, timeout=30
    )
    assert sliced.status_code == 200, sliced.text  # the arrays one wrote, read by the other
    assert http.get(f"{other.url}/sessions/{session_id}", timeout=30).status_code == 200

    renamed = http.patch(f"{other.url}/api/sessions/{session_id}", json={"name": "renamed on the other"})
    assert renamed.status_code == 200, renamed.text
    assert http.get(f"{one.url}/api/sessions/{session_id}").json()["name"] == "renamed on the other"
    loose = http.patch(f"{one.url}/api/sessions/{session_id}", json={"rtol": 0, "atol": 1.0})
    assert loose.status_code == 200, loose.text
    assert wait_done(other, session_id)["first_divergence"] is None  # recomputed by whichever claimed the pairs

    engine = create_db_engine(one.database_url)
    try:
        with make_sessionmaker(engine)() as db:
            pairs = db.scalars(select(PairRecord).where(PairRecord.session_id == session_id)).all()
            assert pairs and {p.status for p in pairs} == {"pass"}
            assert all(p.claimed_by is None for p in pairs)  # settled pairs hold no claim
    finally:
        engine.dispose()
    assert http.delete(f"{other.url}/api/sessions/{session_id}").status_code == 204
    assert http.get(f"{one.url}/api/sessions/{session_id}").status_code == 404
    assert one.alive() and other.alive()
