from __future__ import annotations

from functools import partial
from typing import Annotated, Any

import anyio
import msgspec
from litestar import Controller, Request, Response, delete, get, patch, post
from litestar.di import NamedDependency
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, QueryParameter
from litestar.status_codes import HTTP_201_CREATED, HTTP_422_UNPROCESSABLE_ENTITY

from tensor_debugger.compare.reports.progress import SessionProgress, pair_progress, session_progress
from tensor_debugger.engine.pairing import STRATEGIES
from tensor_debugger.errors import InvalidInputError, NothingUsableError, TooLargeError
from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.catalog import MAX_LABEL, MAX_NOTES, MAX_ULP
from tensor_debugger.store.reports import SessionDetail, SessionReport
from tensor_debugger.web.error_responses import CHANGES, JSON_BODY, ErrorReport, error_responses
from tensor_debugger.web.json_bodies import JSON_BODY_LIMIT, StrictBody, read_json
from tensor_debugger.web.multipart import MultipartLimits, UploadBatch, receive_multipart
from tensor_debugger.web.rule_schemas import STRATEGY_DESCRIPTION, STRATEGY_PATTERN, chain_rules
from tensor_debugger.web.upload_bodies import NAME_PATTERN, AddRunsOperation, CreateSessionOperation
from tensor_debugger.web.uploads import (
    RunOutcomes,
    UploadAccepted,
    UploadCreated,
    UploadRejected,
    accepted,
    against_links,
    client_of,
    created,
    explore_session,
    group_by_run,
    start_runs,
    start_session,
    wait_for_runs,
    with_roles,
)

UPLOAD_LIMIT_NOTE = "Upload size is limited by the max_upload_bytes setting."
WAIT_NOTE = (
    "Answers once every run is ingested (201 with the runs, or 422 with every file's problem when "
    "nothing usable was found, and nothing kept); with `?wait=false`, 202 as soon as the upload is on "
    "disk (`url`: the session page, `progress`: what to poll), the ingest going on in the background."
)
UPLOAD_RESPONSES = {
    **error_responses(*CHANGES, 409, 413, 507),
    202: ResponseSpec(UploadAccepted, description="the upload is on disk; its runs are ingested in the background"),
    422: ResponseSpec(
        UploadRejected | ErrorReport,
        description="nothing usable was found in any run, or the upload held no file (nothing was kept), or a "
        "file could not be used",
        generate_examples=False,
    ),
}
EXPLORE = QueryParameter(
    description="true: every file is one run, and the session compares each of its "
    "tensors with every other (as `tensor-debugger explore`); always waits for the ingest, and "
    "answers 400 past 5,000 pairs, asking for `match`",
)
MATCH = QueryParameter(description="with explore: only tensors whose names match this glob (any case)")
EXPLORE_FILTER = "the match parameter (e.g. match=*attn*)"
AGAINST = QueryParameter(
    description="with files: a JSON object from a run's label to the label of the upload's run it is compared "
    'against, not the reference ({"late": "early"}); 400 naming a label the upload has no run of, a run compared '
    "against itself, the reference, or a cycle (nothing is stored); at most 1,024 characters",
    # a URL past the HTTP server's 16 KiB request head is refused before the app sees it, in plain text: 1,024
    # characters of any text, percent-encoded (12 bytes a character at most), stay well inside it
    max_length=1024,
)
WAIT = QueryParameter(
    description="false: answer 202 once the upload is on disk and ingest in the "
    'background; a run with nothing usable is then kept as "failed" with its problems',
)


