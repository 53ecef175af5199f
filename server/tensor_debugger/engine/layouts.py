"""ctypes structures built from kernel_structs.h, the one place the compiled code's shared structures are written.

The header lists each structure's fields as FIELD(type, name) or ARRAY(type, name, count) inside a
`#define <LIST>(FIELD, ARRAY)` macro; this module reads those lists, so the C side and the Python side cannot
drift apart. The libraries' *_size() functions are still checked against these structures when they load.
"""

from __future__ import annotations

import ctypes
import functools
import re
from pathlib import Path
from typing import Any

HEADER = Path(__file__).with_name("kernel_structs.h")

_SCALARS: dict[str, Any] = {
    "double": ctypes.c_double,
    "float": ctypes.c_float,
    "int64_t": ctypes.c_int64,
    "int": ctypes.c_int,
    "const char *": ctypes.c_char_p,
}
_LIST = re.compile(r"#define (\w+)\(FIELD, ARRAY\)((?:[^\n]*\\\n)*[^\n]*)")
_ENTRY = re.compile(r"(FIELD|ARRAY)\(([^,()]+),\s*(\w+)(?:,\s*(\w+))?\)")
_CONSTANT = re.compile(r"#define (\w+) (\d+)\b")


@functools.cache
def _header() -> tuple[dict[str, str], dict[str, int]]:
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    lists = {m.group(1): m.group(2) for m in _LIST.finditer(text)}
    constants = {m.group(1): int(m.group(2)) for m in _CONSTANT.finditer(text)}
    return lists, constants


def constant(name: str) -> int:
    """A numeric #define of the header (TD_EDGES)."""
    return _header()[1][name]


def fields(list_name: str) -> list[tuple[str, Any]]:
    """The ctypes `_fields_` of the structure whose field list is `list_name` (TD_PARTIAL_FIELDS); every pointer
    but `const char *` is a plain address (c_void_p)."""
    lists, constants = _header()
    found: list[tuple[str, Any]] = []
    for kind, c_type, name, count in _ENTRY.findall(lists[list_name]):
        c_type = " ".join(c_type.split())
        scalar: Any = _SCALARS.get(c_type) or (ctypes.c_void_p if c_type.endswith("*") else None)
        if scalar is None:
            raise ValueError(f"{HEADER.name}: {list_name}.{name} has type {c_type!r}, which layouts.py does not map")
        found.append((name, scalar * (constants.get(count) or int(count)) if kind == "ARRAY" else scalar))
    if not found:
        raise ValueError(f"{HEADER.name} has no field list {list_name}")
    return found
