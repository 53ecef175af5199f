"""Names of a tensor's aligned dimensions, given by a session as name globs mapped to comma-separated names:

    {"*attn*": "batch,heads,tokens,head_dim", "*mlp*": "batch,tokens,hidden"}

A pair takes the names of the first glob (in the setting's order) that matches its name or either tensor's name
(any case) and gives as many names as the pair's aligned shape has dimensions; otherwise its dimensions have none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any

MAX_GLOBS = 64
MAX_GLOB_CHARS = 200
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")  # a dimension's name: a word, no comma, no space


def parse_dims(value: Any) -> dict[str, str] | None:
    """The setting as stored ({glob: "a,b,c"}; None for none: null or {}). Names may also come as a list.
    ValueError naming the problem."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"dims must be an object mapping a name glob to dimension names, got {value!r}")
    if len(value) > MAX_GLOBS:
        raise ValueError(f"dims takes at most {MAX_GLOBS} globs, got {len(value)}")
    parsed: dict[str, str] = {}
    for glob, names in value.items():
        if not isinstance(glob, str) or not glob.strip() or len(glob) > MAX_GLOB_CHARS:
            raise ValueError(f"dims: a glob must be a non-empty name pattern of at most {MAX_GLOB_CHARS} characters")
        parts = names.split(",") if isinstance(names, str) else names
        if not isinstance(parts, list) or not parts or not all(isinstance(p, str) for p in parts):
            raise ValueError(
                f'dims[{glob!r}] must be comma-separated dimension names ("batch,heads,tokens"), got {names!r}'
            )
        parts = [p.strip() for p in parts]
        bad = next((p for p in parts if not NAME.fullmatch(p)), None)
        if bad is not None:
            raise ValueError(
                f"dims[{glob!r}]: {bad!r} is not a dimension name (a letter or _, then letters, digits, _ . -; "
                "at most 64 characters)"
            )
        if len(set(parts)) != len(parts):
            raise ValueError(f"dims[{glob!r}] names a dimension twice: {','.join(parts)}")
        parsed[glob.strip()] = ",".join(parts)
    return parsed or None


def parse_dims_option(options: Iterable[str]) -> dict[str, str] | None:
    """`compare --dims GLOB=NAMES` (repeatable) as the setting. ValueError naming the problem."""
    value: dict[str, str] = {}
    for option in options:
        glob, equals, names = option.rpartition("=")
        if not equals or not glob:
            raise ValueError(f"--dims takes GLOB=NAMES ('*attn*=batch,heads,tokens,head_dim'), got {option!r}")
        value[glob] = names
    return parse_dims(value)


def dimension_names(dims: Mapping[str, str] | None, names: Iterable[str], rank: int) -> list[str] | None:
    """The names of a pair's `rank` aligned dimensions: the first glob matching one of `names` (any case) that
    gives `rank` names; None where none does."""
    if not dims:
        return None
    lowered = [n.lower() for n in names]
    for glob, spec in dims.items():
        parts = spec.split(",")
        if len(parts) == rank and any(fnmatchcase(n, glob.lower()) for n in lowered):
            return parts
    return None
