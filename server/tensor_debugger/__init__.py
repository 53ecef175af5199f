"""Tensor Debugger: find which tensor went wrong first between two runs of a model."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "capture", "find_divergence"]


def __getattr__(name: str) -> Any:
    """`from tensor_debugger import capture` (or `find_divergence`) without importing torch for every other use of
    the package."""
    if name == "capture":
        from tensor_debugger.live.recorder import capture

        return capture
    if name == "find_divergence":
        from tensor_debugger.live.divergence import find_divergence

        return find_divergence
    raise AttributeError(f"module 'tensor_debugger' has no attribute {name!r}")
