"""The compiled single-pass statistics kernel (fused_stats.c), loaded on first use.

The package build compiles it next to this file (server/build_hooks.py); where it was not built, or
TENSOR_DEBUGGER_KERNEL=numpy asks for it, `fused_partial` returns None and metrics.py computes with numpy alone.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import numpy as np

LIBRARY_NAME = "_fused_stats.so"
EDGE_COUNT = 16
_CODES = {np.dtype(np.float32): "f", np.dtype(np.float64): "d"}


class FusedPartial(ctypes.Structure):
    """Mirrors td_partial in fused_stats.c."""

    _fields_ = [
        ("max_abs", ctypes.c_double), ("argmax", ctypes.c_int64),
        ("sum_abs", ctypes.c_double), ("sum_sq", ctypes.c_double),
        ("sum_rel", ctypes.c_double), ("max_rel", ctypes.c_double), ("rel_count", ctypes.c_int64),
        ("dot", ctypes.c_double), ("norm_a", ctypes.c_double), ("norm_b", ctypes.c_double),
        ("mismatched", ctypes.c_int64), ("nonzero", ctypes.c_int64),
        ("at_least", ctypes.c_int64 * EDGE_COUNT),
    ]


@functools.cache
def _library() -> ctypes.CDLL | None:
    path = Path(__file__).with_name(LIBRARY_NAME)
    if not path.is_file():
        return None
    try:
        library = ctypes.CDLL(str(path))
    except OSError:
        return None
    library.td_partial_size.restype = ctypes.c_int
    if library.td_partial_size() != ctypes.sizeof(FusedPartial):  # built from another version of the source
        return None
    for pair in ("ff", "fd", "df", "dd"):
        function = getattr(library, f"td_stats_{pair}")
        function.restype = ctypes.c_int
        function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_double,
                             ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(FusedPartial)]
    return library


def _numpy_asked() -> bool:
    """TENSOR_DEBUGGER_KERNEL=numpy, read on every call so that a test or a benchmark can set it."""
    return os.environ.get("TENSOR_DEBUGGER_KERNEL", "").strip().lower() == "numpy"


def kernel_name() -> str:
    """Which statistics kernel comparisons use: "compiled" or "numpy" (and why)."""
    if _numpy_asked():
        return "numpy (TENSOR_DEBUGGER_KERNEL=numpy)"
    if _library() is None:
        return f"numpy (no usable {LIBRARY_NAME} beside {Path(__file__).name})"
    return "compiled"


def _compute(values: np.ndarray) -> np.ndarray:
    """Contiguous float32 or float64 values, exactly: narrower floats widen to float32, anything else (ints,
    bools) to float64, as the numpy path converts them."""
    if values.dtype not in _CODES:
        values = values.astype(np.float32 if values.dtype.kind == "f" and values.dtype.itemsize < 4 else np.float64)
    return np.ascontiguousarray(values)


def fused_partial(a: np.ndarray, b: np.ndarray, atol: float, rtol: float, check: bool,
                  edges: np.ndarray) -> FusedPartial | None:
    """The statistics of flat real blocks `a` and `b` (same size) in one compiled pass, or None where the kernel
    is not in use. NaN and Inf are not looked for: the caller checks that `norm_a` and `norm_b` are finite."""
    if a.size != b.size:  # the kernel reads `a.size` values of each: never past the end of `b`
        raise ValueError(f"blocks differ in size: {a.size} and {b.size}")
    library = None if _numpy_asked() else _library()
    if library is None:
        return None
    a, b = _compute(a), _compute(b)
    out = FusedPartial()
    function = getattr(library, f"td_stats_{_CODES[a.dtype]}{_CODES[b.dtype]}")
    function(a.ctypes.data, b.ctypes.data, a.size, atol, rtol, int(check), edges.ctypes.data, ctypes.byref(out))
    return out
