"""Only the public, declared interfaces of numpy, zarr and numcodecs: their private modules and names change without
notice between releases (zarr 3.2 moved `zarr.core.chunk_grids.RegularChunkGrid`, and every command then failed at
import on Python 3.12)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WATCHED = ("numpy", "zarr", "numcodecs", "blosc2", "safetensors", "torch")
SOURCES = sorted(p for folder in ("server", "tests", "bench") for p in (ROOT / folder).rglob("*.py"))


def _private(dotted: str) -> bool:
    """Whether a dotted name inside a watched package reaches something private: `zarr.core`, a `_name`, or a
    package's `__file__` (the way to dig symbols out of its extension modules)."""
    parts = dotted.split(".")
    if parts[0] not in WATCHED:
        return False
    if parts[:2] == ["zarr", "core"]:
        return True
    return any(
        p == "__file__" or (p.startswith("_") and not (p.startswith("__") and p.endswith("__"))) for p in parts[1:]
    )


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(names)])


def private_uses(source: str) -> list[str]:
    """Every private import or attribute of a watched package in `source`, as "line: name"."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}
    found: list[tuple[int, str]] = []
    inner = {id(child.value) for child in ast.walk(tree) if isinstance(child, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    aliases[top] = top
                if _private(alias.name):
                    found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                aliases[alias.asname or alias.name] = full
                if _private(full):
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:  # the whole chain, once
            dotted = _dotted(node, aliases)
            if dotted is not None and _private(dotted):
                found.append((node.lineno, dotted))
    return [f"{line}: {name}" for line, name in sorted(set(found))]


def test_no_source_uses_private_interfaces_of_its_dependencies() -> None:
    problems = {str(p.relative_to(ROOT)): uses for p in SOURCES if (uses := private_uses(p.read_text()))}
    assert problems == {}


def test_only_our_own_compiled_libraries_are_loaded() -> None:
    """ctypes loads this package's own libraries, through one function (engine/fused.py's load_library), and the C
    library (mapped_pages.py's madvise), never another package's extension module."""
    loaders = sorted(
        str(p.relative_to(ROOT))
        for p in SOURCES
        if p.relative_to(ROOT).parts[0] != "tests" and "CDLL(" in p.read_text()
    )
    assert loaders == ["server/tensor_debugger/engine/fused.py", "server/tensor_debugger/ingest/mapped_pages.py"]
    assert 'find_library("c")' in (ROOT / "server/tensor_debugger/ingest/mapped_pages.py").read_text()


def test_the_check_finds_the_private_uses_it_is_for() -> None:
    """The checks above would have caught each private use this code once had."""
    old = """
import numcodecs.blosc
import numpy as np
from numpy.lib import _format_impl
from zarr_core.chunk_grids import RegularChunkGrid
from zarr_core.metadata.v3 import ArrayV3Metadata
import zarr
x = np.lib._format_impl._read_array_header
y = ctypes.CDLL(numcodecs.blosc.__file__)
z = zarr_core.sync.sync
ok = np.lib.format.read_magic, np.__version__, zarr.codecs.BloscCodec
""".replace("zarr_core", "zarr" + ".core")  # spelled so that a grep for private imports does not find this sample
    assert [use.split(": ")[1] for use in private_uses(old)] == [
        "from numpy.lib import _format_impl",
        "from zarr_core.chunk_grids import RegularChunkGrid".replace("zarr_core", "zarr" + ".core"),
        "from zarr_core.metadata.v3 import ArrayV3Metadata".replace("zarr_core", "zarr" + ".core"),
        "numpy.lib._format_impl._read_array_header",
        "numcodecs.blosc.__file__",
        "zarr" + ".core.sync.sync",
    ]
