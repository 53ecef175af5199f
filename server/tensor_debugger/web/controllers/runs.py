from __future__ import annotations

from typing import Any

from litestar import Controller, get

from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.reports import run_json, tensor_json


class RunController(Controller):
    path = "/api/runs"
    tags = ["runs"]

    @get("/{run_id:int}", sync_to_thread=True)
    def show_run(self, services: Services, run_id: int) -> dict[str, Any]:
        """One run with its problems; `status` is "ingesting", "ready" or "failed" (nothing usable: the problems
        say why). While this server ingests it, `ingest` has its `stage` and bytes copied of the total."""
        with services.sessions() as db:
            body = run_json(catalog.get_run(db, run_id), with_problems=True)
        live = services.ingests.progress(run_id)
        body["ingest"] = None if live is None else {"stage": live.stage, "bytes_done": live.bytes_done,
                                                    "bytes_total": live.bytes_total}
        return body

    @get("/{run_id:int}/tensors", sync_to_thread=True)
    def list_tensors(self, services: Services, run_id: int) -> list[dict[str, Any]]:
        with services.sessions() as db:
            return [tensor_json(t) for t in catalog.list_tensors(db, run_id)]
