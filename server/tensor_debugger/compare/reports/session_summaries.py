"""The sessions list's figures (`store/catalog.summarize_sessions`: counts of the pairs' rows) for the sessions whose
rows are not their verdicts: those that hold a rerun (role "noise": `compare --noise`, `capture(role="noise")`,
find_divergence's precision floor), whose rows carry the tolerances' verdicts while their pages judge by the noise
rule (`pair_reports.judge_by_noise`); and those with a pair stored as a pass whose alignment cuts rows (a row
written before a pair whose alignment cut reference rows away was no pass: the report judges it again,
`engine/alignment.cut_verdict`). The failing pairs, the pairs not compared and the first divergence of such a
session are the page's; the others' rows stand as they are.

Old rows are judged again here, not rewritten by a migration: whether an alignment cut reference rows away takes
its steps and the reference's shard shapes (`engine/alignment.reference_cut`), a rule the report already applies
to every row it reads, which a migration would have to copy and freeze; and a row left as written changes nothing
the pages, the API and the CLI say, as they read it through the report.

Judging a session costs one report of its pairs (as its page does: milliseconds per hundred pairs). The figures of a
settled session (no pair pending, no run ingesting) are kept with the fingerprint of what they were judged from
(store/session_figures.py): a later list judges again only the sessions whose fingerprint changed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlalchemy import Text, cast, select
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from tensor_debugger.compare.reports.pair_reports import session_pairs
from tensor_debugger.compare.reports.pair_rows import StatsCache
from tensor_debugger.engine.alignment import stored_steps
from tensor_debugger.store.catalog import SessionSummary
from tensor_debugger.store.models import PairRecord, RunRecord
from tensor_debugger.store.session_figures import JudgedFigures, fingerprints, keep_figures, kept_figures

SETTLED_RUNS = ("ready", "failed")  # a run in another status may still change its session's figures


def judged_summaries(
    db: DbSession,
    summaries: dict[int, SessionSummary],
    cache: StatsCache | None = None,
    keep: sessionmaker[Any] | None = None,
) -> dict[int, SessionSummary]:
    """`summaries` with each session whose rows are not its verdicts (a rerun, `passes_that_cut`) given its page's
    failing count, pairs not compared and first divergence. `keep`: where to keep the figures judged for settled
    sessions (in a transaction of their own); None: nowhere."""
    runs = db.execute(
        select(RunRecord.session_id, RunRecord.role, RunRecord.status).where(RunRecord.session_id.in_(list(summaries)))
    ).all()
    to_judge = {sid for sid, role, _ in runs if role == "noise"} | passes_that_cut(db, list(summaries))
    unsettled = {sid for sid, _, status in runs if status not in SETTLED_RUNS}
    # the fingerprints before the reports: a change made while judging then shows as a fingerprint changed (judged
    # again on the next list), never as figures of the new state kept under the old state's fingerprint
    prints = fingerprints(db, sorted(to_judge))
    found = kept_figures(db, prints)
    to_keep: dict[int, tuple[str, JudgedFigures]] = {}
    for session_id in sorted(to_judge - set(found)):
        report = session_pairs(db, session_id, cache=cache)
        first = report.first_divergence
        found[session_id] = JudgedFigures(
            report.progress.failing,
            first.name if first is not None else None,
            first.pair_id if first is not None else None,
            len(report.coverage.not_compared),
        )
        if summaries[session_id].pending == 0 and session_id not in unsettled:
            to_keep[session_id] = (prints[session_id], found[session_id])
    if keep is not None:
        keep_figures(keep, to_keep)
    judged = dict(summaries)
    for session_id, figures in found.items():
        judged[session_id] = replace(
            summaries[session_id],
            failing=figures.failing,
            first_divergence=figures.first_divergence,
            first_pair=figures.first_pair,
            not_compared=figures.not_compared,
        )
    return judged


def passes_that_cut(db: DbSession, session_ids: list[int]) -> set[int]:
    """The sessions among `session_ids` with a pair stored as a pass whose alignment cuts reference rows (a
    `truncate` step of the reference's side; the report tells whether it cut rows away). Rows written since the
    rule hold `incomparable` for those; a candidate's padded rows cut away (a pass that stands) are not looked at."""
    if not session_ids:
        return set()
    rows = db.execute(
        select(PairRecord.session_id, PairRecord.alignment).where(
            PairRecord.session_id.in_(session_ids),
            PairRecord.status == "pass",
            cast(PairRecord.alignment, Text).contains('"truncate"'),  # the few rows read whole below
        )
    ).all()
    return {
        sid for sid, alignment in rows if any(s.side == "a" and s.kind == "truncate" for s in stored_steps(alignment))
    }
