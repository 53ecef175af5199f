"""Ingest: add one run to a session from files, archives and folders.

Lifecycle, so that nothing half-ingested is ever visible:
1. `begin` commits a run row with status "ingesting" and this process's id (the session too, if new);
2. `complete` copies every tensor into the array store under "runs/<run id>/";
3. one transaction inserts the tensor and problem rows and sets the status to "ready".
When nothing usable was found the run is deleted, or (`keep_failure`, for uploads whose request has returned)
kept as "failed" with its problems and no arrays, so the session page can say why.
An ingest given the fingerprint of its inputs (`fingerprints.py`; `ingest` takes it) first looks for a ready run
with the same fingerprint: found, the new run's tensor and problem rows are copies of that run's, naming the same
arrays, and no file is read. Otherwise `_finish` records the fingerprint, and any tensor bit-identical to one an
older run stored (the same digest) names that array and the copy just written is deleted. An array is thus shared
by every row that names it; `catalog.release_arrays` deletes it with the last.

An ingest that meets an outage (the database or the array store did not answer) raises IngestPostponed and leaves
the run "ingesting" for its caller to try again; an accepted upload's run names its staged files, so that another
process takes it over (`take_over`) when this one dies. Otherwise a run left "ingesting" by a process that died is
removed, arrays and all, by `recovery.recover`; the runs this
process is ingesting right now, through any of its Ingestors, are in `Ingestor.live_runs()`, so its own recovery
never takes them for dead (a second `open_services` on the same data dir, say a capture beside a server).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from tensor_debugger.engine.names import module_layer, parse_layer_stage
from tensor_debugger.engine.summary_compare import Sketch
from tensor_debugger.errors import (
    CaptureNote,
    ConflictError,
    DiskFullError,
    FileProblem,
    IngestPostponed,
    InvalidInputError,
    NotATensor,
    NothingUsableError,
    StoreUnavailableError,
    StoreWriteError,
    TensorDebuggerError,
    is_disk_full,
    is_outage,
    unexpected_problem,
)
from tensor_debugger.ingest.archives import ArchiveLimits
from tensor_debugger.ingest.block_readers import BufferPool
from tensor_debugger.ingest.fingerprints import Fingerprint, fingerprint_inputs
from tensor_debugger.ingest.inputs import InputFile, RunTrace, TensorFileEntry, expand_inputs
from tensor_debugger.ingest.staging import new_folder
from tensor_debugger.ingest.stored import stored_name
from tensor_debugger.ingest.tensor_files import open_tensor_file
from tensor_debugger.ingest.traces import TraceTensor
from tensor_debugger.ingest.writer import PageCacheBudget, StoredTensor, TensorWriter, WritePools
from tensor_debugger.settings import Settings
from tensor_debugger.store.arrays import ArrayStore, run_prefix
from tensor_debugger.store.catalog import parse_label
from tensor_debugger.store.claims import Claims
from tensor_debugger.store.database import database_outage, lock_arrays
from tensor_debugger.store.models import ArrayFolderRecord, ProblemRecord, RunRecord, SessionRecord, TensorRecord

log = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int], None]  # (bytes done, bytes total)
Stored = tuple[TensorFileEntry, tuple[str, ...], StoredTensor]  # a tensor's file, key path and array


class StoredListener(Protocol):
    """Told of a run's tensors as their arrays are written, before the run is ready (a comparison that starts
    while the rest ingests: `compare/compute/early.py`)."""

    def stored(self, tensors: Sequence[Stored]) -> None:
        """The tensors of one file, their arrays complete, under the run's prefix."""

    def settle(self) -> None:
        """Return once done with the arrays `stored` named: the ingest may now move or delete them (sharing an
        identical array, removing a failed run)."""


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


def out_of_memory(limit: int | None) -> str:
    """Why a file could not be read when memory ran out, with the limit the OS set (None: no limit was set)."""
    if limit is None:
        return "ran out of memory reading it"
    return (
        f"needed more than {limit / 2**30:.3g} GiB of memory (TENSOR_DEBUGGER_INGEST_MEMORY, the most one ingest "
        "may take) to read it; refused"
    )


class IngestCancelled(Exception):  # noqa: N818 (a signal, not an error: the server is stopping)
    """Raised from a progress callback to stop an ingest; the run is removed as if it never began."""


