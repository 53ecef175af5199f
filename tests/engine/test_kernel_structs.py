"""engine/layouts.py declares the structures of kernel_structs.h as ctypes classes; nothing reads the header at run
time, so these tests check the declarations against it: the header's field lists parsed here (names, C types, array
counts), the offsets and sizes the C compiler gives them, and the libraries built from it."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tensor_debugger.compare.compute.chunk_loop import _library as chunk_loop_library
from tensor_debugger.engine import layouts
from tensor_debugger.engine.fused import _library as fused_library

HEADER = Path(layouts.__file__).with_name("kernel_structs.h")
_LIST = re.compile(r"#define (\w+)\(FIELD, ARRAY\)((?:[^\n]*\\\n)*[^\n]*)")
_ENTRY = re.compile(r"(FIELD|ARRAY)\(([^,()]+),\s*(\w+)(?:,\s*(\w+))?\)")
_CONSTANT = re.compile(r"#define (\w+) (\d+)\b")
_TYPEDEF = re.compile(r"typedef struct TD_STRUCT\((\w+)\) (\w+);")
_SCALARS: dict[str, Any] = {
    "double": ctypes.c_double,
    "float": ctypes.c_float,
    "int64_t": ctypes.c_int64,
    "int": ctypes.c_int,
    "const char *": ctypes.c_char_p,
}


def header() -> tuple[dict[str, list[tuple[str, str, str, str]]], dict[str, int], dict[str, str]]:
    """The header's field lists ((kind, C type, name, count) each), its numeric constants, and each list's typedef."""
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    lists = {
        m.group(1): [(kind, " ".join(c.split()), name, count) for kind, c, name, count in _ENTRY.findall(m.group(2))]
        for m in _LIST.finditer(text)
    }
    constants = {m.group(1): int(m.group(2)) for m in _CONSTANT.finditer(text)}
    typedefs = {m.group(1): m.group(2) for m in _TYPEDEF.finditer(text)}
    return lists, constants, typedefs


def expected_fields(entries: list[tuple[str, str, str, str]], constants: dict[str, int]) -> list[tuple[str, Any]]:
    """The ctypes fields the header's list means: every pointer but `const char *` a plain address."""
    found: list[tuple[str, Any]] = []
    for kind, c_type, name, count in entries:
        scalar = _SCALARS.get(c_type) or (ctypes.c_void_p if c_type.endswith("*") else None)
        assert scalar is not None, f"{HEADER.name}: {name} has type {c_type!r}, which layouts.py does not map"
        found.append((name, scalar * (constants.get(count) or int(count)) if kind == "ARRAY" else scalar))
    return found


def describe(field_type: Any) -> tuple[str, int]:
    """A ctypes field type as (element type, length): arrays compared by element and count."""
    if isinstance(field_type, type) and issubclass(field_type, ctypes.Array):
        return field_type._type_.__name__, int(field_type._length_)  # type: ignore[call-overload]
    return field_type.__name__, 1


def test_every_field_list_of_the_header_is_declared_with_the_same_fields_and_constants() -> None:
    lists, constants, typedefs = header()
    assert set(lists) == set(layouts.DECLARED) and set(typedefs) == set(lists)
    assert {name: constants[name] for name in layouts.CONSTANTS} == layouts.CONSTANTS
    for list_name, structure in layouts.DECLARED.items():
        want = expected_fields(lists[list_name], constants)
        have: list[tuple[str, Any]] = list(structure._fields_)  # type: ignore[arg-type]
        assert [(n, describe(t)) for n, t in have] == [(n, describe(t)) for n, t in want], list_name
        mirror = type("Mirror", (ctypes.Structure,), {"_fields_": want})
        for name, _ in want:
            assert getattr(structure, name).offset == getattr(mirror, name).offset, (list_name, name)
        assert ctypes.sizeof(structure) == ctypes.sizeof(mirror), list_name


def test_the_c_compiler_lays_the_header_out_as_declared(tmp_path: Path) -> None:
    """The offsets and sizes the C compiler gives each structure of the header are those of its ctypes class."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler here to lay the header out")
    lists, _, typedefs = header()
    lines = [f'#include "{HEADER}"', "#include <stddef.h>", "#include <stdio.h>", "int main(void) {"]
    for list_name, c_name in typedefs.items():
        lines.append(f'    printf("{list_name} sizeof %zu\\n", sizeof({c_name}));')
        for _, _, field, _ in lists[list_name]:
            lines.append(f'    printf("{list_name} {field} %zu\\n", offsetof({c_name}, {field}));')
    lines += ["    return 0;", "}"]
    source, program = tmp_path / "layout.c", tmp_path / "layout"
    source.write_text("\n".join(lines) + "\n")
    subprocess.run([compiler, "-std=c11", "-o", str(program), str(source)], check=True)
    measured = subprocess.run([str(program)], check=True, capture_output=True, text=True).stdout.split("\n")
    declared = []
    for list_name, structure in layouts.DECLARED.items():
        declared.append(f"{list_name} sizeof {ctypes.sizeof(structure)}")
        declared += [f"{list_name} {field[0]} {getattr(structure, field[0]).offset}" for field in structure._fields_]
    assert sorted(line for line in measured if line) == sorted(declared)


def test_the_built_libraries_agree_with_the_declared_sizes() -> None:
    """Each library loads only when its *_size() functions return the declared structures' sizes."""
    assert fused_library() is not None
    assert chunk_loop_library() is not None
