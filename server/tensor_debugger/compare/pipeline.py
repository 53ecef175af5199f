"""What `tensor-debugger compare` and `ingest` do, whoever does it: the command itself, or a server running on the
same data dir that the command hands the work to (`web/controllers/local.py`). Same steps, same answer.

`compare_runs`: ingest every run at once, comparing each pair as soon as both its tensors are stored
(`early_uploads.py`, as for uploads), from the bytes as they are read where it can (`lockstep.py`: the reference
and each other run); then plan the session (every pairing rule, as always), compute what the
early comparisons did not, and build the CLI's JSON. With `fail_fast` the reference is ingested first, then each
candidate while comparing its tensors with their reference partners (`early.py`), and it stops once the first
divergence in execution order is known (every pair before it settled): pairs not yet computed stay pending,
whole and resumable, as after any interrupted computation. A session of the wanted name that a killed compare of
the same reference left with only that reference ready is taken over, not named "name (2)" (`interrupted.py`).
"""

from __future__ import annotations

import importlib
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import msgspec
from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from tensor_debugger.compare.compute.computation import Computation
from tensor_debugger.compare.compute.early import EarlyComparisons
from tensor_debugger.compare.compute.early_uploads import SessionComparisons
from tensor_debugger.compare.compute.lockstep import Lockstep
from tensor_debugger.compare.context import CompareContext
from tensor_debugger.compare.interrupted import Interrupted, interrupted_session
from tensor_debugger.compare.planning.pairing_files import check_file, import_pairing
from tensor_debugger.compare.planning.requests import (
    EXIT_FAIL,
    EXIT_PASS,
    EXIT_UNUSABLE,
    CompareRequest,
    StepProgress,
    wanted_name,
)
from tensor_debugger.compare.reports.compare_report import (
    CompareOutcome,
    CompareReport,
    IngestedRun,
    IngestedSession,
    IngestOutcome,
    IngestReport,
    ReadOnce,
    second_tensors,
    unread_files,
    unusable_report,
)
from tensor_debugger.errors import (
    ConflictError,
    InvalidInputError,
    NoDaskWorkerError,
    NothingUsableError,
    SessionNameTaken,
    TensorDebuggerError,
)
from tensor_debugger.ingest.fingerprints import fingerprint_inputs
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.outcomes import IngestCancelled
from tensor_debugger.ingest.runs import Ingestor, IngestResult, PendingRun, archive_limits
from tensor_debugger.ingest.stored import NotesOf
from tensor_debugger.ingest.taps import EveryTap, RunTap
from tensor_debugger.store import catalog
from tensor_debugger.store.models import PairRecord, RunRecord, SessionRecord
from tensor_debugger.store.problem_report import ProblemReport

# What planning and the report need once the runs are ingested (`plan_session`, `session_pairs`, `compare_report`),
# imported then, not at start-up: `_ingest_at_once` imports them in the thread that waits for the runs, while they
# ingest, so that reading starts that much sooner (about 0.04 CPU s of imports on the way to the first byte read)
_NAME_TRIES = 20  # a compare's new session: names tried where others take each meanwhile (then the error says so)

AFTER_INGEST = (
    "tensor_debugger.compare.planning.plan",
    "tensor_debugger.compare.reports.pair_reports",
    "tensor_debugger.compare.reports.contract",
    "tensor_debugger.compare.reports.coverage",
)


def free_name(sessions: sessionmaker[DbSession], wanted: str) -> str:
    """`wanted`, or `wanted (2)` where a session has that name, as the API names a new session (catalog)."""
    with sessions() as db:
        return catalog.free_name(db, wanted)


def _begin_session(
    ingestor: Ingestor,
    context: CompareContext,
    wanted: str,
    name: str,
    label: str,
    given: InputFile,
    role: str | None,
) -> PendingRun:
    """The first run's row, in a session it makes: `name` (`wanted`, or the free name found for it), or where
    another command made a session of that name since it was found free (two compares at once, one name wanted),
    the next free name for `wanted`. Two commands never share a session neither asked to join."""
    for _ in range(_NAME_TRIES):
        try:
            return ingestor.begin(name, label, [given.label], by_label=False, role=role, new_session=True)
        except SessionNameTaken:
            name = free_name(context.sessions, wanted)
    return ingestor.begin(name, label, [given.label], by_label=False, role=role, new_session=True)


