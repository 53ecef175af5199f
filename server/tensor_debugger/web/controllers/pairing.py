"""A session's pairing file: `GET` exports its rules, pairs and what stays unpaired; `PUT` imports one."""

from __future__ import annotations

from typing import Any

from litestar import Controller, get, put

from tensor_debugger.compare.pairing_files import export_pairing
from tensor_debugger.services import Services


class SessionPairingController(Controller):
    path = "/api/sessions/{session_id:int}/pairing"
    tags = ["pairs"]

    @get("/", sync_to_thread=True)
    def export(self, services: Services, session_id: int) -> dict[str, Any]:
        """`strategies` (the chain, null: the default), `name_pattern`, `pairs` ({"a", "b"}) and `unpaired`
        ({"a", "b"}: never these two; {"a"} or {"b"}: this tensor stays unpaired)."""
        with services.sessions() as db:
            return export_pairing(db, session_id)

    @put("/", sync_to_thread=True)
    def import_file(self, services: Services, session_id: int, data: dict[str, Any]) -> dict[str, Any]:
        """Apply a pairing file (every key optional: one left out leaves that part as it is); pairs again and
        answers with the session's pairing now."""
        return services.actions.import_pairing(session_id, data)