SessionName = Annotated[
    str,
    msgspec.Meta(
        min_length=1, max_length=MAX_LABEL, pattern=NAME_PATTERN, description="not only spaces, no control characters"
    ),
]
Notes = Annotated[str, msgspec.Meta(max_length=MAX_NOTES)]
Glob = Annotated[str, msgspec.Meta(max_length=500, description="a glob of tensor names, as fnmatch reads it")]
# the ranges catalog.set_tolerances checks, in the schema too: a client generated from it never sends another
# (`extra`: Litestar leaves out a bound of 0, falsy, from the schema it makes of `ge`)
Tolerance = Annotated[
    float, msgspec.Meta(ge=0.0, description="a non-negative number", extra_json_schema={"extra": {"minimum": 0}})
]
Ulps = Annotated[int, msgspec.Meta(ge=1, le=MAX_ULP, description="whole units in the last place")]
StrategyChain = Annotated[
    list[Annotated[str, msgspec.Meta(pattern=STRATEGY_PATTERN)]],
    msgspec.Meta(
        max_length=len(STRATEGIES), description=STRATEGY_DESCRIPTION, extra_json_schema={"extra": chain_rules()}
    ),
]


class SessionPatch(msgspec.Struct, forbid_unknown_fields=True):
    name: SessionName | None = None
    notes: Notes | None = None
    rtol: Tolerance | None = None  # the session's tolerances; verdicts follow
    atol: Tolerance | None = None
    default_tolerances: bool = False  # true: back to torch.testing's defaults per dtype
    ulp: Ulps | None = None  # pass within this many ULPs of each pair's lower-precision dtype, instead of rtol/atol
    # the chain of pairing strategies, a list of names (["name", "fuzzy:0.8"]); []: the default chain. A change
    # pairs the session again.
    strategies: StrategyChain | None = None
    name_pattern: str | None = None  # a regex with groups layer and stage (and rank); "": none
    # globs of reference tensor names that may have no partner in a candidate (as compare --allow-unmatched); []:
    # none. A change pairs the session again: any other reference tensor without partner keeps it incomplete.
    allow_unmatched: Annotated[list[Glob], msgspec.Meta(max_length=100)] | None = None
    # names of the tensors' aligned dimensions, by name glob: {"*attn*": "batch,heads,tokens,head_dim"}; {}: none
    dims: dict[str, str] | None = None


class SessionCreate(msgspec.Struct, forbid_unknown_fields=True):
    name: SessionName
    notes: Notes = ""


