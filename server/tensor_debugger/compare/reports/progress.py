"""How far a session has come: each run's ingest (waiting, unpacking, bytes copied, planning, ready or
failed), then its pairs being compared. One report for the session page and GET /api/sessions/{id}/progress,
whose script polls it to keep the page live until everything is done."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import func, select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.compute.early_uploads import EarlyFigures, EarlyPair
from tensor_debugger.compare.reports.compare_report import ReadOnce
from tensor_debugger.engine.op_alignment import out_of_step
from tensor_debugger.store.models import PairRecord, RunRecord, SessionRecord, TensorRecord
from tensor_debugger.store.reports import RunRole, RunStatus, RunWithProblems, problem_reports, run_fields

if TYPE_CHECKING:  # a server's queue: the CLI's reports import none of the ingest children's machinery
    from tensor_debugger.ingest.queue import IngestProgress, IngestQueue

MB = 1_000_000  # the unit the page counts ingests in, as the CLI's progress bar does


class RunStage(enum.StrEnum):
    """Where a run's ingest is: the live stages of this process's queue, else the run's status."""

    QUEUED = "queued"
    UNPACKING = "unpacking"
    COPYING = "copying"
    PLANNING = "planning"
    WAITING = "waiting"  # its ingest met an outage (the database or the array store did not answer): tried again
    INGESTING = "ingesting"  # by another process
    READY = "ready"
    FAILED = "failed"


class SessionStage(enum.StrEnum):
    INGESTING = "ingesting"
    PLANNING = "planning"
    COMPARING = "comparing"
    DONE = "done"


@dataclass(frozen=True)
class IngestReport:
    """The live figures of a run this server is ingesting."""

    stage: RunStage
    bytes_done: int
    bytes_total: int


@dataclass(frozen=True)
class RunDetail(RunWithProblems):
    """A run with its problems and, while this server ingests it, its ingest's figures."""

    ingest: IngestReport | None


def run_detail(run: RunRecord, ingests: IngestQueue) -> RunDetail:
    live = ingests.progress(run.id)
    figures = None if live is None else IngestReport(RunStage(live.stage), live.bytes_done, live.bytes_total)
    return RunDetail(*run_fields(run), problem_reports(run.problems), figures)


@dataclass(frozen=True)
class RunProgress:
    id: int
    label: str
    role: RunRole
    status: RunStatus  # the row's
    stage: RunStage  # "queued", "unpacking", "copying", "planning" (live, this process); else the status
    bytes_done: int | None  # of the run's tensor files, once unpacked; None when not known here
    bytes_total: int | None
    percent: int | None
    problems: int
    words: str  # the stage in words, as the page shows it


