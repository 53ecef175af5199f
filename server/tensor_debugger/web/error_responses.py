"""Every refusal the API can answer, as one typed body, and declared in the OpenAPI document for each operation
that can answer it (a test runs Schemathesis over the document: an undeclared status code fails it)."""

from __future__ import annotations

import msgspec
from litestar.openapi import ResponseSpec

from tensor_debugger.store.reports import ProblemReport

MAX_INT64 = 2**63 - 1  # ids are SQLite integers: a larger one names nothing


class ErrorReport(msgspec.Struct, frozen=True, omit_defaults=True):
    """A refusal: its status again and why (`problems`: each file's, when an upload had nothing usable)."""

    status_code: int
    detail: str
    problems: list[ProblemReport] | None = None


WHY = {
    400: "the request is malformed (the detail says what and where), or its Host is not a name this server answers to",
    401: "a server with a token (TENSOR_DEBUGGER_TOKEN) wants `Authorization: Bearer <token>`",
    403: "a browser's request from another site, or a read-only token, which may not change anything here",
    404: "no such session, run, pair or tensor (an id outside 0 to 2^63-1 names none)",
    409: "a session name or run label that is taken, a session still ingesting a run, or a pair that is incomparable "
    "(no aligned values to read): the detail names it",
    413: "the body is larger than this operation takes",
    422: "the files have nothing usable (`problems` says why for each)",
    503: "the database or the array store did not answer (`detail` says which): try again after `Retry-After` seconds",
    507: "out of disk space: nothing of the upload was kept, or its run is 'failed' saying so",
    500: "a stored chunk this read needs is missing (`detail` names its file or object): the data dir is damaged, "
    "and no value is answered in its place",
}

CHANGES = (403,)  # every POST, PUT, PATCH and DELETE
JSON_BODY = (413,)  # every operation that takes a JSON body: it is bounded in size
READS_VALUES = (500,)  # every operation that may read a tensor's stored values (web/refusals.py's damaged_store)


# How a 400 that depends on what the server holds is declared: a request that fits the document can still name
# something the session does not have. The fuzzing test accepts a 400 from a valid request only where the operation
# declares one so (tests/web/test_api_fuzzing.py looks for these words).
DEPENDS_ON_STATE = "A request that fits this document is refused with 400 too when it"


def error_responses(*statuses: int, depends_on_state: str | None = None) -> dict[int, ResponseSpec]:
    """The declarations of `statuses` (and 400, 401 and 503, which every operation can answer: 401 where the server
    has a token, 503 while the database or the store is down) for a handler's `responses`. `depends_on_state`:
    what else makes this operation answer 400 that the document cannot say (a name the session does not hold)."""
    why = dict(WHY)
    if depends_on_state:
        why[400] = f"{WHY[400]}. {DEPENDS_ON_STATE} {depends_on_state}"
    return {
        status: ResponseSpec(ErrorReport, description=why[status], generate_examples=False)
        for status in sorted({400, 401, 503, *statuses})
    }