def run_labels(shown: list[str]) -> list[str]:
    """Each run's label: its input's file or folder name, made unique ("x (candidate 2)") where two are alike."""
    labels: list[str] = []
    for n, typed in enumerate(shown):
        label = Path(typed).name or ("reference" if n == 0 else "candidate")
        if label in labels:
            label = f"{label} (candidate)" if n == 1 else f"{label} (candidate {n})"
        labels.append(label)
    return labels


def divergence_known(sessions: sessionmaker[DbSession], session_id: int) -> bool:
    """Whether the session's first divergence is settled: a failing pair with every pair before it (in execution
    order) settled."""
    from tensor_debugger.compare.reports.pair_reports import session_pairs

    with sessions() as db:
        noise = db.scalar(select(RunRecord.id).where(RunRecord.session_id == session_id, RunRecord.role == "noise"))
        if noise is not None:  # verdicts against the noise floor: the report's, not the rows'
            report = session_pairs(db, session_id)
            for pair in report.pairs:
                if pair.status == "pending":
                    return False
                if pair.status == "fail":
                    return True
            return False
        for status in db.scalars(
            select(PairRecord.status).where(PairRecord.session_id == session_id).order_by(PairRecord.position)
        ):
            if status == "pending":
                return False
            if status == "fail":
                return True
    return False


class _Refused(Exception):
    """A run ingested with the others could not be (`cause`); its session is deleted. `problems`: the other
    runs'."""

    def __init__(self, cause: TensorDebuggerError, problems: list[ProblemReport]) -> None:
        super().__init__(str(cause))
        self.cause, self.problems = cause, problems


