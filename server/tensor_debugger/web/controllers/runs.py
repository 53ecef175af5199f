from __future__ import annotations

from typing import Annotated

import msgspec
from litestar import Controller, get, put
from litestar.di import NamedDependency
from litestar.params import FromPath

from tensor_debugger.compare.reports.progress import RunDetail, run_detail
from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.reports import RunReport, TensorReport
from tensor_debugger.web.error_responses import CHANGES, JSON_BODY, MAX_INT64, error_responses
from tensor_debugger.web.json_bodies import JSON_BODY_LIMIT, StrictBody

AGAINST = (
    "names a run of another session, the run itself, or makes a cycle (a run compared against one compared, at any "
    "remove, against it); or asks it of the session's reference, or against a rerun (the noise floor of the run it "
    "is compared against, never a run compared against)"
)


class ComparedAgainst(msgspec.Struct, forbid_unknown_fields=True):
    # the id of the run of the same session to compare this run against; null: the session's reference
    run_id: Annotated[int, msgspec.Meta(ge=0, le=MAX_INT64)] | None


class RunController(Controller):
    path = "/api/runs"
    tags = ["runs"]

    @get("/{run_id:int}", sync_to_thread=True, responses=error_responses(404))
    def show_run(self, services: NamedDependency[Services], run_id: FromPath[int]) -> RunDetail:
        """One run with its problems; `status` is "ingesting", "ready" or "failed" (nothing usable: the problems
        say why). While this server ingests it, `ingest` has its `stage` and bytes copied of the total.
        `compared_against`: the id of the run its pairs are compared against (null: the session's reference)."""
        with services.sessions() as db:
            return run_detail(catalog.get_run(db, run_id), services.ingests)

    @put(
        "/{run_id:int}/compared-against",
        sync_to_thread=True,
        request_max_body_size=JSON_BODY_LIMIT,
        responses=error_responses(*CHANGES, *JSON_BODY, 404, depends_on_state=AGAINST),
    )
    def set_compared_against(
        self, services: NamedDependency[Services], run_id: FromPath[int], data: StrictBody[ComparedAgainst]
    ) -> RunReport:
        """Compare this run against another run of its session (`{"run_id": 7}`), or against the session's reference
        again (`{"run_id": null}`): the session is paired again, this run's pairs now against that run's tensors.
        400 with the reason where it cannot be (nothing changed)."""
        return services.actions.compare_against(run_id, data.run_id)

    @get("/{run_id:int}/tensors", sync_to_thread=True, responses=error_responses(404))
    def list_tensors(self, services: NamedDependency[Services], run_id: FromPath[int]) -> list[TensorReport]:
        with services.sessions() as db:
            return [TensorReport.of(t) for t in catalog.list_tensors(db, run_id)]