class SessionController(Controller):
    path = "/api/sessions"
    tags = ["sessions"]

    @get("/", sync_to_thread=True, responses=error_responses())
    def list_sessions(
        self,
        services: NamedDependency[Services],
        q: Annotated[str | None, QueryParameter(description="name contains")] = None,
    ) -> list[SessionReport]:
        with services.sessions() as db:
            return [SessionReport.of(s) for s in catalog.list_sessions(db, q)]

    @get("/{session_id:int}", sync_to_thread=True, responses=error_responses(404))
    def show_session(self, services: NamedDependency[Services], session_id: FromPath[int]) -> SessionDetail:
        with services.sessions() as db:
            return SessionDetail.of(catalog.get_session(db, session_id))

    @patch(
        "/{session_id:int}",
        sync_to_thread=True,
        request_max_body_size=JSON_BODY_LIMIT,
        responses=error_responses(
            *CHANGES,
            *JSON_BODY,
            404,
            409,
            depends_on_state="gives a `name_pattern` that is not a regular expression with named groups layer and "
            "stage (and no other but rank), or `dims` with a name that is not a dimension name (a letter or _, then "
            "letters, digits, _ . -) or a name twice",
        ),
    )
    def update_session(
        self, services: NamedDependency[Services], session_id: FromPath[int], data: StrictBody[SessionPatch]
    ) -> SessionReport:
        """Every field optional. New pairing rules (`strategies`, `name_pattern`) are checked as the CLI checks
        them (400 naming the problem, nothing changed) and pair the session again, as new `allow_unmatched` globs
        do; new tolerances refresh its verdicts. `dims` names dimensions (a glob's names apply to the pairs it matches
        whose aligned rank is their count): `where` and the error profiles show them."""
        return services.actions.update_session(
            session_id,
            data.name,
            data.notes,
            data.rtol,
            data.atol,
            data.default_tolerances,
            data.strategies,
            data.name_pattern,
            ulp=data.ulp,
            allow_unmatched=data.allow_unmatched,
            dims=data.dims,
        )

    @delete("/{session_id:int}", sync_to_thread=True, responses=error_responses(*CHANGES, 404, 409))
    def delete_session(self, services: NamedDependency[Services], session_id: FromPath[int]) -> None:
        with services.sessions() as db:
            catalog.get_session(db, session_id)
            catalog.refuse_while_ingesting(db, session_id)
            catalog.delete_session(db, services.store, session_id)

    @get("/{session_id:int}/progress", sync_to_thread=True, responses=error_responses(404))
    def show_progress(self, services: NamedDependency[Services], session_id: FromPath[int]) -> SessionProgress:
        """How far the session has come: each run's ingest (`stage`, bytes copied of the total while it runs),
        then its pairs compared. `stage` is "ingesting", "planning", "comparing", then "done"."""
        live = services.ingests.snapshot()  # before the database: see session_progress
        with services.sessions() as db:
            session = catalog.get_session(db, session_id)
            pairs = pair_progress(db, session_id)
            return session_progress(
                session, live, pairs, services.early.figures(session_id), services.compute.waiting_for
            )

    @post(
        "/",
        request_max_body_size=None,
        responses={
            **UPLOAD_RESPONSES,
            **error_responses(
                *CHANGES,
                409,
                413,
                507,
                depends_on_state="names in `against` a run label the upload does not have, or links its runs so "
                "that one is compared against itself, the reference, or in a cycle",
            ),
        },
        operation_class=CreateSessionOperation,
        description="JSON {name, notes} for an empty session, or multipart/form-data: a `name` field and files "
        "whose field name is their run's label (the first run "
        "is the reference; with `?explore=true`, one run explored). A name a session has already gets ' (2)' "
        "(the first number free), as the command line's `compare` does: the response's `name` is the session's. "
        + WAIT_NOTE
        + " "
        + UPLOAD_LIMIT_NOTE,
    )
    async def create_session(
        self,
        services: NamedDependency[Services],
        request: Request[Any, Any, Any],
        wait: Annotated[bool, WAIT] = True,
        explore: Annotated[bool, EXPLORE] = False,
        match: Annotated[str | None, MATCH] = None,
        against: Annotated[str | None, AGAINST] = None,
    ) -> Response[SessionReport | UploadCreated]:
        content_type = request.headers.get("content-type", "")
        if against is not None and (explore or not content_type.startswith("multipart/")):
            raise InvalidInputError("against: only for an upload of runs (multipart/form-data), not with explore")
        if content_type.startswith("application/json"):
            body = await read_json(request, SessionCreate)
            return Response(await anyio.to_thread.run_sync(_create_empty, services, body), status_code=201)
        _check_length(request, services)
        batch = await receive_multipart(
            content_type, request.stream(), services.settings.staging_dir, MultipartLimits.of(services.settings)
        )
        if explore:
            return await _explore(services, batch, match, client_of(request))
        try:
            if not batch.files:
                raise NothingUsableError([])  # 422, as an upload of files that hold nothing usable
            name = batch.fields.get("name", "").strip() or batch.files[0].filename
            links = against_links(against, batch)  # checked before the session is made: a wrong label stores nothing
            # a run with nothing usable stays, failed, with its problems, beside the runs that were stored (the
            # session's page says why its reference is missing, say); `created` removes all when none was
            session_id, started = await anyio.to_thread.run_sync(
                partial(
                    start_session,
                    services,
                    name,
                    batch.fields.get("notes", ""),
                    batch,
                    True,
                    client=client_of(request),
                    links=links,
                )
            )
        except BaseException:
            batch.discard()
            raise
        if not wait:
            return await anyio.to_thread.run_sync(accepted, services, session_id, started)
        outcomes = await anyio.to_thread.run_sync(wait_for_runs, started)
        return await anyio.to_thread.run_sync(created, services, session_id, outcomes)

    @post(
        "/{session_id:int}/runs",
        request_max_body_size=None,
        operation_class=AddRunsOperation,
        responses={
            **UPLOAD_RESPONSES,
            **error_responses(
                *CHANGES,
                404,
                409,
                413,
                depends_on_state="names in `against` a run the session does not have (or the label of a run it adds)",
            ),
            422: ResponseSpec(
                RunOutcomes | ErrorReport,
                description="nothing usable was found in any run (nothing was kept), or a file could not be used",
                generate_examples=False,
            ),
        },
        description="multipart/form-data: files whose field name is their run's label, or `?label=` for all; "
        "`?against=` names the run they are compared against (400 where the session has no such run). "
        + WAIT_NOTE
        + " "
        + UPLOAD_LIMIT_NOTE,
    )
    async def add_runs(
        self,
        services: NamedDependency[Services],
        request: Request[Any, Any, Any],
        session_id: FromPath[int],
        label: Annotated[
            str | None,
            QueryParameter(description="run label for every file", max_length=MAX_LABEL, pattern=NAME_PATTERN),
        ] = None,
        wait: Annotated[bool, WAIT] = True,
        against: Annotated[
            str | None,
            QueryParameter(
                description="the label of the session's run these runs are compared against (default: the "
                "session's reference)",
                max_length=MAX_LABEL,
                pattern=NAME_PATTERN,
            ),
        ] = None,
    ) -> Response[RunOutcomes]:
        session_name = await anyio.to_thread.run_sync(_session_name, services, session_id)
        _check_length(request, services)
        batch = await receive_multipart(
            request.headers.get("content-type", ""),
            request.stream(),
            services.settings.staging_dir,
            MultipartLimits.of(services.settings),
        )
        try:
            if not batch.files:
                raise NothingUsableError([])  # 422, as an upload of files that hold nothing usable
            started = await anyio.to_thread.run_sync(
                partial(
                    start_runs,
                    services,
                    session_name,
                    batch,
                    group_by_run(batch, label),
                    not wait,
                    client=client_of(request),
                    against=against,
                )
            )
        except BaseException:
            batch.discard()
            raise
        if not wait:
            return await anyio.to_thread.run_sync(accepted, services, session_id, started)
        outcomes = await anyio.to_thread.run_sync(wait_for_runs, started)
        stored = any(o.stored for o in outcomes)
        if stored:
            outcomes = await anyio.to_thread.run_sync(with_roles, services, session_id, outcomes)
        return Response(
            RunOutcomes(outcomes), status_code=HTTP_201_CREATED if stored else HTTP_422_UNPROCESSABLE_ENTITY
        )


async def _explore(services: Services, batch: UploadBatch, match: str | None, client: str) -> Response[Any]:
    try:
        if not batch.files:
            raise NothingUsableError([])  # 422, as an upload of files that hold nothing usable
        name = batch.fields.get("name", "").strip() or f"explore {batch.files[0].filename}"
        session_id, outcomes = await anyio.to_thread.run_sync(
            explore_session, services, name, batch.fields.get("notes", ""), batch, match, EXPLORE_FILTER, client
        )
    except BaseException:
        batch.discard()
        raise
    return await anyio.to_thread.run_sync(created, services, session_id, outcomes)


def _check_length(request: Request[Any, Any, Any], services: Services) -> None:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > services.settings.max_upload_bytes:
        raise TooLargeError(f"upload of {length} bytes exceeds max_upload_bytes={services.settings.max_upload_bytes}")


def _session_name(services: Services, session_id: int) -> str:
    with services.sessions() as db:
        return catalog.get_session(db, session_id).name


def _create_empty(services: Services, body: SessionCreate) -> SessionReport:
    with services.sessions.begin() as db:
        return SessionReport.of(catalog.create_session(db, body.name, body.notes))
