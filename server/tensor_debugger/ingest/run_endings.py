"""The transactions that end a run's ingest: the run made "ready" with its rows (`finish`), or as a copy of a ready
run of the same inputs (`reuse`), kept as "failed" with its problems (`fail`), or removed (`abandon`). Each first
renews the claim its ingest holds on the run (`hold`), so that a run another process took over is never ended here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from tensor_debugger.errors import CaptureNote, FileProblem, NotATensor
from tensor_debugger.ingest.fingerprints import Fingerprint
from tensor_debugger.ingest.inputs import RunTrace
from tensor_debugger.ingest.outcomes import TakenOver
from tensor_debugger.ingest.run_copy import delete_arrays
from tensor_debugger.ingest.run_rows import problem_rows, summary_row, tensor_rows
from tensor_debugger.ingest.stored import Stored
from tensor_debugger.ingest.traces import ModuleTree
from tensor_debugger.store.arrays import ArrayStore, run_prefix
from tensor_debugger.store.claims import Claims
from tensor_debugger.store.compared_against import forget
from tensor_debugger.store.database import lock_arrays
from tensor_debugger.store.models import ProblemRecord, RunRecord, SessionRecord, TensorRecord

_ROWS_PER_FLUSH = 512  # tensor rows inserted per flush of a run's one transaction


@dataclass(frozen=True)
class Reused:
    """A run made a copy of a ready run of the same inputs: how many tensor rows, its problems, and which run."""

    tensors: int
    problems: list[FileProblem]
    source_run_id: int


class RunEndings:
    def __init__(self, sessions: sessionmaker[DbSession], store: ArrayStore, claims: Claims) -> None:
        self.sessions = sessions
        self.store = store
        self.claims = claims

    def reuse(self, run_id: int, owner: str, fingerprint: Fingerprint) -> Reused | None:
        """Make the run a copy of the newest ready run ingested from the same fingerprint, in one transaction:
        its tensor rows (naming the same arrays) and problems. None when there is no such run."""
        with self.sessions.begin() as db:
            self.hold(db, run_id, owner)
            run = db.get_one(RunRecord, run_id)
            # Written first, so the transaction holds SQLite's write lock before it reads (pysqlite begins one
            # at the first write): a session deleted meanwhile is either gone here or waits for this commit,
            # when its deletion sees these rows and keeps the arrays they name.
            run.input_fingerprint, run.input_key = fingerprint.data, fingerprint.key
            db.flush()
            source = db.scalar(
                select(RunRecord)
                .where(RunRecord.input_key == fingerprint.key, RunRecord.status == "ready", RunRecord.id < run_id)
                .order_by(RunRecord.id.desc())
                .limit(1)
            )
            if source is None or source.input_fingerprint != fingerprint.data:
                return None
            skipped = {"id", "run_id"}
            rows = []
            for tensor in db.scalars(
                select(TensorRecord).where(TensorRecord.run_id == source.id).order_by(TensorRecord.position)
            ):
                row = {c.key: getattr(tensor, c.key) for c in TensorRecord.__table__.columns if c.key not in skipped}
                if not tensor.has_values:
                    row["digest"] = f"none:{uuid.uuid4().hex}"  # summaries never share cached results
                rows.append({**row, "run_id": run_id})
            if rows:  # every row with every column (as read), None as NULL: one batch
                db.execute(insert(TensorRecord).execution_options(render_nulls=True), rows)
            problems = [
                (CaptureNote if p.note else NotATensor if p.ignored else FileProblem)(p.file, p.reason)
                for p in source.problems
            ]
            _insert_problems(db, run_id, problems)
            run.status = "ready"
            run.ingest_pid = None
            run.staged_inputs = None
            run.tensor_count = source.tensor_count
            run.total_bytes = source.total_bytes
            run.module_tree = source.module_tree
            reused_from = source.id
        return Reused(len(rows), problems, reused_from)

    def finish(
        self,
        run_id: int,
        stored: list[Stored],
        problems: list[FileProblem],
        traces: list[RunTrace],
        fingerprint: Fingerprint | None = None,
        owner: str = "",
    ) -> None:
        problems.extend(CaptureNote(t.label, note) for t in traces for note in t.trace.notes)  # a capture's notes
        with self.sessions.begin() as db:
            self.hold(db, run_id, owner)
            # every row with every column, None as NULL (none of the columns a row leaves None has a default):
            # the rows' INSERT goes in one batch, not one per run of rows that leave out the same columns (an op's
            # rows have a source, a module's not: 209 batches for a GPT-2 summary capture's 879 rows), nor one a
            # row as ORM objects' did (their ids RETURNING, which SQLite keeps in no order: 32 for 32 tensors)
            rows_at_once = insert(TensorRecord).execution_options(render_nulls=True)
            rows = tensor_rows(run_id, stored, problems)
            for start in range(0, len(rows), _ROWS_PER_FLUSH):  # in one transaction, all or nothing
                # a batch holds its rows' JSON as text at once: 4,096 kept summaries in one, 20 MB more peak
                db.execute(rows_at_once, rows[start : start + _ROWS_PER_FLUSH])
            db.flush()  # SQLite's write lock is held from here: the arrays found below cannot be deleted meanwhile
            lock_arrays(db)  # nor, on PostgreSQL, by a deletion holding this lock
            self._share_identical(db, run_id, rows)
            position = len(stored)
            summaries = []
            for run_trace in traces:
                if run_trace.trace.has_values:
                    continue
                for traced in run_trace.trace.tensors:
                    summaries.append(summary_row(run_id, position, run_trace, traced))
                    position += 1
            for start in range(0, len(summaries), _ROWS_PER_FLUSH):
                db.execute(rows_at_once, summaries[start : start + _ROWS_PER_FLUSH])
            _insert_problems(db, run_id, problems)
            run = db.get_one(RunRecord, run_id)
            run.status = "ready"
            run.ingest_pid = None
            run.staged_inputs = None
            run.tensor_count = position
            run.total_bytes = sum(t.nbytes for _, _, t in stored)
            if fingerprint is not None:
                run.input_fingerprint, run.input_key = fingerprint.data, fingerprint.key
            if traces:
                # a capture of some modules only says so: pairing leaves out what it did not ask for
                scope = traces[0].trace.scope if len(traces) == 1 else None
                tree = ModuleTree(
                    tuple(c for t in traces for c in t.trace.root.calls()),
                    all(t.trace.has_values for t in traces),
                    scope,
                )
                run.module_tree = tree.to_json()

    def _share_identical(self, db: DbSession, run_id: int, rows: list[dict[str, Any]]) -> None:
        """Point each of the run's tensor `rows` (inserted) bit-identical to a tensor another ready run stored (older
        or not: runs ingested at once are ready in any order), or an earlier one of this run, at that array, and
        delete the copy just written (one UPDATE of many rows). Done before the commit: should it fail, the run is
        removed all the same."""
        digests = sorted({r["digest"] for r in rows})
        found: dict[str, str] = {}
        for start in range(0, len(digests), 500):
            for digest, key in db.execute(
                select(TensorRecord.digest, TensorRecord.store_key).where(
                    TensorRecord.digest.in_(digests[start : start + 500]),
                    TensorRecord.run_id != run_id,  # rows of committed runs only: those ingesting are not seen
                    TensorRecord.has_values,
                    TensorRecord.store_key != "",
                )
            ):
                found[digest] = key
        moved = []
        for row in rows:
            shared = found.setdefault(row["digest"], row["store_key"])  # the run's own repeats share too
            if shared != row["store_key"]:
                self.store.delete(row["store_key"])
                row["store_key"] = shared
                moved.append({"row_name": row["name"], "shared_key": shared})
        if moved:
            db.connection().execute(  # on the connection, one UPDATE of many rows (the ORM's wants their ids)
                update(TensorRecord)
                .where(TensorRecord.run_id == run_id, TensorRecord.name == bindparam("row_name"))
                .values(store_key=bindparam("shared_key")),
                moved,
            )

    def hold(self, db: DbSession, run_id: int, owner: str) -> None:
        """The first statement of a transaction that ends a run: renews the claim `owner` holds on it (on
        PostgreSQL, the row stays locked until the commit, so no recovery takes it meanwhile); raises TakenOver
        when another process holds it (or the run is no longer "ingesting"). No `owner`: nothing is checked."""
        if not owner:
            return
        done = db.execute(
            update(RunRecord)
            .where(RunRecord.id == run_id, RunRecord.claimed_by == owner, RunRecord.status == "ingesting")
            .values(claimed_until=self.claims.until())
            .execution_options(synchronize_session=False)
        )
        if not done.rowcount:  # type: ignore[attr-defined]
            holder = db.scalar(select(RunRecord.claimed_by).where(RunRecord.id == run_id))
            if holder is not None and holder != owner:  # a run deleted meanwhile is ended as before
                raise TakenOver(f"run {run_id} is no longer this process's to ingest")

    def fail(self, run_id: int, problems: list[FileProblem], owner: str = "") -> None:
        """Keep the run as "failed" with every problem and no arrays: the record of why nothing was stored."""
        with self.sessions.begin() as db:
            self.hold(db, run_id, owner)
            delete_arrays(self.store, run_prefix(run_id))
            run = db.get(RunRecord, run_id)
            if run is None:
                return
            _insert_problems(db, run_id, problems)
            run.status = "failed"
            run.ingest_pid = None
            run.staged_inputs = None
            run.tensor_count = 0
            run.total_bytes = 0

    def abandon(self, run_id: int, created_session_id: int | None, owner: str = "") -> None:
        with self.sessions.begin() as db:
            self.hold(db, run_id, owner)
            delete_arrays(self.store, run_prefix(run_id))
            run = db.get(RunRecord, run_id)
            if run is not None:
                forget(db, run.id)
                db.delete(run)
            db.flush()
            if created_session_id is not None:
                remaining = db.scalar(select(func.count()).where(RunRecord.session_id == created_session_id))
                session = db.get(SessionRecord, created_session_id)
                if session is not None and not remaining:
                    db.delete(session)


def _insert_problems(db: DbSession, run_id: int, problems: list[FileProblem]) -> None:
    """The run's problems in one INSERT of many rows (ORM objects went in one a row: their ids RETURNING, which
    SQLite keeps in no order)."""
    if problems:
        db.execute(insert(ProblemRecord), problem_rows(run_id, problems))