def _ingest_at_once(
    ingestor: Ingestor,
    context: CompareContext,
    request: CompareRequest,
    session_name: str,
    runs: list[tuple[str, InputFile, str | None]],
    step: Callable[[str], Callable[[int, int], None] | None],
    resumed: Interrupted | None = None,
    compare_early: bool = True,
) -> tuple[int, list[ProblemReport], ReadOnce | None]:
    """Ingest `runs` (label, input, role) at once, each pair compared as soon as both its tensors are stored (unless
    not `compare_early`: a Dask cluster's workers compute them once planned); the session's id and the runs'
    problems, and how the pairs of the reference and each other run (candidates, a rerun) were read
    (`compute/lockstep.py`: from the blocks as they are read for storing, where it can). One progress step counts
    the bytes of all. `resumed`: a killed compare's session whose reference (the first of `runs`) is ready: the
    others are ingested into it. Raises _Refused."""
    if resumed is not None:
        runs = runs[1:]
    pending: list[PendingRun] = []
    try:
        for label, given, role in runs:  # in order: the first begun is the reference
            if pending or resumed is not None:
                pending.append(ingestor.begin(session_name, label, [given.label], by_label=False, role=role))
            else:
                pending.append(
                    _begin_session(ingestor, context, wanted_name(request), session_name, label, given, role)
                )
                session_name = pending[0].session_name
        session_id = pending[0].session_id if resumed is None else resumed.session_id
        with context.sessions.begin() as db:
            session = catalog.get_session(db, session_id)
            catalog.set_tolerances(session, request.rtol, request.atol, request.ulp)
            catalog.set_noise_factor(session, request.noise_factor)
    except BaseException as exc:
        for run in reversed(pending):  # the first last: it made the session, removed with it
            ingestor.cancel(run)
        if isinstance(exc, TensorDebuggerError):
            raise _Refused(exc, []) from None
        raise
    ingest_step = step("ingest " + ", ".join(label for label, _, _ in runs))
    figures = [(0, 0)] * len(runs)
    lock = threading.Lock()
    interrupted = threading.Event()  # Ctrl-C in this thread: each run's ingest stops at its next block

    def progress(index: int) -> Callable[[int, int], None]:
        def report(done: int, total: int) -> None:
            if interrupted.is_set():
                raise IngestCancelled("the compare was interrupted")
            if ingest_step is None:
                return
            with lock:
                figures[index] = (done, total)
                ingest_step(sum(d for d, _ in figures), sum(t for _, t in figures))

        return report

    # with a Dask cluster the pairs are its workers' once planned, as in a server (services.py), not this process's
    locksteps: list[Lockstep] = []
    if compare_early and resumed is None:
        with context.sessions() as db:  # the reference and each other run (a rerun too): compared from their blocks
            record = db.get_one(SessionRecord, session_id)
            db.expunge(record)
        locksteps = [Lockstep(context, record, (pending[0].run_id, other.run_id)) for other in pending[1:]]
    taps: list[RunTap | None] = [None] * len(runs)
    if locksteps:  # the reference's blocks go to each of its pairs' Locksteps (to its one Lockstep directly)
        first: RunTap = locksteps[0].tap(0) if len(locksteps) == 1 else EveryTap([s.tap(0) for s in locksteps])
        taps = [first, *(lockstep.tap(1) for lockstep in locksteps)]
    early = SessionComparisons(context, session_id, step("early")) if compare_early else None
    if early is not None:
        for lockstep in locksteps:
            early.in_memory(lockstep)

    def ingest(index: int) -> IngestResult:
        run, given, tap = pending[index], runs[index][1], taps[index]
        try:
            fingerprint = fingerprint_inputs([given], archive_limits(ingestor.settings), ingestor.settings.threads)
        except BaseException:
            ingestor.cancel(run)
            if tap is not None:
                tap.close()
            raise
        listener = NotesOf(early.listener(run.run_id)) if early is not None else None
        try:
            result = ingestor.complete(
                run, [given], progress(index), fingerprint=fingerprint, listener=listener, tap=tap
            )
        finally:
            if tap is not None:
                tap.close()  # reused, or stopped before copying: the other run's pairs no longer wait for it
        if early is not None:
            early.ready(run.run_id)  # the tensors of runs still ingesting pair with this one's rows
        return result

    try:
        with ThreadPoolExecutor(len(runs), thread_name_prefix="ingest-run") as pool:
            futures = [pool.submit(ingest, index) for index in range(len(runs))]
            try:
                for name in AFTER_INGEST:  # while the runs ingest: this thread would only wait
                    importlib.import_module(name)
                outcomes = [f.exception() or f.result() for f in futures]
            except BaseException:  # Ctrl-C: the runs stop where they are, dropped as if never begun
                interrupted.set()
                raise
    except BaseException:
        if interrupted.is_set():  # a run that was stored keeps the session (the same command takes it up again)
            with context.sessions() as db:
                left = db.get(SessionRecord, session_id)
                if left is not None and not left.runs:
                    catalog.delete_session(db, context.store, session_id)
        raise
    finally:
        if early is not None:
            early.settle()
    problems = [ProblemReport.of(p) for o in outcomes if isinstance(o, IngestResult) for p in o.problems]
    failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
    if failed is not None:
        with context.sessions() as db:
            # not when the run that made it failed last: its removal took the session along (both inputs missing)
            if db.get(SessionRecord, session_id) is not None:
                catalog.delete_session(db, context.store, session_id)
        if isinstance(failed, TensorDebuggerError):
            raise _Refused(failed, problems)
        raise failed
    if not locksteps:
        return session_id, problems, None
    counts = [lockstep.counts() for lockstep in locksteps]
    read_back: Counter[str] = Counter()
    for count in counts:
        read_back.update(count.read_back)
    return (
        session_id,
        problems,
        ReadOnce(
            sum(count.in_memory for count in counts),
            dict(read_back),
            max(count.most_kept for count in counts),
            sum(count.copied for count in counts),
        ),
    )


