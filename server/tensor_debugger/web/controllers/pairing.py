"""A session's pairing file: `GET` exports its rules, pairs and what stays unpaired; `PUT` imports one."""

from __future__ import annotations

from typing import Annotated, Any, TypeAlias

from litestar import Controller, get, put
from litestar.di import NamedDependency
from litestar.openapi.spec import OpenAPIType, Schema
from litestar.params import Body, FromPath

from tensor_debugger.compare.planning.pairing_files import PairingExport, export_pairing
from tensor_debugger.errors import InvalidInputError
from tensor_debugger.services import Services
from tensor_debugger.web.error_responses import CHANGES, JSON_BODY, error_responses
from tensor_debugger.web.json_bodies import PAIRING_FILE_LIMIT
from tensor_debugger.web.rule_schemas import chain_schema


def _entry(required: list[str] | None) -> Schema:
    name = Schema(type=OpenAPIType.STRING, min_length=1)
    run = Schema(type=OpenAPIType.STRING, min_length=1, description="a candidate run's label")
    return Schema(
        type=OpenAPIType.OBJECT,
        properties={"a": name, "b": name, "run": run},
        required=required,
        additional_properties=False,
    )


def _pairing_file() -> Any:
    """The body's schema: the four keys (compare/pairing_files.py checks the rest: strategy names, the pattern's
    groups, each entry's names)."""
    text = Schema(type=OpenAPIType.STRING)
    nothing = Schema(type=OpenAPIType.NULL)
    properties = {
        "strategies": {"oneOf": [chain_schema(), {"type": "null"}]},
        "name_pattern": Schema(one_of=[text, nothing]),
        "dims": Schema(
            one_of=[Schema(type=OpenAPIType.OBJECT, additional_properties=text), nothing],
            description='name glob -> comma-separated dimension names ("*attn*": "batch,heads,tokens,head_dim")',
        ),
        "pairs": Schema(type=OpenAPIType.ARRAY, items=_entry(["a", "b"])),
        "unpaired": Schema(type=OpenAPIType.ARRAY, items=_entry(None), description='each with "a", "b" or both'),
    }
    return Body(schema_extra={"properties": properties, "additional_properties": False})


# the body as sent: free-form JSON that `pairing_files.check_file` checks, naming what is wrong in words
PairingFile: TypeAlias = Annotated[dict[str, Any], _pairing_file()]


PAIRING_RULES = (
    "names a candidate run's label the session does not have, or its `name_pattern` is not a regular expression "
    "with named groups layer and stage (and no other but rank), or its `dims` give a name that is not a dimension "
    "name (a letter or _, then letters, digits, _ . -) or a name twice"
)


class SessionPairingController(Controller):
    path = "/api/sessions/{session_id:int}/pairing"
    tags = ["pairs"]

    @get("/", sync_to_thread=True, responses=error_responses(404))
    def export(self, services: NamedDependency[Services], session_id: FromPath[int]) -> PairingExport:
        """`strategies` (the chain, null: the default), `name_pattern`, `pairs` ({"a", "b"}) and `unpaired`
        ({"a", "b"}: never these two; {"a"} or {"b"}: this tensor stays unpaired)."""
        with services.sessions() as db:
            return export_pairing(db, session_id)

    @put(
        "/",
        sync_to_thread=True,
        request_max_body_size=PAIRING_FILE_LIMIT,
        responses=error_responses(*CHANGES, *JSON_BODY, 404, 409, depends_on_state=PAIRING_RULES),
    )
    def import_file(
        self, services: NamedDependency[Services], session_id: FromPath[int], data: PairingFile
    ) -> PairingExport:
        """Apply a pairing file (every key optional: one left out leaves that part as it is); pairs again and
        answers with the session's pairing now. `strategies` is a list here, as the document says (a file for
        `compare --pairing` may also give a comma list). A file naming tensors (`pairs`, `unpaired`) is refused
        with 409 while a run is still ingesting: its names are checked against the runs' tensors."""
        if isinstance(data.get("strategies"), str):
            raise InvalidInputError('strategies must be a list of strategy names (["name", "fuzzy:0.8"])')
        return services.actions.import_pairing(session_id, data)
