"""The compiled single-pass statistics kernels (fused_stats.c: a pair's statistics, a tensor's summary), loaded on
first use.

The package build compiles it next to this file (server/build_hooks.py); where it was not built, or
TENSOR_DEBUGGER_KERNEL=numpy asks for it, `fused_partial` returns None and metrics.py computes with numpy alone.
TENSOR_DEBUGGER_KERNEL=blocks keeps the kernel but not the chunk loop that feeds it stored chunks
(tensor_debugger.compare.chunk_loop): blocks are then read into arrays first, as before that loop existed.

The library holds the kernels once per vector family (FAMILIES; fused_stats.c's header says what each is), and the
kernels run the best family this CPU runs, or the one Settings.kernel_family (TENSOR_DEBUGGER_KERNEL_FAMILY) names,
or the one `use_family` sets (tests and benchmarks). Both choices are declared settings that `configure` applies to
the process; nothing here reads the environment.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

from tensor_debugger.engine.layouts import TD_EDGES, TD_TOP, Partial, Summary

LIBRARY_NAME = "_fused_stats.so"
FAMILY_VARIABLE = "TENSOR_DEBUGGER_KERNEL_FAMILY"
# The vector families a library may hold, best first (server/build_hooks.py builds those of its architecture).
FAMILIES = ("avx512", "avx2", "baseline")
_PAIRS = ("ff", "fd", "df", "dd")
_CODES = {np.dtype(np.float32): "f", np.dtype(np.float64): "d"}


# A block's statistics (td_partial) and a block's summary (td_summary: count, mean, M2, min, max), as the ctypes
# structures engine/layouts.py declares (checked against kernel_structs.h by tests/engine/test_kernel_structs.py).
FusedPartial: TypeAlias = Partial
FusedSummary: TypeAlias = Summary


def partial_type() -> type[Partial]:
    """td_partial as a ctypes structure."""
    return Partial


def summary_type() -> type[Summary]:
    """td_summary as a ctypes structure."""
    return Summary


def top_limit() -> int:
    """The most worst elements a partial keeps (TD_TOP)."""
    return TD_TOP


def edge_count() -> int:
    """How many histogram edges a partial counts (TD_EDGES)."""
    return TD_EDGES


# logical dtype -> (the kernels' letter, the stored numpy dtype they read): bfloat16 is stored as its raw bits. The
# summary kernels read each; the chunk loop (compare/chunk_loop.c) widens "h" and "b" to float32 for the pair kernel.
STORED_FLOATS: dict[str, tuple[str, np.dtype[Any]]] = {
    "float32": ("f", np.dtype(np.float32)),
    "float64": ("d", np.dtype(np.float64)),
    "float16": ("h", np.dtype(np.float16)),
    "bfloat16": ("b", np.dtype(np.uint16)),
}


def load_library(path: Path, layouts: dict[str, type[ctypes.Structure]]) -> ctypes.CDLL | None:
    """The compiled library at `path`, or None where it is missing, does not load, or was built from another
    version of its source: each `layouts` function (say td_partial_size) must return its structure's size."""
    if not path.is_file():
        return None
    try:
        library = ctypes.CDLL(str(path))
    except OSError:
        return None
    for name, structure in layouts.items():
        size = getattr(library, name, None)
        if size is None or size() != ctypes.sizeof(structure):
            return None
    return library


@functools.cache
def _library() -> ctypes.CDLL | None:
    library = load_library(
        Path(__file__).with_name(LIBRARY_NAME), {"td_partial_size": partial_type(), "td_summary_size": summary_type()}
    )
    if library is None:
        return None
    library.td_family_runs.restype = ctypes.c_int
    library.td_family_runs.argtypes = [ctypes.c_char_p]
    for family in FAMILIES:
        for code, _ in STORED_FLOATS.values():
            function = getattr(library, f"td_summary_{code}_{family}", None)  # float16 needs _Float16, any family
            if function is not None:
                function.restype = ctypes.c_int
                function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(summary_type())]
        for pair in _PAIRS:
            function = getattr(library, f"td_stats_{pair}_{family}", None)  # a family the compiler could not build
            if function is not None:
                function.restype = ctypes.c_int
                function.argtypes = [
                    ctypes.c_void_p,
                    ctypes.c_void_p,
                    ctypes.c_int64,
                    ctypes.c_int64,
                    ctypes.c_double,
                    ctypes.c_double,
                    ctypes.c_int,
                    ctypes.c_void_p,
                    ctypes.POINTER(partial_type()),
                ]
    return library


def families() -> list[str]:
    """The vector families of the kernels that were built and that this CPU runs, best first (none without the
    kernel)."""
    library = _library()
    if library is None:
        return []
    return [
        family
        for family in FAMILIES
        if all(hasattr(library, f"td_stats_{pair}_{family}") for pair in _PAIRS)
        and library.td_family_runs(family.encode())
    ]


class _Choice:
    """The family the kernels run, once chosen."""

    family: str | None = None
    asked_family = ""  # Settings.kernel_family: "" for the best
    kernel = "compiled"  # Settings.kernel


KERNELS = ("compiled", "blocks", "numpy")