def _ingest_in_turn(
    ingestor: Ingestor,
    context: CompareContext,
    request: CompareRequest,
    session_name: str,
    runs: list[tuple[str, InputFile, str | None]],
    step: Callable[[str], Callable[[int, int], None] | None],
    resumed: Interrupted | None = None,
) -> tuple[int, list[ProblemReport], ReadOnce | None]:
    """Ingest the reference, then each other run while comparing its tensors with their reference partners as they
    land (`early.py`, which stops at the first divergence in execution order); as `_ingest_at_once`. Every run's
    row is begun first, so that while this compare lives its session holds a run "ingesting" under its process
    (what tells a killed compare's session from a live one: `interrupted.py`)."""
    problems: list[ProblemReport] = []
    session_id = resumed.session_id if resumed is not None else None
    reference_run_id = resumed.reference_run_id if resumed is not None else 0
    early: EarlyComparisons | None = None
    pending: list[PendingRun] = []
    done = 0  # of `pending`, ingested (or given up by `complete`)
    try:
        for label, given, role in runs[1:] if resumed is not None else runs:
            if pending or resumed is not None:
                pending.append(ingestor.begin(session_name, label, [given.label], by_label=False, role=role))
            else:
                pending.append(
                    _begin_session(ingestor, context, wanted_name(request), session_name, label, given, role)
                )
                session_name = pending[0].session_name
            session_id = pending[-1].session_id
        assert session_id is not None
        todo = runs[1:] if resumed is not None else runs
        for run, (label, given, role) in zip(pending, todo, strict=True):
            if role is None and reference_run_id:
                # the reference is ready: compare each candidate's tensors as they land
                if early is not None:
                    early.settle()
                with context.sessions.begin() as db:
                    session = catalog.get_session(db, session_id)
                    catalog.set_tolerances(session, request.rtol, request.atol, request.ulp)
                    catalog.set_noise_factor(session, request.noise_factor)
                early = EarlyComparisons(
                    context, session_id, reference_run_id, step("early"), fail_fast=request.fail_fast
                )
            try:
                fingerprint = fingerprint_inputs([given], archive_limits(ingestor.settings), ingestor.settings.threads)
            except BaseException:
                ingestor.cancel(run)
                done += 1
                raise
            done += 1
            result = ingestor.complete(
                run,
                [given],
                step(f"ingest {label}"),
                fingerprint=fingerprint,
                listener=early if role is None and reference_run_id else None,
            )
            if not reference_run_id:
                reference_run_id = result.run_id
            problems += [ProblemReport.of(p) for p in result.problems]
    except BaseException as exc:
        for run in reversed(pending[done:]):  # begun, never ingested
            ingestor.cancel(run)
        if not isinstance(exc, TensorDebuggerError):
            raise
        if early is not None:
            early.settle()  # before the session's arrays go
        if session_id is not None:
            with context.sessions() as db:
                if db.get(SessionRecord, session_id) is not None:  # not removed with its first run, never begun
                    catalog.delete_session(db, context.store, session_id)
        raise _Refused(exc, problems) from None
    finally:
        if early is not None:
            early.settle()  # done already when the candidate was ingested; not when it was refused or reused
    assert session_id is not None
    return session_id, problems, None


