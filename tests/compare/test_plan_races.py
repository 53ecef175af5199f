"""Verdicts given while the session is planned again never land on another pair than the one they judge (before
pair ids were kept across plans and never reused, SQLite gave a planned-away pair's id to another pair, which then
carried its verdict)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text
from tensor_debugger.compare.planning.plan import plan_session
from tensor_debugger.compare.reports.pair_reports import session_pairs
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services

from tests.support.dumps import layered_dump


@pytest.mark.parametrize("moment", ["refresh", "computation"])
def test_a_verdict_read_before_a_replan_never_lands_on_the_pair_that_reuses_its_id(
    services: Services, tmp_path: Path, moment: str
) -> None:
    """An upload of three runs whose third run (c2, diverging from layer 0) is ready before the second (c1, from
    layer 2): the plan made then gives c2's pairs the ids that the next plan gives c1's. The second plan runs
    between the reading of c2's pairs and the writing of their failing verdicts: by the refresh after the first
    plan (the verdicts cached by an earlier session of the same tensors), or by the computation of c2's pairs.
    The stale write gave c1's first pairs c2's verdicts (c1's first divergence 0_attn, not 2_attn)."""
    runs = {name: layered_dump(tmp_path / name, bug) for name, bug in (("ref", None), ("c1", 2), ("c2", 0))}

    def inputs(name: str) -> list[InputFile]:
        return [InputFile(p, f"{name}/{p.name}") for p in sorted(runs[name].iterdir())]

    if moment == "refresh":  # an earlier session of the same tensors: every verdict is cached
        for name in ("ref", "c1", "c2"):
            services.ingestor.ingest("earlier", name, inputs(name), reuse=False)
        earlier = services.ingestor.begin("earlier", "unused", [], create_session=False).session_id
        plan_session(services.context, earlier)
        services.compute(earlier)

    pending = {name: services.ingestor.begin("upload", name, [name]) for name in ("ref", "c1", "c2")}
    session_id = pending["ref"].session_id
    services.ingestor.complete(pending["ref"], inputs("ref"))
    services.ingestor.complete(pending["c2"], inputs("c2"))

    def c1_ready() -> None:  # what the other ingest thread of the server does: c1 is stored, the session planned
        services.ingestor.complete(pending["c1"], inputs("c1"))
        plan_session(services.context, session_id)

    other = threading.Thread(target=c1_ready)
    armed = [True]
    writing = "UPDATE pairs SET" if moment == "refresh" else "INSERT INTO comparison_results"

    def interleave(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not (armed[0] and statement.startswith(writing)):
            return
        armed[0] = False  # the first verdicts of c2's pairs are about to be written
        other.start()
        if not conn.connection.dbapi_connection.in_transaction:  # it holds no lock: the replan goes first
            other.join()

    if moment == "computation":
        plan_session(services.context, session_id)  # with ref and c2 ready: c2's pairs wait for their computation
    event.listen(services.engine, "before_cursor_execute", interleave)
    try:
        if moment == "refresh":
            plan_session(services.context, session_id)  # with ref and c2 ready: verdicts from the cache
        else:
            services.compute(session_id)
    finally:
        event.remove(services.engine, "before_cursor_execute", interleave)
    assert not armed[0]
    other.join()
    services.compute(session_id)

    with services.sessions() as db:
        report = session_pairs(db, session_id)
    labels = {c.run_id: c.label for c in report.candidates}
    failing = {(labels[p.b.run_id], p.name) for p in report.pairs if p.status == "fail"}
    assert failing == {("c1", f"{k}_{s}") for k in (2, 3) for s in ("attn", "mlp")} | {
        ("c2", f"{k}_{s}") for k in range(4) for s in ("attn", "mlp")
    }
    assert [(c.label, c.first_divergence and c.first_divergence.name) for c in report.candidates] == [
        ("c1", "2_attn"),
        ("c2", "0_attn"),
    ]


def test_a_session_planned_again_is_never_seen_all_pending(services: Services, tmp_path: Path) -> None:
    """Planning a computed session again (a run's ingest ending after the other's, a rule changed back) remakes its
    pairs and gives them their cached verdicts in one transaction: a reader at any commit sees the verdicts, never
    the pairs pending in between (a waiting client saw the session done, then every pair pending)."""
    runs = {name: layered_dump(tmp_path / name, bug) for name, bug in (("ref", None), ("cand", 2))}
    for name in ("ref", "cand"):
        inputs = [InputFile(p, f"{name}/{p.name}") for p in sorted(runs[name].iterdir())]
        session_id = services.ingestor.ingest("again", name, inputs).session_id
    plan_session(services.context, session_id)
    services.compute(session_id)
    seen: list[set[str]] = []

    def read_committed(_: Any) -> None:  # what another connection reads once a transaction commits
        with services.engine.connect() as other:
            rows = other.execute(text("SELECT status FROM pairs WHERE session_id = :s"), {"s": session_id})
            seen.append({status for (status,) in rows})

    event.listen(services.context.sessions, "after_commit", read_committed)
    try:
        plan_session(services.context, session_id)
    finally:
        event.remove(services.context.sessions, "after_commit", read_committed)
    assert seen and all(statuses == {"pass", "fail"} for statuses in seen), seen
