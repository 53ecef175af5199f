"""The request bodies of the two upload operations, for the OpenAPI document: their handlers read the body
themselves (streamed to disk), so Litestar cannot describe it from a `data` parameter."""

from __future__ import annotations

from dataclasses import dataclass

from litestar.openapi.spec import OpenAPIFormat, OpenAPIMediaType, OpenAPIType, Operation, RequestBody, Schema

from tensor_debugger.store.catalog import MAX_LABEL, MAX_NOTES

# A session name: not only spaces, no control characters (store.catalog.parse_label), as a JSON Schema pattern.
NAME_PATTERN = r"^[^\x00-\x1f]*[^\s\x00-\x1f][^\x00-\x1f]*$"


def name_schema() -> Schema:
    return Schema(type=OpenAPIType.STRING, min_length=1, max_length=MAX_LABEL, pattern=NAME_PATTERN)


def notes_schema() -> Schema:
    return Schema(type=OpenAPIType.STRING, max_length=MAX_NOTES)


def _file() -> Schema:
    return Schema(type=OpenAPIType.STRING, format=OpenAPIFormat.BINARY, description="a tensor file or an archive")


def multipart_runs(with_session: bool) -> Schema:
    """Files whose field name is their run's label (the first run is the reference, unless one is labelled
    `reference`), and, for a new session, its name. No label is required: an upload without a file is 422."""
    fields = {"name": name_schema(), "notes": notes_schema()} if with_session else {}
    return Schema(
        type=OpenAPIType.OBJECT,
        properties={**fields, "reference": _file(), "candidate": _file()},
        additional_properties=_file(),
        property_names=name_schema(),  # a file field's name is its run's label, a name as a session's is
    )


@dataclass
class CreateSessionOperation(Operation):
    """POST /api/sessions: JSON {name, notes} for an empty session, or the runs' files."""

    def __post_init__(self) -> None:
        session = Schema(
            type=OpenAPIType.OBJECT,
            properties={"name": name_schema(), "notes": notes_schema()},
            required=["name"],
            additional_properties=False,
        )
        self.request_body = RequestBody(
            required=True,
            content={
                "application/json": OpenAPIMediaType(schema=session),
                "multipart/form-data": OpenAPIMediaType(schema=multipart_runs(with_session=True)),
            },
        )


@dataclass
class AddRunsOperation(Operation):
    """POST /api/sessions/{id}/runs: the new runs' files."""

    def __post_init__(self) -> None:
        self.request_body = RequestBody(
            required=True, content={"multipart/form-data": OpenAPIMediaType(schema=multipart_runs(with_session=False))}
        )
