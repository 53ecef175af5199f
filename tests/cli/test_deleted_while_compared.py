"""A `compare` whose session is deleted (as a server on the same data dir does on its API's DELETE) while it
computes: it says the session was deleted and that there is no verdict (exit 2), not that no tensor could be
paired. The deletion is made by the compare's own progress callback as its "compare" step begins, so it falls
between the ingest and the report every time."""

from __future__ import annotations

from pathlib import Path

import torch
from sqlalchemy import select
from tensor_debugger.cli.compare_output import compare_request
from tensor_debugger.compare.pipeline import compare_runs
from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.models import SessionRecord

from tests.support.dumps import seeded


def test_a_session_deleted_while_compared_has_no_verdict(services: Services, tmp_path: Path) -> None:
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
    for n in range(4):
        # names paired by a rule, not the same name: compared after the plan, not while they ingest, so the
        # compare step has pairs to compute
        tensor = seeded((64, 64), n)
        torch.save(tensor, tmp_path / "a" / f"{n}_query.pth")
        torch.save(tensor + (n == 2), tmp_path / "b" / f"{n}_Query.pth")
    name = "deleted while compared"
    steps: list[str] = []

    def progress(step: str, done: int, total: int) -> None:
        steps.append(step)
        if step == "compare" and steps.count("compare") == 1:
            with services.sessions() as db:
                session_id = db.scalar(select(SessionRecord.id).where(SessionRecord.name == name))
                assert session_id is not None
                catalog.delete_session(db, services.store, session_id)

    request = compare_request(tmp_path / "a", tmp_path / "b", name, None, None)
    outcome = compare_runs(services.ingestor, services.context, services.compute, request, "", progress=progress)
    assert "compare" in steps, steps
    assert outcome.exit_code == 2
    assert outcome.error == (
        f"session {name!r} was deleted while it was compared (a server's DELETE or its page's Delete): nothing of it "
        "is kept, and there is no verdict"
    )
    assert outcome.payload.verdict == "incomplete" and outcome.payload.pairs == []
