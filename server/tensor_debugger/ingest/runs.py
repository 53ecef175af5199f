"""Ingest: add one run to a session from files, archives and folders.

Lifecycle, so that nothing half-ingested is ever visible:
1. `begin` commits a run row with status "ingesting" and this process's id (the session too, if new);
2. `complete` copies every tensor into the array store under "runs/<run id>/" (run_copy.py);
3. one transaction inserts the tensor and problem rows and sets the status to "ready" (run_endings.py).
When nothing usable was found the run is deleted, or (`keep_failure`, for uploads whose request has returned)
kept as "failed" with its problems and no arrays, so the session page can say why: how an ingest that stops ends
its run is decided in one place, outcomes.py's `outcome_of`.
An ingest given the fingerprint of its inputs (`fingerprints.py`; `ingest` takes it) first looks for a ready run
with the same fingerprint: found, the new run's tensor and problem rows are copies of that run's, naming the same
arrays, and no file is read. Otherwise `RunEndings.finish` records the fingerprint, and any tensor bit-identical to
one an older run stored (the same digest) names that array and the copy just written is deleted. An array is thus
shared by every row that names it; `catalog.release_arrays` deletes it with the last.

An ingest that meets an outage (the database or the array store did not answer) raises IngestPostponed and leaves
the run "ingesting" for its caller to try again; an accepted upload's run names its staged files, so that another
process takes it over (`take_over`) when this one dies. Otherwise a run left "ingesting" by a process that died is
removed, arrays and all, by `recovery.recover`; the runs this process is ingesting right now, through any of its
Ingestors, are in `Ingestor.live_runs()` (live_runs.py), so its own recovery
never takes them for dead (a second `open_services` on the same data dir, say a capture beside a server).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import PurePosixPath
from typing import Any

from sqlalchemy import ScalarResult, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from tensor_debugger.engine.fused import Kernel
from tensor_debugger.errors import (
    ConflictError,
    FileProblem,
    IngestPostponed,
    InvalidInputError,
    NothingUsableError,
    SessionNameTaken,
    is_outage,
)
from tensor_debugger.ingest.archives import ArchiveLimits
from tensor_debugger.ingest.fingerprints import Fingerprint, fingerprint_inputs
from tensor_debugger.ingest.inputs import InputFile, RunTrace
from tensor_debugger.ingest.live_runs import LiveRuns
from tensor_debugger.ingest.outcomes import RunEnd, RunOutcome, outcome_of
from tensor_debugger.ingest.run_copy import ProgressCallback, RunCopy, delete_arrays
from tensor_debugger.ingest.run_endings import RunEndings
from tensor_debugger.ingest.staging import new_folder
from tensor_debugger.ingest.stored import Stored, StoredListener
from tensor_debugger.ingest.taps import RunTap
from tensor_debugger.settings import Settings
from tensor_debugger.store.arrays import ArrayStore, run_prefix
from tensor_debugger.store.catalog import parse_label
from tensor_debugger.store.claims import Claims
from tensor_debugger.store.compared_against import check_against, forget, run_labelled
from tensor_debugger.store.database import database_outage
from tensor_debugger.store.models import ArrayFolderRecord, RunRecord, SessionRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestResult:
    session_id: int
    session_name: str
    run_id: int
    run_label: str
    tensors: int
    problems: list[FileProblem] = field(default_factory=list)
    reused_run_id: int | None = None  # the ready run of the same inputs whose tensors this run shares


@dataclass(frozen=True)
class PendingRun:
    """A run whose row says "ingesting": `begin` made it, `complete` fills it."""

    session_id: int
    session_name: str
    run_id: int
    run_label: str
    created_session: bool  # undoing the run also removes the session when nothing else is in it
    owner: str = ""  # the claim it was begun or taken over with: once another process holds it, it is theirs
    staged: bool = False  # its row names its staged files: should this process stop, another takes it over


def is_reference_label(label: str) -> bool:
    return label.strip().casefold() == "reference"


def is_noise_label(label: str) -> bool:
    """Whether an upload's run of this label is a rerun (role "noise"): "noise", or "noise (...)" (find_divergence's
    "noise (full)", the precision floor's full values, compared against "reference (full)")."""
    return label == "noise" or (label.startswith("noise (") and label.endswith(")"))


