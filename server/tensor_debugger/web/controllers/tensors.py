from __future__ import annotations

from typing import Any

from litestar import Controller, get

from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.reports import tensor_json


class TensorController(Controller):
    path = "/api/tensors"
    tags = ["tensors"]

    @get("/{tensor_id:int}", sync_to_thread=True)
    def show_tensor(self, services: Services, tensor_id: int) -> dict[str, Any]:
        with services.sessions() as db:
            return tensor_json(catalog.get_tensor(db, tensor_id))
