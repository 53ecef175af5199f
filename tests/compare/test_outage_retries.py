"""A comparison that meets an array store that does not answer is waited out, never judged: its pairs stay pending
(saying what they wait for), held for a backoff, and are computed once the store answers again, with the verdicts
of a comparison that met no outage. On a SeaweedFS server of the test's own, stopped and started again."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import select
from tensor_debugger.compare.planning.plan import plan_session
from tensor_debugger.demo.synthetic import Plant, write_dump
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.claims import OUTAGE_HOLDER
from tensor_debugger.store.models import PairRecord

from tests.support.s3 import QUICK_OUTAGE_RETRIES, QUICK_RETRIES, SeaweedS3


def statuses(services: Services, session_id: int) -> dict[str, tuple[str, str | None, str | None]]:
    with services.sessions() as db:
        pairs = db.scalars(select(PairRecord).where(PairRecord.session_id == session_id)).all()
        return {p.name: (p.status, p.error, p.claimed_by) for p in pairs}


def test_pairs_wait_out_a_store_outage_and_are_computed_once_it_ends(tmp_path: Path, own_s3: SeaweedS3) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        store_url=own_s3.new_url(),
        demo=False,
        workers=2,
        store_retry_seconds=QUICK_RETRIES,
        outage_retry_seconds=QUICK_OUTAGE_RETRIES,
    )
    services = open_services(settings, environ=own_s3.environ)
    try:
        write_dump(tmp_path / "ref", layers=2, seed=5)
        write_dump(tmp_path / "cand", layers=2, seed=5, plant=Plant(1, "post_attn", (2, 3), 0.5))
        reference = services.ingestor.ingest("outage", "ref", [InputFile(tmp_path / "ref", "ref")])
        services.ingestor.ingest("outage", "cand", [InputFile(tmp_path / "cand", "cand")])
        session_id = reference.session_id
        plan_session(services.context, session_id)

        own_s3.stop()

        def held() -> bool:
            return any(holder == OUTAGE_HOLDER for _, _, holder in statuses(services, session_id).values())

        # tried until the first pair is held for the outage (a fixed wait was either long or, loaded, too short)
        deadline = time.monotonic() + 120
        services.compute(session_id, should_stop=lambda: held() or time.monotonic() > deadline)
        during = statuses(services, session_id)
        assert during and all(status == "pending" for status, _, _ in during.values()), during
        waiting = [p for p in during.values() if p[2] == OUTAGE_HOLDER]
        assert waiting, during  # tried, held for a backoff: not "error", not a verdict
        assert all(
            (error or "").startswith("waiting to be tried again: the array store did not answer")
            for _, error, _ in waiting
        )

        own_s3.restart()
        services.compute(session_id)  # waits out the holds, then computes
        after = statuses(services, session_id)
        assert {status for status, _, _ in after.values()} <= {"pass", "fail"}, after
        assert all(error is None and claimed is None for _, error, claimed in after.values())
        failing = sorted(name for name, (status, _, _) in after.items() if status == "fail")
        assert failing[0] == "1_post_attn"
    finally:
        services.close()