def archive_limits(settings: Settings) -> ArchiveLimits:
    return ArchiveLimits(
        settings.max_archive_members,
        settings.max_expanded_bytes,
        settings.max_expansion_ratio,
        settings.expansion_floor_bytes,
    )


class Ingestor:
    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[DbSession],
        store: ArrayStore,
        claims: Claims | None = None,
        kernel: Kernel | None = None,
    ) -> None:
        """`claims`: this process's, on the runs it ingests (a new owner with the settings' lease if None);
        `kernel`: the statistics path of the tensors' summaries (the settings' where None)."""
        self.settings = settings
        self.kernel = kernel if kernel is not None else settings.statistics_kernel()
        self.sessions = sessions
        self.store = store
        self.claims = claims or Claims(
            sessions, settings.claim_seconds, outage_max_seconds=settings.outage_retry_seconds
        )
        self.endings = RunEndings(sessions, store, self.claims)
        self.memory_limit: int | None = None  # set where the OS limits this process's memory (an ingest's child)
        self.reading: Callable[[int, str], None] | None = None  # told of each file as a run's copy opens it

    def ingest(
        self,
        session_name: str,
        run_label: str,
        inputs: list[InputFile],
        progress: ProgressCallback | None = None,
        reuse: bool = True,
        listener: StoredListener | None = None,
        by_label: bool = True,
        role: str | None = None,
        against: str | None = None,
    ) -> IngestResult:
        """Add a run labelled `run_label` to the session (created if needed). With `reuse`, a ready run of the
        same unchanged inputs lends its tensors (and their arrays) instead of the files being read again. `by_label`:
        see `begin`; `against`: the label of the run of the session it is compared against (`begin`).

        Raises NothingUsableError (with every file's problem) when no tensor was found; nothing is kept then.
        """
        # The run's row first, so its place (the reference is the run sent first) is taken before any slow work;
        # the fingerprint next, before anything is read: a file changed while it is being ingested gets another.
        pending = self.begin(
            session_name, run_label, [i.label for i in inputs], by_label=by_label, role=role, against=against
        )
        try:
            fingerprint = (
                fingerprint_inputs(inputs, archive_limits(self.settings), self.settings.threads) if reuse else None
            )
        except BaseException:
            self.cancel(pending)
            raise
        return self.complete(pending, inputs, progress, fingerprint=fingerprint, listener=listener)

    def begin(
        self,
        session_name: str,
        run_label: str,
        sources: list[str],
        create_session: bool = True,
        created_session: bool = False,
        by_label: bool = True,
        role: str | None = None,
        staged: Sequence[InputFile] = (),
        against: str | None = None,
        new_session: bool = False,
    ) -> PendingRun:
        """Commit the run's row as "ingesting" (and the session, if new and allowed). `staged`: the run's files
        in the staging folder, kept until it is ingested (an accepted upload's), named on the row so that another
        process can take the ingest over (`take_over`) should this one die. `created_session`: the
        caller made the session for this run, so undoing the run may remove it as well. `role`: "noise" for a
        rerun of the reference (its noise floor); left out, the first run is the reference, the others candidates.
        `against`: the label of the session's run this one is compared against (left out: the session's reference);
        refused (InvalidInputError, nothing kept) where the session has no such run or it cannot be
        (store/compared_against.py). `new_session`: the run makes its session, and a session of that name found
        (another command made it meanwhile) is refused with SessionNameTaken, nothing kept: two commands never land
        in one session by picking one free name at once.

        The run takes the next place, so the session's reference (its first run) is the run begun first, not the
        first to finish; but with `by_label`, a run labelled "reference" (any case) takes the first place when no
        other run has that label. Two processes making the same new session at once both land in it (the
        transaction takes the write lock before it reads, and a clash on the name is tried once more). A run of
        the same label that failed before is replaced, in its place; any other clash is refused."""
        session_name = parse_label(session_name, "session name")
        run_label = parse_label(run_label, "run label")
        begin = partial(
            self._begin,
            session_name,
            run_label,
            sources,
            create_session,
            created_session,
            by_label,
            role,
            staged,
            against,
            new_session,
        )
        try:
            return begin()
        except IntegrityError:  # another database than SQLite: the session was made meanwhile; now it is found
            return begin()

    def _begin(
        self,
        session_name: str,
        run_label: str,
        sources: list[str],
        create_session: bool,
        created_session: bool,
        by_label: bool,
        role: str | None,
        staged: Sequence[InputFile],
        against: str | None = None,
        new_session: bool = False,
    ) -> PendingRun:
        with self.sessions.begin() as db:
            # A write first, so that this transaction holds SQLite's write lock before it reads: two begins for
            # one new session take turns (the second finds the session) and never take the same place.
            db.execute(update(SessionRecord).where(SessionRecord.name == session_name).values(name=SessionRecord.name))
            session = db.scalar(select(SessionRecord).where(SessionRecord.name == session_name))
            created = session is None
            if new_session and session is not None:
                raise SessionNameTaken(f"a session named {session_name!r} was made by another command meanwhile")
            if session is None:
                if not create_session:
                    raise InvalidInputError(f"no session named {session_name!r}")
                session = SessionRecord(name=session_name)
                db.add(session)
                db.flush()
            runs = list(db.scalars(select(RunRecord).where(RunRecord.session_id == session.id)))
            taken = next((r for r in runs if r.label == run_label), None)
            if taken is not None and taken.status != "failed":
                raise ConflictError(f"session {session_name!r} already has a run labelled {run_label!r}")
            others = [r for r in runs if r is not taken]
            if taken is not None:
                position, taken_id = taken.position, taken.id
                db.delete(taken)
                db.flush()
            elif by_label and is_reference_label(run_label) and not any(is_reference_label(r.label) for r in others):
                position = 0
                for other in others:  # the labelled reference goes first; the others keep their order
                    other.position += 1
            else:
                position = max((r.position for r in others), default=-1) + 1
            for other in others:
                if other.role != "noise":  # a rerun of the reference keeps its role wherever it stands
                    other.role = "reference" if other.position == 0 else "candidate"
            run = RunRecord(
                session_id=session.id,
                label=run_label,
                position=position,
                role=role or ("reference" if position == 0 else "candidate"),
                status="ingesting",
                ingest_pid=os.getpid(),
                ingest_host=socket.gethostname(),
                **self.claims.run_claim(),
                created_session=created or created_session,
                sources=sources,
                staged_inputs=self._staged(staged),
            )
            db.add(run)
            db.flush()
            if taken is not None:  # runs compared against the failed run this one replaces: against this one
                forget(db, taken_id, instead=run.id)
            if against is not None:
                if against == run_label:
                    raise InvalidInputError(f"run {run_label!r} cannot be compared against itself")
                target = run_labelled(others, against, session_name)
                check_against(run, target, [*others, run])
                run.compared_against_id = target.id
            # Its folder in the store recorded with it, before any array is written there: what recovery may delete.
            # (SQLite may give a run the id of one deleted, whose folder's record is kept while rows name arrays in it.)
            if db.get(ArrayFolderRecord, run.id) is None:
                db.add(ArrayFolderRecord(run_id=run.id))
            # Live before the row is committed: a periodic recovery (services.sweep) never takes it for dead.
            LiveRuns.add(self.settings.database_url, run.id)
            return PendingRun(
                session.id,
                session_name,
                run.id,
                run_label,
                created or created_session,
                self.claims.owner,
                run.staged_inputs is not None,
            )

    def _staged(self, staged: Sequence[InputFile]) -> list[list[str]] | None:
        """The row's `staged_inputs` of files under the staging folder; None when there are none (or any is
        elsewhere: a path given on the command line is the user's, not the server's to keep)."""
        root = self.settings.staging_dir.resolve()
        named: list[list[str]] = []
        for item in staged:
            path = item.path.resolve()
            if not path.is_relative_to(root):
                return None
            named.append([path.relative_to(root).as_posix(), item.label])
        return named or None

    def staged(self, run: RunRecord) -> list[InputFile]:
        """The files in the staging folder that the run of an accepted upload is ingested from."""
        return [InputFile(self.settings.staging_dir / path, label) for path, label in run.staged_inputs or ()]

    def resumable(self, run: RunRecord) -> bool:
        """Whether the run names staged files and every one of them is there: its ingest can be done again."""
        inputs = self.staged(run)
        return bool(inputs) and all(i.path.is_file() for i in inputs)

    def take_over(self, db: DbSession, run: RunRecord) -> tuple[PendingRun, list[InputFile]]:
        """Make a dead ingest's `resumable` run (claimed by this process in `db`'s transaction: recovery.py) this
        process's, to be ingested again from its staged files: its arrays so far deleted, the run among this
        process's live runs (once the transaction commits; the caller then queues its ingest)."""
        inputs = self.staged(run)
        self.store.delete(run_prefix(run.id))
        run.ingest_pid, run.ingest_host = os.getpid(), socket.gethostname()
        db.flush()
        LiveRuns.add(self.settings.database_url, run.id)  # before the commit, as `begin` does
        pending = PendingRun(
            run.session_id, run.session.name, run.id, run.label, run.created_session, self.claims.owner, True
        )
        return pending, inputs

    def staged_folders(self) -> set[str]:
        """The staging folders that runs still "ingesting" name (their files wait to be ingested): kept by the
        sweep whoever made them."""
        with self.sessions() as db:
            named: ScalarResult[list[Any] | None] = db.scalars(
                select(RunRecord.staged_inputs).where(
                    RunRecord.status == "ingesting", RunRecord.staged_inputs.is_not(None)
                )
            )
            return {PurePosixPath(path).parts[0] for inputs in named for path, _ in inputs or ()}

    def release_staged(self, inputs: Sequence[InputFile]) -> None:
        """Remove the staging folder of a taken-over upload's files once no run still "ingesting" names it (its
        other runs may still be ingested). Where the database does not answer, the sweep removes it later."""
        root = self.settings.staging_dir.resolve()
        folders = {item.path.resolve().relative_to(root).parts[0] for item in inputs}
        try:
            waiting = self.staged_folders()
        except Exception:
            log.warning("could not tell whether %s still wait to be ingested", sorted(folders), exc_info=True)
            return
        for folder in folders - waiting:
            shutil.rmtree(root / folder, ignore_errors=True)

    def complete(
        self,
        pending: PendingRun,
        inputs: list[InputFile],
        progress: ProgressCallback | None = None,
        keep_failure: bool = False,
        fingerprint: Fingerprint | None = None,
        listener: StoredListener | None = None,
        again: bool = False,
        tap: RunTap | None = None,
    ) -> IngestResult:
        """Copy the tensors of a run `begin` made, then mark it "ready". With the inputs' `fingerprint`, a ready
        run of the same fingerprint is reused instead (its rows copied, its arrays shared), and otherwise the
        fingerprint is recorded on this run. A `listener` hears of the tensors as they are stored (not those of a
        reused run) and is settled before the run's arrays can move. `again`: an earlier try may have left arrays
        under the run's prefix; they are deleted first.

        Raises NothingUsableError when no tensor was found: the run is then removed (and the session, when the
        run's ingest made it and nothing else is in it), or with `keep_failure` kept as "failed" with its
        problems. Raises IngestPostponed when the database or the array store did not answer (errors.is_outage):
        the run stays "ingesting" and among this process's live runs, its arrays deleted if the store lets, for
        its caller to try again from the same inputs; so does IngestCancelled of a run with staged files (an
        accepted upload's, which the next start or another replica takes over). Any other error removes the run, or
        with `keep_failure` marks it "failed" with the error as its problem, and is raised again. A `tap` is
        handed each tensor's blocks as they are read (ingest/taps.py) and is closed before this returns."""
        run_id = pending.run_id
        staging = new_folder(self.settings.staging_dir, "ingest")
        postponed = False
        try:
            if again:
                self.store.delete(run_prefix(run_id))
            reused = self.endings.reuse(run_id, pending.owner, fingerprint) if fingerprint is not None else None
            if reused is not None:
                if progress is not None:
                    progress(1, 1)
                return IngestResult(
                    pending.session_id,
                    pending.session_name,
                    run_id,
                    pending.run_label,
                    reused.tensors,
                    reused.problems,
                    reused.source_run_id,
                )
            copy = RunCopy(
                self.store, self.settings, archive_limits(self.settings), self.kernel, self.memory_limit, self.reading
            )
            stored, problems, traces = copy.run(run_id, inputs, staging, progress, listener, tap)
            summaries = [tensor for t in traces if not t.trace.has_values for tensor in t.trace.tensors]
            if not stored and not summaries:
                raise NothingUsableError(problems)
            self.endings.finish(run_id, stored, problems, traces, fingerprint, pending.owner)
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)  # first: on a full disk, what it frees lets the rest go on
            what = ", ".join(i.label for i in inputs) or "upload"
            outcome = outcome_of(exc, self.outage(exc), keep_failure, pending.staged, what, pending.run_label)
            postponed = outcome.end is RunEnd.WAITING
            self._end(pending, outcome)
            if outcome.fresh:
                raise outcome.error from None
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            if not postponed:
                LiveRuns.discard(self.settings.database_url, run_id)
        return IngestResult(
            pending.session_id, pending.session_name, run_id, pending.run_label, len(stored) + len(summaries), problems
        )

    def outage(self, exc: BaseException) -> str | None:
        """What did not answer, when `exc` says the database or the array store did not (errors.is_outage, or an
        error SQLAlchemy raised for a connection that failed); None for any other error."""
        if isinstance(exc, IngestPostponed):
            return exc.reason
        if is_outage(exc):
            return str(exc)
        current: BaseException | None = exc
        seen: set[int] = set()
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            found = database_outage(current, self.settings.database_url)
            if found is not None:
                return str(found)
            current = current.__cause__ or current.__context__
        return None

    def complete_stored(
        self,
        pending: PendingRun,
        stored: list[Stored],
        traces: list[RunTrace],
    ) -> IngestResult:
        """Mark a run `begin` made "ready" with tensors its caller has already written into the array store under
        the run's prefix (a live capture writes them as the model produces them). Any error removes the run and
        is raised again."""
        try:
            self.endings.finish(pending.run_id, stored, [], traces, owner=pending.owner)
        except BaseException:
            self._give_up(pending, [], False)
            raise
        finally:
            LiveRuns.discard(self.settings.database_url, pending.run_id)
        return IngestResult(pending.session_id, pending.session_name, pending.run_id, pending.run_label, len(stored))

    def live_runs(self) -> frozenset[int]:
        """The runs of this data dir that this process has begun and not yet completed, through any Ingestor:
        recovery must leave them alone."""
        return LiveRuns.of(self.settings.database_url)

    def give_up(self, pending: PendingRun, problems: list[FileProblem], keep_failure: bool) -> None:
        """End a run whose ingest stopped without ending it (its process died): removed, or with `keep_failure`
        kept as "failed" with `problems`."""
        try:
            self._give_up(pending, problems, keep_failure)
        finally:
            LiveRuns.discard(self.settings.database_url, pending.run_id)

    def forget(self, run_id: int) -> None:
        """Take a run off this process's live runs once another process (`child.py`) has completed it."""
        LiveRuns.discard(self.settings.database_url, run_id)

    def cancel(self, pending: PendingRun) -> None:
        """Remove a run `begin` made that will not be completed (as if it never began)."""
        try:
            self.endings.abandon(pending.run_id, pending.session_id if pending.created_session else None, pending.owner)
        finally:
            LiveRuns.discard(self.settings.database_url, pending.run_id)

    def _end(self, pending: PendingRun, outcome: RunOutcome) -> None:
        """Apply the outcome of an ingest that stopped to its run (outcomes.outcome_of decides it)."""
        if outcome.end is RunEnd.WAITING:  # its arrays deleted now where the store lets, else before the next try
            delete_arrays(self.store, run_prefix(pending.run_id))
        elif outcome.end is RunEnd.DROPPED:
            self._give_up(pending, [], False)
        elif outcome.end is RunEnd.FAILED:
            try:
                self._give_up(pending, list(outcome.problems), True)
            except Exception:
                if not outcome.best_effort:
                    raise
                log.exception("could not mark run %s failed", pending.run_id)  # the next sweep removes it instead

    def _give_up(self, pending: PendingRun, problems: list[FileProblem], keep_failure: bool) -> None:
        if keep_failure:
            self.endings.fail(pending.run_id, problems, pending.owner)
        else:
            self.endings.abandon(pending.run_id, pending.session_id if pending.created_session else None, pending.owner)
