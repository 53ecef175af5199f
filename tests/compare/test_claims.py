"""Pending pairs are claimed (store/claims.py): processes computing at once settle each pair once, and the pairs a
process held when it died are taken over once its lease expires. On SQLite and on PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from sqlalchemy import func, select
from tensor_debugger.compare.compute import pending as pending_pairs
from tensor_debugger.compare.context import CompareContext, open_context
from tensor_debugger.compare.planning.plan import plan_session
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services
from tensor_debugger.store.claims import Claims
from tensor_debugger.store.database import create_db_engine, make_sessionmaker
from tensor_debugger.store.models import PairRecord

from tests.support.dumps import seeded
from tests.support.polling import wait_until
from tests.support.postgres import DATABASES

PAIRS = 24
# leases short enough that waiting one out costs the tests little, long enough for a beat (a third of it) to come
# in time on a loaded machine; the product's default is 30 s (TENSOR_DEBUGGER_CLAIM_SECONDS)
LEASE = 1.2


def session_with_pairs(services: Services, tmp_path: Path) -> int:
    """A session of PAIRS pending pairs, every third failing."""
    for side in ("a", "b"):
        folder = tmp_path / side
        folder.mkdir()
        for i in range(PAIRS):
            tensor = seeded((32, 32), i)
            torch.save(tensor + 1.0 if side == "b" and i % 3 == 0 else tensor, folder / f"{i}_post_mlp.pth")
        session_id = services.ingestor.ingest("claimed", side, [InputFile(folder, side)]).session_id
    plan_session(services.context, session_id)
    return session_id


def statuses(services: Services, session_id: int) -> dict[str, int]:
    with services.sessions() as db:
        rows = db.execute(
            select(PairRecord.status, func.count()).where(PairRecord.session_id == session_id).group_by("status")
        )
        return {status: count for status, count in rows}


@pytest.mark.parametrize("database_url", DATABASES, indirect=True)
def test_two_processes_computing_at_once_settle_each_pair_once(
    services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id = session_with_pairs(services, tmp_path)
    monkeypatch.setattr(pending_pairs, "SETUP_BATCH", 4)  # many claims each, interleaved
    engines = [create_db_engine(services.settings.database_url) for _ in range(2)]
    computers = [open_context(make_sessionmaker(e), services.store, 1) for e in engines]
    assert computers[0].claims.owner != computers[1].claims.owner
    start = threading.Barrier(2)
    settled: list[int] = []

    def compute(context: CompareContext) -> None:
        start.wait()
        # a pause per batch settled, so that both are at work at once on this busy machine
        settled.append(pending_pairs.compute_pending(context, progress=lambda done, total: time.sleep(0.02)))

    threads = [threading.Thread(target=compute, args=(c,)) for c in computers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for comparisons, engine in zip(computers, engines, strict=True):
        comparisons.close()
        engine.dispose()
    assert sum(settled) == PAIRS  # without claims each would settle every pair it saw pending
    assert statuses(services, session_id) == {"pass": PAIRS - PAIRS // 3, "fail": PAIRS // 3}


CLAIM_AND_HANG = """
import sys, time
from tensor_debugger.store.claims import Claims
from tensor_debugger.store.database import create_db_engine, make_sessionmaker
claims = Claims(make_sessionmaker(create_db_engine(sys.argv[1])), float(sys.argv[3]))
print(len(claims.claim_pairs(int(sys.argv[2]), 1000)), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("database_url", DATABASES, indirect=True)
def test_the_pairs_of_a_process_that_died_are_taken_over_when_its_lease_expires(
    services: Services, tmp_path: Path
) -> None:
    session_id = session_with_pairs(services, tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", CLAIM_AND_HANG, services.settings.database_url, str(session_id), str(LEASE)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == str(PAIRS)
        with services.sessions() as db:  # what the other process holds, read from the rows (no clock involved)
            held = db.execute(select(PairRecord.claimed_by, PairRecord.claimed_until)).all()
        owners = {owner for owner, _ in held}
        assert len(held) == PAIRS and len(owners) == 1 and services.context.claims.owner not in owners
    finally:
        holder.kill()  # dies holding them: nothing gives them back
        holder.wait()
    # for one session, compute_pending waits for pairs others hold, and takes them over once their lease is out
    assert services.compute(session_id) == PAIRS
    assert time.time() >= max(until for _, until in held)
    assert statuses(services, session_id) == {"pass": PAIRS - PAIRS // 3, "fail": PAIRS // 3}


@pytest.mark.parametrize("database_url", DATABASES, indirect=True)
def test_a_heartbeat_keeps_claims_and_release_gives_them_back(services: Services, tmp_path: Path) -> None:
    session_id = session_with_pairs(services, tmp_path)
    mine = Claims(services.sessions, LEASE)
    other = Claims(services.sessions, LEASE)
    assert len(mine.claim_pairs(session_id, 10)) == 10
    first_until = held_until(services, mine.owner)
    mine.start()
    try:
        # renewed on the beat (read from the rows, so however late the beat comes on a loaded machine) ...
        wait_until(lambda: held_until(services, mine.owner) > first_until, what="the heartbeat renewing the claims")
        wait_until(lambda: time.time() > first_until, what="the first lease running out")
        # ... so past the first lease they are still held
        assert len(other.claim_pairs(session_id, 1000)) == PAIRS - 10
    finally:
        mine.stop()
    mine.release_pairs()
    assert len(other.claim_pairs(session_id, 1000)) == 10


def held_until(services: Services, owner: str) -> float:
    """When the earliest of `owner`'s claims on pairs runs out (Unix seconds)."""
    with services.sessions() as db:
        until = db.scalar(select(func.min(PairRecord.claimed_until)).where(PairRecord.claimed_by == owner))
    assert until is not None
    return float(until)
