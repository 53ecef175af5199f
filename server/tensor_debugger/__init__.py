"""Tensor Debugger: find which tensor went wrong first between two runs of a model."""

__version__ = "0.1.0"
__all__ = ["__version__"]
