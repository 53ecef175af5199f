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

from tests.support.servers import LiveServer, started_with_demo

Operation = schemathesis.APIOperation[Any, Any, Any, Any]
# per operation, mode and pass; `make fuzz` runs more (FUZZ_EXAMPLES)
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "5"))

# The uploads take any file and say what is wrong with it: schema-valid bytes that are not a tensor file are
# refused with 422 naming each file's problem, which the schema cannot say in advance.
UPLOADS = ["POST /api/sessions", "POST /api/sessions/{session_id}/runs"]
# These take names of tensors, pairing strategies, regular expressions, alignment steps, index windows or
# dimensions, which must name what the session holds or what the engine knows: the schema says their type, and a
# request that fits it but names nothing usable is refused with 400 saying what it named (never a 5xx, never
# undocumented).
CHECKED_AGAINST_THE_SESSION = [
    "PATCH /api/sessions/{session_id}",
    "PUT /api/sessions/{session_id}/pairing",
    "GET /api/sessions/{session_id}/alignments",
    "POST /api/sessions/{session_id}/pairs",
    "PUT /api/pairs/{pair_id}/alignment",
    "GET /api/pairs/{pair_id}/slice",
    "GET /api/pairs/{pair_id}/profile",
    "GET /api/sessions/{session_id}/profiles",  # `dim`'s minimum is in the schema of newer Litestar versions only
]


def fuzzing_config() -> schemathesis.Config:
    return schemathesis.Config.from_dict(
        {
            "checks": {"enabled": True},
            "operations": [
                {
                    "include-name": UPLOADS,
                    "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "404", "409", "422"]}},
                },
                {
                    "include-name": CHECKED_AGAINST_THE_SESSION,
                    "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "400", "404", "409"]}},
                },
            ],
        }
    )


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
    schema = schemathesis.openapi.from_url(fuzzed_server.url + "/schema/openapi.json", config=fuzzing_config())
    operations = [schema[path][method] for path in schema for method in schema[path]]
    assert len(operations) >= 20
    operations.sort(key=lambda op: op.method.upper() == "DELETE")  # deletions last: the demo's ids name it till then
    found = [
        failure
        for op in operations
        for ids in passes(op, mode)
        if (failure := failures_of(op, mode, fuzzed_server.url, ids)) is not None
    ]
    assert not found, f"{len(found)} failed (of {len(operations)} operations):\n\n" + "\n\n".join(found)
