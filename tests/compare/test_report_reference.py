"""The session report takes the reference run as planning does: a failed first run is not the reference, the next
run is; the report's coverage, unmatched tensors and candidates name that run, not the failed one."""

from __future__ import annotations

from pathlib import Path

import torch
from sqlalchemy import update
from tensor_debugger.compare.planning.hand_pairing import candidate_run
from tensor_debugger.compare.reports.contract import compare_report
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services
from tensor_debugger.store.models import RunRecord

from tests.support.sessions import computed


def test_a_failed_first_run_leaves_the_next_run_as_the_reference(services: Services, tmp_path: Path) -> None:
    torch.save({"x": torch.ones(3)}, tmp_path / "r.pt")
    torch.save({"x": torch.ones(3), "y": torch.ones(4)}, tmp_path / "a.pt")
    torch.save({"x": torch.ones(3)}, tmp_path / "b.pt")
    session_id = 0
    for label in ("r", "a", "b"):
        files = [InputFile(tmp_path / f"{label}.pt", f"{label}.pt")]
        session_id = services.ingestor.ingest("failed-first", label, files, reuse=False).session_id
    with services.sessions.begin() as db:  # the first upload failed; its run is kept, marked failed
        db.execute(update(RunRecord).where(RunRecord.label == "r").values(status="failed"))

    report = computed(services, session_id)
    assert [(p.name, str(p.status)) for p in report.pairs] == [("a.x", "pass")]
    # a's y has no partner in b: not compared, so no "no divergence"
    assert report.coverage.unmatched == ["a.y"]
    assert (report.coverage.reference_tensors, report.coverage.compared) == (2, 1)
    assert str(report.verdict) == "incomplete"
    assert [(c.label, c.against) for c in report.candidates] == [("b", "a")]
    cli = compare_report(session_id, "failed-first", "http://127.0.0.1/", report, [])
    assert (cli.unmatched.a, cli.unmatched.b) == (["a.y"], [])
    assert cli.verdict == "incomplete"
    with services.sessions() as db:  # a hand pairing's default candidate: b, not the reference a
        assert candidate_run(db, session_id, None).label == "b"
