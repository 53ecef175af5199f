from __future__ import annotations

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import FromPath

from tensor_debugger.compare.reports.progress import RunDetail, run_detail
from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.reports import TensorReport
from tensor_debugger.web.error_responses import error_responses


class RunController(Controller):
    path = "/api/runs"
    tags = ["runs"]

    @get("/{run_id:int}", sync_to_thread=True, responses=error_responses(404))
    def show_run(self, services: NamedDependency[Services], run_id: FromPath[int]) -> RunDetail:
        """One run with its problems; `status` is "ingesting", "ready" or "failed" (nothing usable: the problems
        say why). While this server ingests it, `ingest` has its `stage` and bytes copied of the total."""
        with services.sessions() as db:
            return run_detail(catalog.get_run(db, run_id), services.ingests)

    @get("/{run_id:int}/tensors", sync_to_thread=True, responses=error_responses(404))
    def list_tensors(self, services: NamedDependency[Services], run_id: FromPath[int]) -> list[TensorReport]:
        with services.sessions() as db:
            return [TensorReport.of(t) for t in catalog.list_tensors(db, run_id)]
