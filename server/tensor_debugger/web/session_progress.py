"""How far a session has come: each run's ingest (waiting, unpacking, bytes copied, planning, ready or
failed), then its pairs being compared. One shape for the session page and GET /api/sessions/{id}/progress,
whose script polls it to keep the page live until everything is done."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.ingest.queue import IngestQueue
from tensor_debugger.store.models import PairRecord, SessionRecord

MB = 1_000_000  # the unit the page counts ingests in, as the CLI's progress bar does


@dataclass(frozen=True)
class RunProgress:
    id: int
    label: str
    role: str
    status: str  # the row's: "ingesting", "ready" or "failed"
    stage: str  # "queued", "unpacking", "copying", "planning" (live, this process); else the status
    bytes_done: int | None  # of the run's tensor files, once unpacked; None when not known here
    bytes_total: int | None
    problems: int

    @property
    def percent(self) -> int | None:
        if self.bytes_total is None or self.bytes_done is None:
            return None
        return 100 if not self.bytes_total else min(100, self.bytes_done * 100 // self.bytes_total)

    @property
    def words(self) -> str:
        if self.stage == "queued":
            return "waiting: another upload is being ingested"
        if self.stage == "unpacking":
            return "ingesting: unpacking the uploaded files"
        if self.stage == "copying" and self.bytes_total is not None and self.bytes_done is not None:
            return (f"ingesting: {self.bytes_done / MB:.1f} of {self.bytes_total / MB:.1f} MB "
                    f"({self.percent}%)")
        if self.stage == "planning":
            return "ingested; planning: pairing its tensors with the other runs'"
        if self.status == "ingesting":
            return "ingesting (by another process)"
        if self.status == "failed":
            return "failed: nothing usable was found"
        return "ready"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "label": self.label, "role": self.role, "status": self.status, "stage": self.stage,
                "bytes_done": self.bytes_done, "bytes_total": self.bytes_total, "percent": self.percent,
                "problems": self.problems, "words": self.words}


@dataclass(frozen=True)
class PairCounts:
    total: int
    done: int
    failing: int

    @property
    def pending(self) -> int:
        return self.total - self.done


@dataclass(frozen=True)
class SessionProgress:
    session_id: int
    runs: list[RunProgress]
    pairs: PairCounts

    @property
    def stage(self) -> str:
        """"ingesting" while any run is, then "planning", "comparing" while pairs are pending, then "done"."""
        stages = {r.stage for r in self.runs}
        if stages & {"queued", "unpacking", "copying", "ingesting"}:
            return "ingesting"
        if "planning" in stages:
            return "planning"
        return "comparing" if self.pairs.pending else "done"

    @property
    def signature(self) -> str:
        """Changes whenever the page shows something new besides the moving figures of an ingest: the page's
        script fetches the page again then."""
        runs = ",".join(f"{r.id}:{r.stage if r.stage in ('queued', 'planning') else r.status}" for r in self.runs)
        return f"{self.stage}|{runs}|{self.pairs.done}/{self.pairs.total}"

    def to_json(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "stage": self.stage, "signature": self.signature,
                "runs": [r.to_json() for r in self.runs],
                "pairs": {"total": self.pairs.total, "done": self.pairs.done, "pending": self.pairs.pending,
                          "failing": self.pairs.failing}}


def pair_counts(db: DbSession, session_id: int) -> PairCounts:
    rows = db.execute(select(PairRecord.status, func.count()).where(PairRecord.session_id == session_id)
                      .group_by(PairRecord.status)).all()
    counts = {status: n for status, n in rows}
    total = sum(counts.values())
    return PairCounts(total, total - counts.get("pending", 0), counts.get("fail", 0))


def session_progress(session: SessionRecord, ingests: IngestQueue, pairs: PairCounts) -> SessionProgress:
    """`session` with its runs and their problems loaded (catalog.get_session)."""
    runs = []
    for run in session.runs:
        live = ingests.progress(run.id)
        if live is not None:
            known = live.stage == "copying" or run.status != "ingesting"
            done = live.bytes_done if known else None
            total = live.bytes_total if known else None
            runs.append(RunProgress(run.id, run.label, run.role, run.status, live.stage, done, total,
                                    len(run.problems)))
        else:
            size = run.total_bytes if run.status == "ready" else None
            runs.append(RunProgress(run.id, run.label, run.role, run.status, run.status, size, size,
                                    len(run.problems)))
    return SessionProgress(session.id, runs, pairs)
