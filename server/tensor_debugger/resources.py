"""Where the templates, static files and migrations are: inside the installed package (the wheel ships
them as tensor_debugger/web and tensor_debugger/migrations), else in the source checkout's top level."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    for candidate in (_PACKAGE / name, _PACKAGE.parent.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"the {name!r} folder is missing from the installation at {_PACKAGE}")
