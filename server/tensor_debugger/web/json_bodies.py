"""JSON request bodies, bounded before they are parsed: in size (each handler's `request_max_body_size`, or
`read_json` for the handlers that also take uploads) and in depth (`BoundedRequest`, the app's request class),
so that no body can make the parser recurse until it fails: a body nested too deep is a 400 naming the limit."""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeAlias, TypeVar

import msgspec
from litestar import Request
from litestar.params import Body

from tensor_debugger.errors import InvalidInputError, TooLargeError

JSON_BODY_LIMIT = 1024 * 1024  # the API's JSON bodies: a session's notes (64 Ki characters) with room to spare
PAIRING_FILE_LIMIT = 16 * 1024 * 1024  # a pairing file names tensors: megabytes at most
MAX_JSON_DEPTH = 32  # arrays and objects inside each other; the deepest body the API takes has 4

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # a JSON string, escapes and all
_NOT_A_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")

T = TypeVar("T")

# A handler's `data` that is a Struct with forbid_unknown_fields (`data: StrictBody[SomeStruct]`): the document says
# so too (Litestar does not).
StrictBody: TypeAlias = Annotated[T, Body(schema_extra={"additional_properties": False})]


def check_json_depth(body: bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """InvalidInputError when arrays and objects nest more than `limit` deep in `body`. Each pass removes the
    innermost pairs of brackets (outside strings), so the passes count the depth, each in C; a body whose
    brackets do not pair is left for the parser to refuse."""
    brackets = _STRING.sub(b"", body).translate(None, _NOT_A_BRACKET)
    for _ in range(limit):
        inner = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if not inner or inner == brackets:
            return
        brackets = inner
    raise InvalidInputError(f"the JSON body nests arrays and objects more than {limit} deep")


def parse_json(body: bytes, kind: type[T], what: str = "the JSON body") -> T:
    """`body` as a `kind` (a msgspec Struct, or Any), checked for depth first; InvalidInputError says what is wrong
    with it and where."""
    check_json_depth(body)
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise InvalidInputError(f"{what} does not fit: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidInputError(f"{what} is not JSON: {exc}") from None


async def read_json(request: Request[Any, Any, Any], kind: type[T], limit: int = JSON_BODY_LIMIT) -> T:
    """The body of a request whose handler takes no size limit from the app (it also takes uploads), read up to
    `limit` bytes (TooLargeError past it) and parsed as `kind`."""
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limit:
            raise TooLargeError(f"a JSON body may take at most {limit} bytes")
    return parse_json(bytes(body), kind)


class BoundedRequest(Request[Any, Any, Any]):
    """The app's request: its JSON body (what Litestar decodes for a handler's `data`) is checked for depth before
    it is parsed."""

    async def json(self) -> Any:
        check_json_depth(await self.body())
        return await super().json()
