"""Schemathesis over the OpenAPI document of a real server: for every operation, generated requests that fit the
schema and requests that break it, each answer checked by every check Schemathesis has (no 5xx; the status code,
content type and body as the document says; invalid requests refused with a 4xx, valid ones accepted).

The operations run through Schemathesis's Python API (each operation's Hypothesis strategy, `call_and_validate`),
a bounded number of examples each, derandomized so that every run sends the same requests."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase
from tensor_debugger.web.error_responses import DEPENDS_ON_STATE

from tests.support import loopback_http as http
from tests.support.servers import LiveServer, started_with_demo

Operation = schemathesis.APIOperation[Any, Any, Any, Any]
SENT: dict[str, int] = {}  # requests sent per mode, for `make fuzz`'s summary line
# per operation, mode and pass; `make fuzz` runs more (FUZZ_EXAMPLES)
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "5"))

# The uploads take any file and say what is wrong with it: schema-valid bytes that are not a tensor file are
# refused with 422 naming each file's problem, which the schema cannot say in advance.
UPLOADS = ["POST /api/sessions", "POST /api/sessions/{session_id}/runs"]
# The operations that take names of tensors, runs or dimensions, slices, alignment steps or a name pattern: a request
# that fits the document but names nothing usable is refused with 400 saying what it named (never a 5xx, never
# undocumented). Each declares so in its 400's description; the test checks that these are the ones that do.
STATEFUL = {
    "PATCH /api/sessions/{session_id}",
    "PUT /api/sessions/{session_id}/pairing",
    "GET /api/sessions/{session_id}/alignments",
    "POST /api/sessions/{session_id}/pairs",
    "PUT /api/pairs/{pair_id}/alignment",
    "GET /api/pairs/{pair_id}/slice",
    "GET /api/pairs/{pair_id}/profile",
    "GET /api/sessions/{session_id}/profiles",
    "POST /api/sessions",  # `against`: labels the upload may not have
    "POST /api/sessions/{session_id}/runs",  # `against`: a label the session may not have
    "PUT /api/runs/{run_id}/compared-against",  # a run of another session, itself, the reference, a cycle
}


def depending_on_state(document: dict[str, Any]) -> list[str]:
    """The operations that declare a 400 a valid request can get: one naming what the session does not hold (a
    tensor, a run's label, a dimension past a pair's rank), which the document cannot say in advance."""
    return [
        f"{method.upper()} {path}"
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if DEPENDS_ON_STATE in operation.get("responses", {}).get("400", {}).get("description", "")
    ]


def fuzzing_config(document: dict[str, Any]) -> schemathesis.Config:
    """Every check, each with its documented expectations; a valid request may get 404 or 409 (what it names is
    gone, or taken), and 400 only where its operation declares why (DEPENDS_ON_STATE)."""
    operations: list[dict[str, Any]] = [
        {
            "include-name": UPLOADS,
            "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "404", "409", "422"]}},
        }
    ]
    if stateful := depending_on_state(document):
        operations.append(
            {
                "include-name": stateful,
                "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "400", "404", "409"]}},
            }
        )
    return schemathesis.Config.from_dict({"checks": {"enabled": True}, "operations": operations})


@pytest.fixture(scope="module")
def fuzzed_server(tmp_path_factory: pytest.TempPathFactory, demo_data: Path) -> Iterator[LiveServer]:
    """A server of its own (the requests rename, change and delete what they find), with the demo session: its
    session, runs, pairs and tensors all have id 1."""
    server = started_with_demo(demo_data, tmp_path_factory.mktemp("fuzzed"))
    yield server
    server.stop()


def failures_of(
    operation: Operation,
    mode: schemathesis.GenerationMode,
    base_url: str,
    path_parameters: dict[str, Any] | None = None,
) -> str | None:
    """What the checks found over a bounded, reproducible set of generated requests (None: nothing)."""

    @hypothesis.settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: the report names the request that failed
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode, path_parameters=path_parameters))
    def run(case: schemathesis.Case[Operation]) -> None:
        SENT[mode.value] = SENT.get(mode.value, 0) + 1
        case.call_and_validate(base_url=base_url)

    try:
        run()
    except (BaseExceptionGroup, Exception) as exc:  # every distinct failure of one request, or a transport error
        where = f" with {path_parameters}" if path_parameters else ""
        return f"{mode.value} {operation.label}{where}: {exc}"
    return None


def passes(operation: Operation, mode: schemathesis.GenerationMode) -> list[dict[str, Any] | None]:
    """Generated ids, which mostly name nothing; then, for valid requests, the demo's ids, so that the requests
    reach what the operation does with a session, run, pair or tensor. None for the invalid requests of an operation
    that takes nothing."""
    names = re.findall(r"{(\w+)}", operation.path)
    takes = (operation.query, operation.path_parameters, operation.headers, operation.cookies, operation.body)
    if mode == schemathesis.GenerationMode.NEGATIVE and not any(len(part) for part in takes):
        return []  # takes nothing (GET /healthz): no request of it can break a rule
    if not names or mode != schemathesis.GenerationMode.POSITIVE:
        return [None]
    return [None, dict.fromkeys(names, 1)]


@pytest.mark.parametrize("mode", [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])
def test_every_operation_answers_as_documented(fuzzed_server: LiveServer, mode: schemathesis.GenerationMode) -> None:
    document = http.get(fuzzed_server.url + "/schema/openapi.json").json()
    assert set(depending_on_state(document)) == STATEFUL, "the operations whose 400 depends on what the server holds"
    schema = schemathesis.openapi.from_dict(document, config=fuzzing_config(document))
    operations = [schema[path][method] for path in schema for method in schema[path]]
    assert len(operations) >= 20
    operations.sort(key=lambda op: op.method.upper() == "DELETE")  # deletions last: the demo's ids name it till then
    found = [
        failure
        for op in operations
        for ids in passes(op, mode)
        if (failure := failures_of(op, mode, fuzzed_server.url, ids)) is not None
    ]
    sent = SENT.get(mode.value, 0)
    print(f"\nfuzzing, {mode.value}: {sent} requests, {len(operations)} operations, {len(found)} failed")
    assert not found, f"{len(found)} failed (of {len(operations)} operations):\n\n" + "\n\n".join(found)