class TakenOver(Exception):  # noqa: N818 (a signal: the work is another process's now)
    """The run's claim is another process's (this one's lapsed during an outage, and a replica took the ingest
    over): this ingest stops without touching the run, its arrays or its staged files."""


def archive_limits(settings: Settings) -> ArchiveLimits:
    return ArchiveLimits(
        settings.max_archive_members,
        settings.max_expanded_bytes,
        settings.max_expansion_ratio,
        settings.expansion_floor_bytes,
    )


def summary_record(run_id: int, position: int, run_trace: RunTrace, traced: TraceTensor) -> TensorRecord:
    """A tensor of a trace without element values: what its JSON says, and no array."""
    shape = list(traced.shape or ())
    stats: dict[str, float | None] = dict(traced.stats)
    sketch = None
    if traced.sketch is not None:
        try:
            sketch = Sketch.from_json(traced.sketch)
        except (KeyError, TypeError, ValueError) as exc:
            raise FileProblem(run_trace.label, f"{traced.name}: a malformed summary ({exc})") from exc
        stats = {"min": sketch.min, "max": sketch.max, "mean": sketch.mean, "std": sketch.std}
    layer = parse_layer_stage(PurePosixPath(traced.module_path), ())[0]
    if traced.op is not None:
        layer = module_layer(traced.module_path)
    return TensorRecord(
        run_id=run_id,
        position=position,
        name=run_trace.summary_name(traced),
        source_file=run_trace.label,
        key_path=[],
        layer=layer,
        stage=None,
        shape=shape,
        dtype=traced.dtype or "unknown",
        store_key="",
        nbytes=0,
        digest=f"none:{uuid.uuid4().hex}",
        numel=math.prod(shape),
        min=stats.get("min"),
        max=stats.get("max"),
        mean=stats.get("mean"),
        std=stats.get("std"),
        nan_count=sketch.nan if sketch else 0,
        inf_count=sketch.inf if sketch else 0,
        module_path=traced.module_path,
        place=traced.place,
        source=traced.source,
        has_values=False,
        sketch=sketch.to_json() if sketch else None,
    )


class _LiveRuns:
    """The runs this process is ingesting, by database: what a process is doing belongs to the process, not to
    one of the Ingestors it may hold for the same data dir."""

    _lock = threading.Lock()
    _runs: set[tuple[str, int]] = set()  # (database URL, run id)

    @classmethod
    def add(cls, database: str, run_id: int) -> None:
        with cls._lock:
            cls._runs.add((database, run_id))

    @classmethod
    def discard(cls, database: str, run_id: int) -> None:
        with cls._lock:
            cls._runs.discard((database, run_id))

    @classmethod
    def of(cls, database: str) -> frozenset[int]:
        with cls._lock:
            return frozenset(run for url, run in cls._runs if url == database)