def compare_runs(
    ingestor: Ingestor,
    context: CompareContext,
    compute: Computation,
    request: CompareRequest,
    base_url: str,
    progress: StepProgress | None = None,
    where: str = "",
) -> CompareOutcome:
    """Ingest both runs, compare them, and say what the command prints; `base_url` leads the session's URL;
    `where`: the place its next capture's snippet stores into, as capture()'s keywords (", data_dir='/data'")."""
    sessions = context.sessions
    try:
        check_file(request.pairing)
    except InvalidInputError as exc:
        shown = request.pairing_shown
        return _unusable(f"pairing file {shown}: {exc}" if shown else str(exc), [])
    typed_inputs = [request.a_shown, *(typed for _, typed in request.candidates)]
    paths = [request.a, *(path for path, _ in request.candidates)]
    roles: list[str | None] = [None] * len(paths)
    if request.noise is not None:  # the rerun right after the reference: each candidate's pairs find their floor
        typed_inputs.insert(1, request.noise_shown or str(request.noise))
        paths.insert(1, request.noise)
        roles.insert(1, "noise")
    labels = run_labels(typed_inputs)
    runs = [
        (label, InputFile(path, typed), role)
        for label, path, typed, role in zip(labels, paths, typed_inputs, roles, strict=True)
    ]
    wanted = wanted_name(request)
    resumed = interrupted_session(ingestor, wanted, runs[0][0], runs[0][1])
    session_name = resumed.name if resumed is not None else free_name(sessions, wanted)

    def step(name: str) -> Callable[[int, int], None] | None:
        return None if progress is None else lambda done, total: progress(name, done, total)

    ingest = _ingest_in_turn if request.fail_fast else partial(_ingest_at_once, compare_early=not compute.remote)
    try:
        session_id, problems, read_once = ingest(ingestor, context, request, session_name, runs, step, resumed)
    except _Refused as refused:
        cause = refused.cause
        details = [ProblemReport.of(p) for p in cause.problems] if isinstance(cause, NothingUsableError) else []
        return _unusable(str(cause), refused.problems + details)
    if request.allow_unmatched:
        with sessions.begin() as db:
            catalog.get_session(db, session_id).allow_unmatched = list(request.allow_unmatched)
    if request.pairing:
        try:
            with sessions.begin() as db:
                import_pairing(db, session_id, request.pairing)
        except (InvalidInputError, ConflictError) as exc:  # a label or tensor name this session lacks
            with sessions() as db:
                catalog.delete_session(db, context.store, session_id)
            return _unusable(f"pairing file {request.pairing_shown}: {exc}", problems)
    from tensor_debugger.compare.planning.plan import plan_session
    from tensor_debugger.compare.reports.contract import compare_report
    from tensor_debugger.compare.reports.coverage import SessionVerdict
    from tensor_debugger.compare.reports.pair_reports import session_pairs

    plan_session(context, session_id)

    def stop() -> bool:
        return request.fail_fast and divergence_known(sessions, session_id)

    stopped: NoDaskWorkerError | None = None
    if not stop():
        try:
            compute(session_id, progress=step("compare"), should_stop=stop)
        except NoDaskWorkerError as exc:  # the cluster lost every worker: the pairs not computed stay pending
            stopped = exc
    with sessions() as db:
        report = session_pairs(db, session_id, modules=True)
        record = db.get(SessionRecord, session_id)
        deleted = record is None
        if record is not None:  # another command may have taken the name found free: the one made is said
            session_name = record.name
    if deleted:  # by a server's DELETE or its page meanwhile: what is left of the report is no verdict
        return _unusable(
            f"session {session_name!r} was deleted while it was compared (a server's DELETE or its page's Delete): "
            "nothing of it is kept, and there is no verdict",
            problems,
        )
    payload = compare_report(session_id, session_name, f"{base_url}/sessions/{session_id}", report, problems, where)
    if not report.pairs:
        return _unusable("no tensor of one run could be paired with a tensor of the other", problems, payload)
    if stopped is not None:  # pairs left pending: no verdict stands on them, and the command says why
        if payload.verdict == SessionVerdict.COMPARING:  # nothing compared is outside tolerance, but this is the end
            payload = msgspec.structs.replace(payload, verdict=str(SessionVerdict.INCOMPLETE))
        return _unusable(str(stopped), problems, payload)
    if unread_files(problems) or second_tensors(problems):  # tensors missing, or paired by a guess: not a pass
        return CompareOutcome(EXIT_UNUSABLE, payload, resumed=resumed is not None, read_once=read_once)
    # reference tensors without partner that the user did not allow, or pairs not compared: not a pass
    passed = report.verdict == SessionVerdict.NO_DIVERGENCE
    code = EXIT_PASS if passed else EXIT_FAIL
    return CompareOutcome(code, payload, resumed=resumed is not None, read_once=read_once)


def ingest_run(
    ingestor: Ingestor,
    context: CompareContext,
    session: str,
    run: str,
    inputs: list[InputFile],
    progress: StepProgress | None = None,
    against: str | None = None,
) -> IngestOutcome:
    """`tensor-debugger ingest`: add the run and plan the session (whoever serves the data dir computes the pairs).
    The payload: the session, the run and the problems; with "error" (exit code 2) when nothing was stored (or the
    run named by `against`, the one it is compared against, cannot be: nothing is read then)."""
    try:
        result = ingestor.ingest(
            session,
            run,
            inputs,
            progress=None if progress is None else lambda d, t: progress(f"ingest {run}", d, t),
            against=against,
        )
    except NothingUsableError as exc:
        problems = [ProblemReport.of(p) for p in exc.problems]
        return IngestOutcome(
            EXIT_UNUSABLE, IngestReport(session=None, run=None, problems=problems, error=str(exc)), str(exc)
        )
    except TensorDebuggerError as exc:
        return IngestOutcome(EXIT_UNUSABLE, IngestReport(session=None, run=None, problems=[], error=str(exc)), str(exc))
    from tensor_debugger.compare.planning.plan import plan_session

    plan_session(context, result.session_id)
    payload = IngestReport(
        session=IngestedSession(result.session_id, result.session_name),
        run=IngestedRun(result.run_id, result.run_label, result.tensors),
        problems=[ProblemReport.of(p) for p in result.problems],
    )
    return IngestOutcome(EXIT_PASS, payload)


def _unusable(message: str, problems: list[ProblemReport], payload: CompareReport | None = None) -> CompareOutcome:
    return CompareOutcome(EXIT_UNUSABLE, unusable_report(message, problems, payload), message)
