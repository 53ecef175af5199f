from __future__ import annotations

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import FromPath

from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.reports import TensorReport
from tensor_debugger.web.error_responses import error_responses


class TensorController(Controller):
    path = "/api/tensors"
    tags = ["tensors"]

    @get("/{tensor_id:int}", sync_to_thread=True, responses=error_responses(404))
    def show_tensor(self, services: NamedDependency[Services], tensor_id: FromPath[int]) -> TensorReport:
        with services.sessions() as db:
            return TensorReport.of(catalog.get_tensor(db, tensor_id))
