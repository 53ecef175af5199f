"""The sessions list's figures (`store/catalog.summarize_sessions`: counts of the pairs' rows) for the sessions that
hold a rerun (role "noise": `compare --noise`, `capture(role="noise")`, find_divergence's precision floor): their
rows carry the tolerances' verdicts, while their pages judge by the noise rule (`pair_reports.judge_by_noise`). The
failing pairs and the first divergence of such a session are the page's; the others' rows stand as they are. Each
such session costs one report of its pairs (as its page does)."""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.reports.pair_reports import session_pairs
from tensor_debugger.compare.reports.pair_rows import StatsCache
from tensor_debugger.store.catalog import SessionSummary
from tensor_debugger.store.models import RunRecord


def judged_summaries(
    db: DbSession, summaries: dict[int, SessionSummary], cache: StatsCache | None = None
) -> dict[int, SessionSummary]:
    """`summaries` with each session that holds a rerun given its page's failing count and first divergence."""
    with_rerun = set(
        db.scalars(
            select(RunRecord.session_id).where(RunRecord.session_id.in_(list(summaries)), RunRecord.role == "noise")
        )
    )
    judged = dict(summaries)
    for session_id in with_rerun:
        report = session_pairs(db, session_id, cache=cache)
        first = report.first_divergence
        judged[session_id] = replace(
            summaries[session_id],
            failing=report.progress.failing,
            first_divergence=first.name if first is not None else None,
            first_pair=first.pair_id if first is not None else None,
        )
    return judged