def configure(kernel: str = "compiled", family: str = "") -> None:
    """Which statistics path this process takes (Settings.kernel: "compiled"; "blocks", the kernel without the
    chunk loop; "numpy", neither) and which vector family the kernels run (Settings.kernel_family; "" for the best
    this CPU runs). Process-wide: services apply their settings when they open."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel {kernel!r} is not one of {', '.join(KERNELS)}")
    _Choice.kernel, _Choice.asked_family, _Choice.family = kernel, family.strip().lower(), None


def use_family(name: str | None) -> None:
    """Run the kernels of the vector family `name` from now on (ValueError unless families() has it); None goes back
    to the family configured (TENSOR_DEBUGGER_KERNEL_FAMILY), or the best, on next use."""
    if name is not None and name not in families():
        raise ValueError(f"kernel family {name!r} is not available here (this CPU runs: {families()})")
    _Choice.family = name


def kernel_family() -> str | None:
    """The vector family the kernels run (None without the kernel): the one use_family chose, else the one
    TENSOR_DEBUGGER_KERNEL_FAMILY names if this CPU runs it (a warning says when it does not), else the best."""
    if _Choice.family is None:
        available = families()
        if not available:
            return None
        asked = _Choice.asked_family
        if asked and asked not in available:
            logging.getLogger(__name__).warning(
                "%s=%s: not a kernel family this CPU runs (%s); using %s",
                FAMILY_VARIABLE,
                asked,
                ", ".join(available),
                available[0],
            )
        _Choice.family = asked if asked in available else available[0]
    return _Choice.family


def _function(library: ctypes.CDLL, name: str) -> Any:
    """The library's function `name` of the family in use (a ctypes function), or None where not built."""
    family = kernel_family()
    return None if family is None else getattr(library, f"{name}_{family}", None)


def kernel_setting() -> str:
    """The statistics path `configure` chose: "compiled", "blocks" or "numpy"."""
    return _Choice.kernel


def _numpy_asked() -> bool:
    return kernel_setting() == "numpy"


def kernel_name() -> str:
    """Which statistics kernel comparisons use: "compiled" or "numpy" (and why)."""
    if _numpy_asked():
        return "numpy (TENSOR_DEBUGGER_KERNEL=numpy)"
    if _library() is None:
        return f"numpy (no usable {LIBRARY_NAME} beside {Path(__file__).name})"
    if kernel_family() is None:
        return f"numpy ({LIBRARY_NAME} has no kernel family this CPU runs)"
    return "compiled"


def _compute(values: np.ndarray) -> np.ndarray:
    """Contiguous float32 or float64 values, exactly: narrower floats widen to float32, anything else (ints,
    bools) to float64, as the numpy path converts them."""
    if values.dtype not in _CODES:
        values = values.astype(np.float32 if values.dtype.kind == "f" and values.dtype.itemsize < 4 else np.float64)
    return np.ascontiguousarray(values)


def fused_partial(
    a: np.ndarray, b: np.ndarray, atol: float, rtol: float, check: bool, edges: np.ndarray, top: int = 0
) -> FusedPartial | None:
    """The statistics of flat real blocks `a` and `b` (same size) in one compiled pass, with their `top` worst
    elements, or None where the kernel is not in use. NaN and Inf are not looked for: the caller checks that
    `norm_a` and `norm_b` are finite (the kernel also sets norm_a to NaN where its sums of squares underflowed:
    engine/scaled_sums.py)."""
    if a.size != b.size:  # the kernel reads `a.size` values of each: never past the end of `b`
        raise ValueError(f"blocks differ in size: {a.size} and {b.size}")
    library = None if _numpy_asked() else _library()
    if library is None:
        return None
    a, b = _compute(a), _compute(b)
    function = _function(library, f"td_stats_{_CODES[a.dtype]}{_CODES[b.dtype]}")
    if function is None:
        return None
    out = empty_partial(top)
    function(a.ctypes.data, b.ctypes.data, a.size, 0, atol, rtol, int(check), edges.ctypes.data, ctypes.byref(out))
    return out


def kernel_address(a: np.dtype, b: np.dtype) -> int | None:
    """The address of the kernel that folds float32 or float64 values of dtypes `a` and `b` at given flat positions
    into a partial (td_stats_XY_<family>: a, b, n, base, atol, rtol, check, edges, partial), for a compiled loop
    that feeds it; None where the kernel is not in use or has no such loop."""
    library = None if _numpy_asked() else _library()
    if library is None or a not in _CODES or b not in _CODES:
        return None
    function = _function(library, f"td_stats_{_CODES[a]}{_CODES[b]}")
    return None if function is None else ctypes.cast(function, ctypes.c_void_p).value


def empty_partial(top: int = 0) -> FusedPartial:
    """A partial of no values (max_abs and argmax -1, the rest 0) that keeps `top` worst elements (0 to
    top_limit()), for a kernel to fold values into."""
    if not 0 <= top <= top_limit():
        raise ValueError(f"the number of worst elements must be 0 to {top_limit()}, got {top}")
    out = partial_type()()
    out.max_abs, out.argmax, out.top_k = -1.0, -1, top
    return out


def fused_summary(stored: np.ndarray, logical: str) -> FusedSummary | None:
    """The summary of a block of stored values of logical dtype `logical` in one compiled pass, or None where the
    kernel is not in use, has no loop for the dtype, or met a NaN or an Inf or overflowed: the caller then
    computes the block with numpy."""
    kernel = STORED_FLOATS.get(logical)
    library = None if kernel is None or _numpy_asked() else _library()
    if kernel is None or library is None or stored.dtype != kernel[1]:
        return None
    function = _function(library, f"td_summary_{kernel[0]}")
    if function is None:
        return None
    values = np.ascontiguousarray(stored).reshape(-1)
    out = summary_type()()
    if function(values.ctypes.data, values.size, ctypes.byref(out)) != 0:
        return None
    return out
