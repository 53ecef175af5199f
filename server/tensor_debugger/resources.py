"""Where the templates, static files and migrations are: inside the installed package (the wheel ships them as
tensor_debugger/web, beside the web layer's modules, and tensor_debugger/migrations), else in the source checkout's
top level."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
# What each folder must hold: in a source checkout, tensor_debugger/web is the web layer's code alone.
_MARKERS = {"web": "templates", "migrations": "env.py"}


def resource_dir(name: str) -> Path:
    marker = _MARKERS.get(name, "")
    for candidate in (_PACKAGE / name, _PACKAGE.parent.parent / name):
        if candidate.is_dir() and (candidate / marker).exists():
            return candidate
    raise FileNotFoundError(f"the {name!r} folder is missing from the installation at {_PACKAGE}")