def _percent(done: int | None, total: int | None) -> int | None:
    if total is None or done is None:
        return None
    return 100 if not total else min(100, done * 100 // total)


def _words(run: RunRecord, stage: RunStage, done: int | None, total: int | None, live: IngestProgress | None) -> str:
    status = RunStatus(run.status)
    if stage == RunStage.WAITING and live is not None:
        return f"waiting to be ingested again: {live.waiting_for}"
    if stage == RunStage.QUEUED:
        return "waiting: another upload is being ingested"
    if stage == RunStage.UNPACKING:
        return "ingesting: unpacking the uploaded files"
    if stage == RunStage.COPYING and total is not None and done is not None:
        return f"ingesting: {done / MB:.1f} of {total / MB:.1f} MB ({_percent(done, total)}%)"
    if stage == RunStage.PLANNING:
        return "ingested; planning: pairing its tensors with the other runs'"
    if status == RunStatus.INGESTING:
        return "ingesting (by another process)"
    if status == RunStatus.FAILED:
        why = next((p.reason for p in run.problems if not p.ignored), None) or "nothing usable was found"
        return f"failed: {why}"
    return "ready"


def run_progress(run: RunRecord, live: IngestProgress | None) -> RunProgress:
    """`run` with its problems loaded; `live`: this process's figures of its ingest, if any."""
    status = RunStatus(run.status)
    if live is not None and status != RunStatus.FAILED:  # a failed run is done, even while its job winds down
        known = live.stage == RunStage.COPYING or status != RunStatus.INGESTING
        stage = RunStage(live.stage)
        done = live.bytes_done if known else None
        total = live.bytes_total if known else None
    else:
        stage = RunStage(run.status)
        done = total = run.total_bytes if status == RunStatus.READY else None
    return RunProgress(
        run.id,
        run.label,
        RunRole(run.role),
        status,
        stage,
        done,
        total,
        _percent(done, total),
        len(run.problems),
        _words(run, stage, done, total, live),
    )


@dataclass(frozen=True)
class PairProgress:
    """Pairs no longer pending (`done`) of all the session's pairs; `failing`: those that fail; `errors`: those
    whose comparison failed (counted in `done`, but never compared: the session's verdict is incomplete);
    `not_compared`: those whose two sides are not one value computed two ways (the session's coverage's
    `out_of_step`), counted in `done` but never in `failing`: not compared either."""

    total: int
    done: int
    pending: int
    failing: int
    errors: int = 0
    not_compared: int = 0

    @classmethod
    def of(cls, total: int, done: int, failing: int, errors: int = 0, not_compared: int = 0) -> PairProgress:
        return cls(total, done, total - done, failing, errors, not_compared)


@dataclass(frozen=True)
class EarlyPairs:
    """Pairs this server compared while their runs ingest, before the plan makes them pairs of the session (each
    then takes its result from the cache); `failing`: of them outside tolerance; `pairs`: the first 1000."""

    compared: int
    failing: int
    words: str  # as the page shows it; empty when none was
    pairs: list[EarlyPair]
    # an upload of a reference and a candidate (ingested at once): of its pairs compared so far, how many were
    # compared from the bytes as they were read for storing, and how many read back from the store, by why
    read_once: ReadOnce | None = None

    @classmethod
    def of(cls, figures: EarlyFigures | None) -> EarlyPairs:
        if figures is None or not figures.count.compared:
            return cls(0, 0, "", [])
        n, failing = figures.count.compared, figures.count.failed
        words = f"{n} pair{'s' if n != 1 else ''} compared while ingesting, {failing} outside tolerance"
        counts = figures.read_once
        read_once = None if counts is None else ReadOnce(counts.in_memory, counts.read_back)
        return cls(n, failing, words, list(figures.results), read_once)


@dataclass(frozen=True)
class SessionProgress:
    session_id: int
    stage: SessionStage  # "ingesting" while any run is, then "planning", "comparing" while pairs are pending, "done"
    signature: str  # changes whenever the page shows something new besides the moving figures of an ingest
    runs: list[RunProgress]
    pairs: PairProgress
    early: EarlyPairs  # while runs ingest: the pairs already compared
    # while pairs are pending: why none is being compared now (no Dask worker connected to the scheduler for
    # TENSOR_DEBUGGER_DASK_NO_WORKER_SECONDS), null while nothing keeps them, and again once a worker is back
    waiting_for: str | None = None


def _stage(runs: list[RunProgress], pairs: PairProgress) -> SessionStage:
    stages = {r.stage for r in runs}
    if stages & {RunStage.QUEUED, RunStage.UNPACKING, RunStage.COPYING, RunStage.WAITING, RunStage.INGESTING}:
        return SessionStage.INGESTING
    if RunStage.PLANNING in stages:
        return SessionStage.PLANNING
    return SessionStage.COMPARING if pairs.pending else SessionStage.DONE


def _signature(
    stage: SessionStage, runs: list[RunProgress], pairs: PairProgress, early: EarlyPairs, waiting: bool
) -> str:
    """The page's script fetches the page again when this changes."""
    marks = ",".join(
        f"{r.id}:{r.stage if r.stage in (RunStage.QUEUED, RunStage.PLANNING, RunStage.WAITING) else r.status}"
        for r in runs
    )
    return f"{stage}|{marks}|{pairs.done}/{pairs.total}|{early.compared}{'|waiting' if waiting else ''}"


def pair_progress(db: DbSession, session_id: int) -> PairProgress:
    rows = db.execute(
        select(PairRecord.status, func.count()).where(PairRecord.session_id == session_id).group_by(PairRecord.status)
    ).all()
    counts = {status: n for status, n in rows}
    total = sum(counts.values())
    off = _not_compared(db, session_id)
    return PairProgress.of(
        total,
        total - counts.get("pending", 0),
        counts.get("fail", 0) - sum(1 for status in off if status == "fail"),
        counts.get("error", 0),
        len(off),
    )


def _not_compared(db: DbSession, session_id: int) -> list[str]:
    """The statuses of the session's judged pairs of captured tensors whose two sides are not one value computed two
    ways (`engine/op_alignment.out_of_step`, as the session's report decides it: its coverage's `out_of_step`)."""
    p, t = PairRecord, TensorRecord
    pairs = db.execute(
        select(p.name, p.status, p.a_tensor_ids, p.b_tensor_ids).where(
            p.session_id == session_id, p.module_path.is_not(None), p.status.in_(("pass", "fail"))
        )
    ).all()
    ids = {ids[0] for pair in pairs for ids in (pair.a_tensor_ids, pair.b_tensor_ids) if ids}
    if not ids:
        return []
    sides = {row.id: (row.shape, row.dtype) for row in db.execute(select(t.id, t.shape, t.dtype).where(t.id.in_(ids)))}
    found = []
    for pair in pairs:
        a, b = sides.get(pair.a_tensor_ids[0]), sides.get(pair.b_tensor_ids[0])
        if a is not None and b is not None and out_of_step(pair.name, (a[0], b[0]), (a[1], b[1])):
            found.append(pair.status)
    return found


def session_progress(
    session: SessionRecord,
    live: Mapping[int, IngestProgress],
    pairs: PairProgress,
    early: EarlyFigures | None = None,
    waiting_for: str | None = None,
) -> SessionProgress:
    """`session` with its runs and their problems loaded (catalog.get_session); `live`: this process's ingests'
    figures (`IngestQueue.snapshot`), taken before `session` and `pairs` were read, so that a run that has just
    been planned is either still "planning" there or has its pairs in `pairs` (read the other way round, a page
    could find every run ready and no pairs, and say it is done); `early`: its pairs compared while its runs
    ingest (`EarlyUploads.figures`); `waiting_for`: why the process's pending pairs are not being computed now
    (`Computation.waiting_for`), said only while this session has some."""
    runs = [run_progress(run, live.get(run.id)) for run in session.runs]
    stage = _stage(runs, pairs)
    shown = EarlyPairs.of(early)
    why = waiting_for if pairs.pending else None
    signature = _signature(stage, runs, pairs, shown, why is not None)
    return SessionProgress(session.id, stage, signature, runs, pairs, shown, why)
