"""The command line's way in (the warm path): `tensor-debugger compare` and `ingest` on this server's data dir hand
their work here instead of starting up, and print what they would have printed (`cli/warm.py`).

These read files by their paths on this machine, so each request must carry the token the server wrote into
`<data dir>/server.json` (`web/address.py`), which only the data dir's owner can read. Not part of the public API
(not in the OpenAPI document): the command line is their one client, and its output is the contract.
"""

from __future__ import annotations

import hmac
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.di import NamedDependency
from litestar.exceptions import PermissionDeniedException
from litestar.params import JSONBody
from litestar.response import Stream

from tensor_debugger.compare.pipeline import compare_runs, ingest_run
from tensor_debugger.compare.planning.requests import CompareRequest, IngestRequest, ServerIdentity
from tensor_debugger.compare.reports.compare_report import CompareEvent, IngestOutcome
from tensor_debugger.errors import InvalidInputError
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services
from tensor_debugger.web.address import TOKEN_HEADER, ServerAddress


def check_token(request: Request[Any, Any, Any]) -> ServerAddress:
    address: ServerAddress | None = getattr(request.app.state, "address", None)
    given = request.headers.get(TOKEN_HEADER, "")
    if address is None or not hmac.compare_digest(given.encode(), address.token.encode()):
        raise PermissionDeniedException("the local API needs the token of this server's data dir")
    return address


class LocalController(Controller):
    path = "/api/local"
    include_in_schema = False

    @get("/", sync_to_thread=False)
    def probe(self, request: Request[Any, Any, Any], services: NamedDependency[Services]) -> ServerIdentity:
        """Who answers: the command line checks that this server is the one of its data dir."""
        address = check_token(request)
        settings = services.settings
        return ServerIdentity(address.pid, settings.database_url, settings.store_url)

    @post("/compare", sync_to_thread=False)
    def compare(
        self,
        request: Request[Any, Any, Any],
        services: NamedDependency[Services],
        data: JSONBody[dict[str, Any]],  # the request's JSON: `CompareRequest.from_json` reads it, saying what is wrong
    ) -> Stream:
        """`tensor-debugger compare`: one JSON object a line, {"step", "done", "total"} as it goes, then
        {"outcome": ...} (`CompareEvent`, compare/reports/compare_report.py), or {"failure": ...}. The work goes on to
        the end if the caller leaves."""
        address = check_token(request)
        compare_request = CompareRequest.from_json(data)
        events: queue.Queue[CompareEvent] = queue.Queue()

        def work() -> None:
            try:
                outcome = compare_runs(
                    services.ingestor,
                    services.context,
                    services.compute,
                    compare_request,
                    services.settings.public_url.rstrip("/") or address.url,  # where the user's links lead
                    progress=lambda step, done, total: events.put(CompareEvent(step, done, total)),
                    where=f", data_dir={str(services.settings.data_dir)!r}",  # the session's, as in the CLI
                )
                events.put(CompareEvent(outcome=outcome))
            except Exception as exc:  # said to the caller, whose command then fails
                events.put(CompareEvent(failure=f"{type(exc).__name__}: {exc}"))
            finally:
                services.worker.wake()  # pairs left pending (--fail-fast) are the worker's now

        threading.Thread(target=work, name="local-compare", daemon=True).start()

        def lines() -> Iterator[bytes]:
            while True:
                event = events.get()
                yield msgspec.json.encode(event) + b"\n"
                if event.step is None:
                    return

        return Stream(lines(), media_type="application/x-ndjson")

    @post("/ingest", sync_to_thread=True)
    def ingest(
        self, request: Request[Any, Any, Any], services: NamedDependency[Services], data: JSONBody[IngestRequest]
    ) -> IngestOutcome:
        """`tensor-debugger ingest`: {"session", "run", "paths": [absolute], "shown": [as typed]} -> `IngestOutcome`
        (its payload, the report the command prints)."""
        check_token(request)
        paths, shown, session, run = [Path(p) for p in data.paths], data.shown, data.session, data.run
        if len(paths) != len(shown) or not all(p.is_absolute() for p in paths):
            raise InvalidInputError("an ingest request names its inputs by absolute paths, each with how it was typed")
        outcome = ingest_run(
            services.ingestor,
            services.context,
            session,
            run,
            [InputFile(p, s) for p, s in zip(paths, shown, strict=True)],
            against=data.against,
        )
        services.worker.wake()
        return outcome