class Ingestor:
    def __init__(
        self, settings: Settings, sessions: sessionmaker[DbSession], store: ArrayStore, claims: Claims | None = None
    ) -> None:
        """`claims`: this process's, on the runs it ingests (a new owner with the settings' lease if None)."""
        self.settings = settings
        self.sessions = sessions
        self.store = store
        self.claims = claims or Claims(sessions, settings.claim_seconds)
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
    ) -> IngestResult:
        """Add a run labelled `run_label` to the session (created if needed). With `reuse`, a ready run of the
        same unchanged inputs lends its tensors (and their arrays) instead of the files being read again. `by_label`:
        see `begin`.

        Raises NothingUsableError (with every file's problem) when no tensor was found; nothing is kept then.
        """
        # The run's row first, so its place (the reference is the run sent first) is taken before any slow work;
        # the fingerprint next, before anything is read: a file changed while it is being ingested gets another.
        pending = self.begin(session_name, run_label, [i.label for i in inputs], by_label=by_label, role=role)
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
    ) -> PendingRun:
        """Commit the run's row as "ingesting" (and the session, if new and allowed). `staged`: the run's files
        in the staging folder, kept until it is ingested (an accepted upload's), named on the row so that another
        process can take the ingest over (`take_over`) should this one die. `created_session`: the
        caller made the session for this run, so undoing the run may remove it as well. `role`: "noise" for a
        rerun of the reference (its noise floor); left out, the first run is the reference, the others candidates.

        The run takes the next place, so the session's reference (its first run) is the run begun first, not the
        first to finish; but with `by_label`, a run labelled "reference" (any case) takes the first place when no
        other run has that label. Two processes making the same new session at once both land in it (the
        transaction takes the write lock before it reads, and a clash on the name is tried once more). A run of
        the same label that failed before is replaced, in its place; any other clash is refused."""
        session_name = parse_label(session_name, "session name")
        run_label = parse_label(run_label, "run label")
        try:
            pending = self._begin(
                session_name, run_label, sources, create_session, created_session, by_label, role, staged
            )
        except IntegrityError:  # another database than SQLite: the session was made meanwhile; now it is found
            pending = self._begin(
                session_name, run_label, sources, create_session, created_session, by_label, role, staged
            )
        return pending

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
    ) -> PendingRun:
        with self.sessions.begin() as db:
            # A write first, so that this transaction holds SQLite's write lock before it reads: two begins for
            # one new session take turns (the second finds the session) and never take the same place.
            db.execute(update(SessionRecord).where(SessionRecord.name == session_name).values(name=SessionRecord.name))
            session = db.scalar(select(SessionRecord).where(SessionRecord.name == session_name))
            created = session is None
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
                position = taken.position
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
            # Its folder in the store recorded with it, before any array is written there: what recovery may delete.
            # (SQLite may give a run the id of one deleted, whose folder's record is kept while rows name arrays in it.)
            if db.get(ArrayFolderRecord, run.id) is None:
                db.add(ArrayFolderRecord(run_id=run.id))
            # Live before the row is committed: a periodic recovery (services.sweep) never takes it for dead.
            _LiveRuns.add(self.settings.database_url, run.id)
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
        _LiveRuns.add(self.settings.database_url, run.id)  # before the commit, as `begin` does
        pending = PendingRun(
            run.session_id, run.session.name, run.id, run.label, run.created_session, self.claims.owner, True
        )
        return pending, inputs

    def staged_folders(self) -> set[str]:
        """The staging folders that runs still "ingesting" name (their files wait to be ingested): kept by the
        sweep whoever made them."""
        with self.sessions() as db:
            named = db.scalars(
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
        with `keep_failure` marks it "failed" with the error as its problem, and is raised again."""
        run_id = pending.run_id
        staging = new_folder(self.settings.staging_dir, "ingest")
        postponed = False
        try:
            if again:
                self.store.delete(run_prefix(run_id))
            reused = self._reuse(pending, fingerprint) if fingerprint is not None else None
            if reused is not None:
                if progress is not None:
                    progress(1, 1)
                return reused
            stored, problems, traces = self._copy(run_id, inputs, staging, progress, listener)
            summaries = [tensor for t in traces if not t.trace.has_values for tensor in t.trace.tensors]
            if not stored and not summaries:
                raise NothingUsableError(problems)
            self._finish(run_id, stored, problems, traces, fingerprint, pending.owner)
        except TakenOver:
            raise  # the run is another process's: nothing of it is this ingest's to remove
        except NothingUsableError as exc:
            self._give_up(pending, exc.problems, keep_failure)
            raise
        except Exception as exc:
            shutil.rmtree(staging, ignore_errors=True)  # first: on a full disk, what it frees lets the rest go on
            outage = self.outage(exc)
            if outage is not None or (pending.staged and isinstance(exc, IngestCancelled)):
                # an outage, or a server stopping: the run stays for a later try (in a server that stops, the next
                # start's or another replica's) from the same staged files
                postponed = True
                self._delete_arrays(run_prefix(run_id))  # else deleted before the next try
                if outage is None:
                    raise
                raise IngestPostponed(outage) from None
            what = ", ".join(i.label for i in inputs) or "upload"
            if is_disk_full(exc) and not isinstance(exc, DiskFullError):
                exc = DiskFullError(f"the run {pending.run_label!r}")
            if isinstance(exc, DiskFullError | StoreWriteError):  # kept, "failed", whoever asked: the session says why
                file = exc.file if isinstance(exc, StoreWriteError) and exc.file else what
                try:
                    self._give_up(pending, [FileProblem(file, str(exc))], True)
                except Exception:  # still no room for the row: the next sweep removes the run instead
                    log.exception("could not mark run %s failed", run_id)
                raise exc from None
            reason = f"the ingest failed: {exc}"
            self._give_up(pending, [FileProblem(what, reason)], keep_failure and not isinstance(exc, IngestCancelled))
            raise
        except BaseException:
            self._give_up(pending, [], False)
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            if not postponed:
                _LiveRuns.discard(self.settings.database_url, run_id)
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
        stored: list[tuple[TensorFileEntry, tuple[str, ...], StoredTensor]],
        traces: list[RunTrace],
    ) -> IngestResult:
        """Mark a run `begin` made "ready" with tensors its caller has already written into the array store under
        the run's prefix (a live capture writes them as the model produces them). Any error removes the run and
        is raised again."""
        try:
            self._finish(pending.run_id, stored, [], traces, owner=pending.owner)
        except BaseException:
            self._give_up(pending, [], False)
            raise
        finally:
            _LiveRuns.discard(self.settings.database_url, pending.run_id)
        return IngestResult(pending.session_id, pending.session_name, pending.run_id, pending.run_label, len(stored))

    def live_runs(self) -> frozenset[int]:
        """The runs of this data dir that this process has begun and not yet completed, through any Ingestor:
        recovery must leave them alone."""
        return _LiveRuns.of(self.settings.database_url)

    def give_up(self, pending: PendingRun, problems: list[FileProblem], keep_failure: bool) -> None:
        """End a run whose ingest stopped without ending it (its process died): removed, or with `keep_failure`
        kept as "failed" with `problems`."""
        try:
            self._give_up(pending, problems, keep_failure)
        finally:
            _LiveRuns.discard(self.settings.database_url, pending.run_id)

    def forget(self, run_id: int) -> None:
        """Take a run off this process's live runs once another process (`child.py`) has completed it."""
        _LiveRuns.discard(self.settings.database_url, run_id)

    def cancel(self, pending: PendingRun) -> None:
        """Remove a run `begin` made that will not be completed (as if it never began)."""
        try:
            self._abandon(pending.run_id, pending.session_id if pending.created_session else None, pending.owner)
        finally:
            _LiveRuns.discard(self.settings.database_url, pending.run_id)

    def _give_up(self, pending: PendingRun, problems: list[FileProblem], keep_failure: bool) -> None:
        if keep_failure:
            self._fail(pending.run_id, problems, pending.owner)
        else:
            self._abandon(pending.run_id, pending.session_id if pending.created_session else None, pending.owner)

    def _copy(
        self,
        run_id: int,
        inputs: list[InputFile],
        staging: Path,
        progress: ProgressCallback | None,
        listener: StoredListener | None = None,
    ) -> tuple[list[Stored], list[FileProblem], list[RunTrace]]:
        expansion = expand_inputs(inputs, staging, archive_limits(self.settings))
        problems = expansion.problems
        total = sum(e.nbytes for e in expansion.entries)
        done = 0
        if progress is not None:
            progress(0, total)  # archives are unpacked: from here on, bytes copied of `total`

        def on_bytes(n: int) -> None:
            nonlocal done
            done += n
            if progress is not None:
                progress(min(done, total), total)

        stored: list[tuple[TensorFileEntry, tuple[str, ...], StoredTensor]] = []
        pools = WritePools.open(self.settings.threads)
        buffers = BufferPool(pools.buffers)  # read buffers, shared by the run's files (read one after another)
        budget = PageCacheBudget(self.settings.buffered_run_bytes)  # the run's first bytes through the cache
        try:
            for entry in expansion.entries:
                first = made = len(stored)
                if self.reading is not None:
                    self.reading(run_id, entry.label)
                try:
                    with (
                        open_tensor_file(
                            entry.path, entry.label, buffers, entry.span, entry.packed, scratch=staging
                        ) as opened,
                        TensorWriter(self.store, self.settings.chunk_bytes, pools, on_bytes, budget) as writer,
                    ):
                        problems.extend(opened.skipped)
                        results = []
                        for leaf in opened.leaves:
                            made += 1
                            results.append((leaf, writer.add(f"{run_prefix(run_id)}/{made - 1}", leaf)))
                        writer.finish()
                        stored.extend((entry, entry.keys + leaf.key_path, result()) for leaf, result in results)
                        if listener is not None and results:
                            listener.stored(stored[first:])
                        if not opened.leaves and not opened.skipped:
                            problems.append(FileProblem(entry.label, "holds no tensors"))
                        elif not opened.leaves:
                            problems.append(FileProblem(entry.label, "holds no usable tensors"))
                except FileProblem as problem:
                    problems.append(problem)
                    self._drop(run_id, stored, first, made)
                except StoreWriteError as exc:  # the store, not the file: the whole run stops
                    self._drop(run_id, stored, first, made)
                    raise type(exc)(f"the arrays of {entry.label}", exc.reason, entry.label) from exc
                except StoreUnavailableError:  # a read of the store that it did not answer: not the file's fault
                    self._drop(run_id, stored, first, made)
                    raise
                except MemoryError:  # one file's, its memory freed as the error left it: the run's other files go on
                    self._drop(run_id, stored, first, made)
                    problems.append(FileProblem(entry.label, out_of_memory(self.memory_limit)))
                except OSError as exc:  # a file that ends early (a disk that fills stops the whole run)
                    self._drop(run_id, stored, first, made)
                    if is_disk_full(exc):
                        raise DiskFullError(f"the arrays of {entry.label}") from exc
                    problems.append(FileProblem(entry.label, f"could not be read: {exc.strerror or exc}"))
                except (TensorDebuggerError, IngestCancelled, TakenOver, SQLAlchemyError):
                    raise  # not this file's: the run stops, as it would for any of them
                except Exception as exc:  # anything else one file's reading raised: that file fails, named
                    self._drop(run_id, stored, first, made)
                    problems.append(unexpected_problem(entry.label, exc))
                finally:
                    if entry.staged:
                        entry.path.unlink(missing_ok=True)
        finally:
            pools.close()
            if listener is not None:  # before `_finish` shares arrays or `_give_up` deletes them
                listener.settle()
        if progress is not None:
            progress(total, total)
        return stored, problems, expansion.traces

    def _drop(
        self,
        run_id: int,
        stored: list[tuple[TensorFileEntry, tuple[str, ...], StoredTensor]],
        first: int,
        made: int,
    ) -> None:
        """Forget the tensors of a file that failed partway, arrays included: those from `first` on, up to the
        `made` arrays begun (the ones cut short too)."""
        del stored[first:]
        for index in range(first, made):
            self._delete_arrays(f"{run_prefix(run_id)}/{index}")

    def _delete_arrays(self, prefix: str) -> None:
        """Delete the arrays under `prefix` of a run that stops; where the store fails that too (S3 gone), they
        are left for the run's deletion (or, with no row naming them, recovery's) to remove."""
        try:
            self.store.delete(prefix)
        except (StoreWriteError, StoreUnavailableError):
            log.warning("could not delete %s from the array store; deleting its run removes it", prefix, exc_info=True)

    def _reuse(self, pending: PendingRun, fingerprint: Fingerprint) -> IngestResult | None:
        """Make the run a copy of the newest ready run ingested from the same fingerprint, in one transaction:
        its tensor rows (naming the same arrays) and problems. None when there is no such run."""
        run_id = pending.run_id
        with self.sessions.begin() as db:
            self._hold(db, run_id, pending.owner)
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
            if rows:
                db.execute(insert(TensorRecord), rows)
            problems = [(NotATensor if p.ignored else FileProblem)(p.file, p.reason) for p in source.problems]
            db.add_all(problem_rows(run_id, problems))
            run.status = "ready"
            run.ingest_pid = None
            run.staged_inputs = None
            run.tensor_count = source.tensor_count
            run.total_bytes = source.total_bytes
            run.module_tree = source.module_tree
            reused_from = source.id
        return IngestResult(
            pending.session_id, pending.session_name, run_id, pending.run_label, len(rows), problems, reused_from
        )

    def _finish(
        self,
        run_id: int,
        stored: list[tuple[TensorFileEntry, tuple[str, ...], StoredTensor]],
        problems: list[FileProblem],
        traces: list[RunTrace],
        fingerprint: Fingerprint | None = None,
        owner: str = "",
    ) -> None:
        seen: dict[str, int] = {}
        records: list[TensorRecord] = []
        problems.extend(CaptureNote(t.label, note) for t in traces for note in t.trace.notes)  # a capture's notes
        with self.sessions.begin() as db:
            self._hold(db, run_id, owner)
            for position, (entry, key_path, tensor) in enumerate(stored):
                name = stored_name(entry, key_path)
                if entry.module_path is not None and key_path == ("data",):
                    key_path = ()  # as `stored_name` names it
                if name in seen:
                    seen[name] += 1
                    problems.append(
                        FileProblem(entry.label, f"a second tensor named {name!r}; kept as {name} ({seen[name]})")
                    )
                    name = f"{name} ({seen[name]})"
                seen.setdefault(name, 1)
                layer, stage = parse_layer_stage(entry.relpath, key_path)
                if layer is None and entry.source is not None and entry.module_path is not None:  # a captured op
                    layer = module_layer(entry.module_path)
                s = tensor.summary
                records.append(
                    TensorRecord(
                        run_id=run_id,
                        position=position,
                        name=name,
                        source_file=entry.label,
                        key_path=list(key_path),
                        layer=layer,
                        stage=stage,
                        shape=list(tensor.shape),
                        dtype=tensor.dtype.name,
                        store_key=tensor.store_key,
                        nbytes=tensor.nbytes,
                        digest=tensor.digest,
                        numel=s.numel,
                        min=s.min,
                        max=s.max,
                        mean=s.mean,
                        std=s.std,
                        nan_count=s.nan_count,
                        inf_count=s.inf_count,
                        module_path=entry.module_path,
                        place=entry.place,
                        source=entry.source,
                    )
                )
            db.add_all(records)
            db.flush()  # SQLite's write lock is held from here: the arrays found below cannot be deleted meanwhile
            lock_arrays(db)  # nor, on PostgreSQL, by a deletion holding this lock
            self._share_identical(db, run_id, records)
            position = len(stored)
            for run_trace in traces:
                if run_trace.trace.has_values:
                    continue
                for traced in run_trace.trace.tensors:
                    db.add(summary_record(run_id, position, run_trace, traced))
                    position += 1
            db.add_all(problem_rows(run_id, problems))
            run = db.get_one(RunRecord, run_id)
            run.status = "ready"
            run.ingest_pid = None
            run.staged_inputs = None
            run.tensor_count = position
            run.total_bytes = sum(t.nbytes for _, _, t in stored)
            if fingerprint is not None:
                run.input_fingerprint, run.input_key = fingerprint.data, fingerprint.key
            if traces:
                run.module_tree = {
                    "source": "hf-trace",
                    "values": all(t.trace.has_values for t in traces),
                    "roots": [t.trace.root.to_json() for t in traces],
                }

    def _share_identical(self, db: DbSession, run_id: int, records: list[TensorRecord]) -> None:
        """Point each of `records` bit-identical to a tensor another ready run stored (older or not: runs ingested at
        once are ready in any order), or an earlier one of this run, at that array, and delete the copy just written.
        Done before the commit: should it fail, the run is removed all the same."""
        digests = sorted({r.digest for r in records})
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
        for record in records:
            shared = found.setdefault(record.digest, record.store_key)  # the run's own repeats share too
            if shared != record.store_key:
                self.store.delete(record.store_key)
                record.store_key = shared

    def _hold(self, db: DbSession, run_id: int, owner: str) -> None:
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

    def _fail(self, run_id: int, problems: list[FileProblem], owner: str = "") -> None:
        """Keep the run as "failed" with every problem and no arrays: the record of why nothing was stored."""
        with self.sessions.begin() as db:
            self._hold(db, run_id, owner)
            self._delete_arrays(run_prefix(run_id))
            run = db.get(RunRecord, run_id)
            if run is None:
                return
            db.add_all(problem_rows(run_id, problems))
            run.status = "failed"
            run.ingest_pid = None
            run.staged_inputs = None
            run.tensor_count = 0
            run.total_bytes = 0

    def _abandon(self, run_id: int, created_session_id: int | None, owner: str = "") -> None:
        with self.sessions.begin() as db:
            self._hold(db, run_id, owner)
            self._delete_arrays(run_prefix(run_id))
            run = db.get(RunRecord, run_id)
            if run is not None:
                db.delete(run)
            db.flush()
            if created_session_id is not None:
                remaining = db.scalar(select(func.count()).where(RunRecord.session_id == created_session_id))
                session = db.get(SessionRecord, created_session_id)
                if session is not None and not remaining:
                    db.delete(session)


def problem_rows(run_id: int, problems: Sequence[FileProblem]) -> list[ProblemRecord]:
    """The rows that keep a run's problems, each with whether it held no tensor."""
    return [ProblemRecord(run_id=run_id, file=p.file, reason=p.reason, ignored=p.ignored) for p in problems]
