"""Ingest the files of one upload request: each form field is a run, labelled by the field's name (the field
`noise`: a rerun of the reference, whose pairs with it are each pair's noise floor).

Every run's row is made ("ingesting") while the request is open, then its ingest waits in the server's queue;
the request either returns at once (the session page shows the progress) or waits for the outcomes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from litestar import Request, Response
from litestar.status_codes import HTTP_201_CREATED, HTTP_202_ACCEPTED, HTTP_422_UNPROCESSABLE_ENTITY

from tensor_debugger.errors import InvalidInputError, NotFoundError, NothingUsableError
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.queue import IngestJob
from tensor_debugger.ingest.runs import IngestResult, PendingRun, is_noise_label, is_reference_label
from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.compared_against import compare_against_labels
from tensor_debugger.store.reports import ProblemReport, RunStatus, SessionDetail, problem_reports
from tensor_debugger.web.multipart import UploadBatch


@dataclass(frozen=True)
class RunOutcome:
    """What became of one run of an upload."""

    label: str
    run_id: int | None  # None: nothing usable was found, and no run was kept
    status: RunStatus  # "ready", "failed" (nothing kept) or "ingesting" (the request did not wait)
    tensors: int = 0
    problems: list[ProblemReport] = field(default_factory=list)
    # what the session takes it for once stored: "reference", "candidate" or "noise" (a run uploaded alone, labelled
    # "candidate", is the session's reference); None where it was not stored, or where the response does not say
    role: str | None = None

    @property
    def stored(self) -> bool:
        return self.run_id is not None


@dataclass(frozen=True)
class RunOutcomes:
    """201 (some run was stored) or 422 (none was)."""

    runs: list[RunOutcome]


@dataclass(frozen=True)
class UploadCreated:
    """201: the new session, and what became of each run."""

    runs: list[RunOutcome]
    session: SessionDetail


@dataclass(frozen=True)
class UploadRejected:
    """422: nothing usable in any run; the session was not kept."""

    runs: list[RunOutcome]
    detail: str


@dataclass(frozen=True)
class UploadAccepted:
    """202: the upload is on disk and its runs are queued; `url` (the session page) and `progress` follow them."""

    session: SessionDetail
    runs: list[RunOutcome]
    url: str
    progress: str


@dataclass(frozen=True)
class StartedRun:
    label: str
    pending: PendingRun
    result: Future[IngestResult]

    def accepted(self) -> RunOutcome:
        return RunOutcome(self.label, self.pending.run_id, RunStatus.INGESTING)


# the form field of a rerun of the reference: the noise floor of each pair (compare/noise.py); a run labelled
# "noise (...)" is a rerun too (ingest/runs.is_noise_label)
NOISE_FIELD = "noise"


def client_of(request: Request[Any, Any, Any]) -> str:
    """Who sent a request, for the ingest queue's turns: its address (a trusted proxy's X-Forwarded-For)."""
    return request.client.host if request.client is not None else ""


def group_by_run(batch: UploadBatch, default_label: str | None = None) -> dict[str, list[InputFile]]:
    """Files grouped by form field, in the order the fields first appear; `default_label` overrides them."""
    runs: dict[str, list[InputFile]] = {}
    for upload in batch.files:
        label = default_label or upload.field or "run"
        runs.setdefault(label, []).append(InputFile(upload.path, upload.filename))
    return runs


def start_runs(
    services: Services,
    session_name: str,
    batch: UploadBatch,
    runs: dict[str, list[InputFile]],
    keep_failure: bool,
    created_session: bool = False,
    client: str = "",
    against: str | None = None,
    links: dict[str, str] | None = None,
) -> list[StartedRun]:
    """Make every run's row, then queue their ingests. From here on the queue owns `batch`: its files are
    removed once the last of these ingests is over. `keep_failure`: a run with nothing usable stays, "failed",
    with its problems (for the session page); otherwise it is removed. `created_session`: the request made
    the session, so removing its last run (a restart cutting an ingest short, say) removes it too. `client`: who
    sent the upload; the queue gives each client its turn (ingest/fair_line.py). `against`: the label of the
    session's run every one of these is compared against (refused, nothing begun, where it cannot be); `links`:
    the run each of some of these is compared against, by label (one of these runs; refused likewise: none begun)."""
    begun: list[tuple[str, PendingRun, list[InputFile]]] = []
    try:
        for label, inputs in runs.items():
            pending = services.ingestor.begin(
                session_name,
                label,
                [i.label for i in inputs],
                create_session=False,
                created_session=created_session,
                role="noise" if is_noise_label(label) else None,
                staged=inputs if keep_failure else (),
                against=against,
            )
            begun.append((label, pending, inputs))
        if links and begun:  # once every run of the upload has its row: a run may name one begun after it
            with services.sessions.begin() as db:
                compare_against_labels(db, begun[0][1].session_id, links)
    except BaseException:
        for _, pending, _ in reversed(begun):
            services.ingestor.cancel(pending)
        raise
    release = _after_last(len(begun), batch.discard)
    jobs = [
        (label, pending, IngestJob(pending, inputs, keep_failure, release, client)) for label, pending, inputs in begun
    ]
    if created_session and len(jobs) == 2 and NOISE_FIELD not in runs:
        # a reference and a candidate: ingested at once, their pairs compared from the bytes as they are read
        # the reference first: the field labelled "reference" where the second is (it was given position 0)
        second_first = is_reference_label(jobs[1][0]) and not is_reference_label(jobs[0][0])
        try:
            if second_first:
                futures = services.ingests.submit_pair(jobs[1][2], jobs[0][2])[::-1]
            else:
                futures = services.ingests.submit_pair(jobs[0][2], jobs[1][2])
        except BaseException:  # the server is stopping: the runs are undone here
            for _, pending, _ in begun:
                services.ingestor.cancel(pending)
                release()
            raise
        return [StartedRun(label, pending, future) for (label, pending, _), future in zip(jobs, futures, strict=True)]
    started: list[StartedRun] = []
    for n, (label, pending, job) in enumerate(jobs):
        try:
            started.append(StartedRun(label, pending, services.ingests.submit(job)))
        except BaseException:  # the server is stopping: the runs not queued are undone here
            for _, rest, _ in begun[n:]:
                services.ingestor.cancel(rest)
                release()
            raise
    return started


def start_session(
    services: Services,
    name: str,
    notes: str,
    batch: UploadBatch,
    keep_failure: bool,
    label: str | None = None,
    client: str = "",
    links: dict[str, str] | None = None,
) -> tuple[int, list[StartedRun]]:
    """A new session with a run per form field (`label`: one run of every file), each queued for ingest (see
    `start_runs`; `links`: the run each of some of them is compared against, by label)."""
    with services.sessions.begin() as db:
        session = catalog.create_session(db, name, notes)
        session_id, name = session.id, session.name
    try:
        return session_id, start_runs(
            services,
            name,
            batch,
            group_by_run(batch, label),
            keep_failure,
            created_session=True,
            client=client,
            links=links,
        )
    except BaseException:
        delete_if_empty(services, session_id)
        raise


def explore_session(
    services: Services,
    name: str,
    notes: str,
    batch: UploadBatch,
    match: str | None,
    filter_hint: str,
    client: str = "",
) -> tuple[int, list[RunOutcome]]:
    """A new session of one run (every file of the upload), ingested, then explored: each of its tensors paired
    with every other whose name matches `match` (SessionActions.explore). Waits for the ingest. When no tensor
    was found the session is gone (the outcomes say why); when the exploration is refused (too many pairs), the
    session is removed and InvalidInputError says why."""
    first = batch.files[0]
    session_id, started = start_session(services, name, notes, batch, False, first.field or "run", client)
    outcomes = wait_for_runs(started)
    if not any(o.stored for o in outcomes):
        delete_if_empty(services, session_id)
        return session_id, outcomes
    try:
        services.actions.explore(session_id, match or None, filter_hint)
    except BaseException:
        with services.sessions() as db:
            catalog.delete_session(db, services.store, session_id)
        raise
    return session_id, outcomes


def delete_if_empty(services: Services, session_id: int) -> None:
    """Remove a session an upload made, when none of its runs was kept (each run's undo may have already)."""
    with services.sessions() as db:
        try:
            session = catalog.get_session(db, session_id)
        except NotFoundError:
            return
        if not session.runs:
            catalog.delete_session(db, services.store, session_id)


def wait_for_runs(started: list[StartedRun]) -> list[RunOutcome]:
    """Block until every run's ingest is over."""
    outcomes: list[RunOutcome] = []
    for run in started:
        try:
            result = run.result.result()
        except NothingUsableError as exc:
            outcomes.append(RunOutcome(run.label, None, RunStatus.FAILED, 0, problem_reports(exc.problems)))
        else:
            outcomes.append(
                RunOutcome(run.label, result.run_id, RunStatus.READY, result.tensors, problem_reports(result.problems))
            )
    return outcomes


def _after_last(count: int, action: Callable[[], None]) -> Callable[[], None]:
    """A callable that runs `action` on its `count`-th call (from whichever thread makes it)."""
    left = [count]
    lock = threading.Lock()

    def release() -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            action()

    if count == 0:
        action()
    return release


def accepted(services: Services, session_id: int, started: list[StartedRun]) -> Response[Any]:
    """An `UploadAccepted`, 202: the upload is on disk and its runs are queued; the session page and `progress`
    follow them."""
    page = f"/sessions/{session_id}"
    with services.sessions() as db:
        session = SessionDetail.of(catalog.get_session(db, session_id))
    return Response(
        UploadAccepted(session, [s.accepted() for s in started], page, f"/api/sessions/{session_id}/progress"),
        status_code=HTTP_202_ACCEPTED,
        headers={"location": page},
    )


def created(services: Services, session_id: int, outcomes: list[RunOutcome]) -> Response[Any]:
    """An `UploadCreated`, 201 with the session (its failed runs too), or an `UploadRejected`, 422 (and the session
    removed with its failed runs) when no run was stored."""
    if not any(o.stored for o in outcomes):
        with services.sessions() as db, contextlib.suppress(NotFoundError):
            catalog.delete_session(db, services.store, session_id)
        return Response(
            UploadRejected(outcomes, "no tensors found in any upload; the session was not kept"),
            status_code=HTTP_422_UNPROCESSABLE_ENTITY,
        )
    with services.sessions() as db:
        session = SessionDetail.of(catalog.get_session(db, session_id))
    return Response(UploadCreated(_with_roles(session, outcomes), session), status_code=HTTP_201_CREATED)


def _with_roles(session: SessionDetail, outcomes: list[RunOutcome]) -> list[RunOutcome]:
    """`outcomes`, each stored run's with the role the session takes it for."""
    roles = {r.id: str(r.role) for r in session.runs}
    return [dataclasses.replace(o, role=roles.get(o.run_id)) if o.run_id is not None else o for o in outcomes]


def with_roles(services: Services, session_id: int, outcomes: list[RunOutcome]) -> list[RunOutcome]:
    """`outcomes` of runs added to session `session_id`, each stored run's with the role the session takes it for
    (a run uploaded into a session with no run yet, labelled "candidate", is its reference)."""
    with services.sessions() as db:
        session = SessionDetail.of(catalog.get_session(db, session_id))
    return _with_roles(session, outcomes)


def against_links(text: str | None, batch: UploadBatch) -> dict[str, str]:
    """`POST /api/sessions`'s `against` query parameter: a JSON object from the label of a run of the upload to the
    label of the upload's run it is compared against (`{"late": "early"}`); {} where it is left out.
    InvalidInputError naming the problem (not a JSON object of labels, a label the upload has no run of)."""
    if text is None:
        return {}
    try:
        links = json.loads(text)
    except ValueError as exc:
        raise InvalidInputError(f'against: not JSON ({exc}); give an object such as {{"late": "early"}}') from None
    if not isinstance(links, dict) or not all(isinstance(v, str) for v in links.values()):
        raise InvalidInputError(
            "against: give a JSON object from a run's label to the label of the run it is compared against, such as "
            '{"late": "early"}'
        )
    labels = list(group_by_run(batch))
    for label, other in links.items():
        for named in (label, other):
            if named not in labels:
                raise InvalidInputError(
                    f"against: the upload has no run labelled {named!r} (its runs: "
                    f"{', '.join(repr(x) for x in labels) or 'none'})"
                )
    return {str(k): str(v) for k, v in links.items()}
