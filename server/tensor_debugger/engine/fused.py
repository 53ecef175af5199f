"""The compiled single-pass statistics kernels (fused_stats.c: a pair's statistics, a tensor's summary), loaded on
first use.

Which path statistics take is a `Kernel`, an object chosen per engine instance: services build one from Settings
(TENSOR_DEBUGGER_KERNEL, TENSOR_DEBUGGER_KERNEL_FAMILY; `Settings.statistics_kernel`), the CompareContext carries it
to every PairAccumulator and chunk loop, and the Ingestor to every tensor summary it computes (an ingest child builds
its own from the same settings), so that two kernels can compute side by side in one process. The package build
compiles the library next to this file (server/build_hooks.py); where it was not built, or TENSOR_DEBUGGER_KERNEL=numpy
asks for it, `Kernel.partial` returns None and pair_accumulator.py computes with numpy alone.
TENSOR_DEBUGGER_KERNEL=blocks keeps the kernel but not the chunk loop that feeds it stored chunks
(tensor_debugger.compare.compute.chunk_loop): blocks are then read into arrays first, as before that loop existed.

The library holds the kernels once per vector family (FAMILIES; fused_stats.c's header says what each is), and the
kernels run the best family this CPU runs, or the one Settings.kernel_family (TENSOR_DEBUGGER_KERNEL_FAMILY) names,
(a `Kernel`'s `family`). Callers handed no kernel (users' scripts calling the engine directly, tests of this
module's functions) take the default one that `configure` and `use_family` set, which the services never change;
nothing here reads the environment.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
from numpy.typing import NDArray

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
# summary kernels read each; the chunk loop (compare/compute/chunk_loop.c) widens "h" and "b" to float32 for the pair
# kernel.
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
            function = getattr(library, f"td_sketch_{code}_{family}", None)  # little-endian machines only
            if function is not None:
                function.restype = ctypes.c_int
                function.argtypes = [
                    ctypes.c_void_p,
                    ctypes.c_int64,
                    ctypes.POINTER(summary_type()),
                    ctypes.POINTER(ctypes.c_uint64),
                ]
        for code in ("ff", "dd"):
            function = getattr(library, f"td_where_{code}_{family}", None)
            if function is not None:
                function.restype = ctypes.c_int
                function.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 3
        function = getattr(library, f"td_fold64_{family}", None)
        if function is not None:
            function.restype = ctypes.c_uint64
            function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
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


KERNELS = ("compiled", "blocks", "numpy")


@dataclass(frozen=True)
class Kernel:
    """A statistics path, chosen per engine instance (services build one from Settings.kernel and
    Settings.kernel_family and carry it in the CompareContext; a test may hold several at once): `path` "compiled"
    (the kernels and the chunk loop that feeds them stored chunks), "blocks" (the kernels on blocks read into arrays)
    or "numpy" (neither: pair_accumulator.py computes with numpy alone); `family` the vector family the kernels run
    ("" for the best this CPU runs; one it does not run is warned of and the best taken)."""

    path: str = "compiled"
    family: str = ""

    def __post_init__(self) -> None:
        if self.path not in KERNELS:
            raise ValueError(f"kernel {self.path!r} is not one of {', '.join(KERNELS)}")
        object.__setattr__(self, "family", self.family.strip().lower())

    def __getstate__(self) -> dict[str, str]:
        """What a copy sent to another process holds: the choice, not the family this CPU resolved it to."""
        return {"path": self.path, "family": self.family}

    def __setstate__(self, state: dict[str, str]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)

    @functools.cached_property
    def family_in_use(self) -> str | None:
        """The vector family the kernels run (None without the kernel): `family` if this CPU runs it (a warning says
        when it does not), else the best."""
        available = families()
        if not available:
            return None
        if self.family and self.family not in available:
            logging.getLogger(__name__).warning(
                "%s=%s: not a kernel family this CPU runs (%s); using %s",
                FAMILY_VARIABLE,
                self.family,
                ", ".join(available),
                available[0],
            )
        return self.family if self.family in available else available[0]

    @property
    def compiled(self) -> bool:
        """Whether this path asks for the compiled kernels ("compiled" or "blocks")."""
        return self.path != "numpy"

    def name(self) -> str:
        """Which statistics kernel comparisons use: "compiled" or "numpy" (and why)."""
        if not self.compiled:
            return "numpy (TENSOR_DEBUGGER_KERNEL=numpy)"
        if _library() is None:
            return f"numpy (no usable {LIBRARY_NAME} beside {Path(__file__).name})"
        if self.family_in_use is None:
            return f"numpy ({LIBRARY_NAME} has no kernel family this CPU runs)"
        return "compiled"

    def function(self, name: str) -> Any:
        """The library's function `name` of this kernel's family (a ctypes function), or None where the compiled
        kernels are not in use or it was not built."""
        library = _library() if self.compiled else None
        family = None if library is None else self.family_in_use
        return None if library is None or family is None else getattr(library, f"{name}_{family}", None)

    def partial(
        self, a: NDArray[Any], b: NDArray[Any], atol: float, rtol: float, check: bool, edges: NDArray[Any], top: int = 0
    ) -> FusedPartial | None:
        """The statistics of flat real blocks `a` and `b` (same size) in one compiled pass, with their `top` worst
        elements, or None where the kernel is not in use. NaN and Inf are not looked for: the caller checks that
        `norm_a` and `norm_b` are finite (the kernel also sets norm_a to NaN where its sums of squares underflowed:
        engine/scaled_sums.py)."""
        if a.size != b.size:  # the kernel reads `a.size` values of each: never past the end of `b`
            raise ValueError(f"blocks differ in size: {a.size} and {b.size}")
        if not self.compiled:
            return None
        a, b = _compute(a), _compute(b)
        function = self.function(f"td_stats_{_CODES[a.dtype]}{_CODES[b.dtype]}")
        if function is None:
            return None
        out = empty_partial(top)
        function(a.ctypes.data, b.ctypes.data, a.size, 0, atol, rtol, int(check), edges.ctypes.data, ctypes.byref(out))
        return out

    def address(self, a: np.dtype[Any], b: np.dtype[Any]) -> int | None:
        """The address of the kernel that folds float32 or float64 values of dtypes `a` and `b` at given flat
        positions into a partial (td_stats_XY_<family>: a, b, n, base, atol, rtol, check, edges, partial), for a
        compiled loop that feeds it; None where the kernel is not in use or has no such loop."""
        if a not in _CODES or b not in _CODES:
            return None
        function = self.function(f"td_stats_{_CODES[a]}{_CODES[b]}")
        return None if function is None else ctypes.cast(function, ctypes.c_void_p).value

    def _stored_loop(self, prefix: str, stored: NDArray[Any], logical: str) -> tuple[Any, NDArray[Any]] | None:
        """The compiled loop `prefix`_<dtype> for a block of stored values of logical dtype `logical`, and the block
        as one contiguous run of values; None where the kernel is not in use or has no such loop."""
        kernel = STORED_FLOATS.get(logical)
        if kernel is None or stored.dtype != kernel[1]:
            return None
        function = self.function(f"{prefix}_{kernel[0]}")
        if function is None:
            return None
        return function, np.ascontiguousarray(stored).reshape(-1)

    def summary(self, stored: NDArray[Any], logical: str) -> FusedSummary | None:
        """The summary of a block of stored values of logical dtype `logical` in one compiled pass, or None where
        the kernel is not in use, has no loop for the dtype, or met a NaN or an Inf or overflowed: the caller then
        computes the block with numpy."""
        found = self._stored_loop("td_summary", stored, logical)
        if found is None:
            return None
        function, values = found
        out = summary_type()()
        if function(values.ctypes.data, values.size, ctypes.byref(out)) != 0:
            return None
        return out

    def sketch(self, stored: NDArray[Any], logical: str) -> tuple[FusedSummary | None, int] | None:
        """`summary` of a block of stored values and, in the same compiled pass, the "fold64" sum of its bytes
        (`fold64` from its first word): None where the kernel is not in use or has no such loop for the dtype; the
        summary None (the fold64 sum still given) where the block met a NaN or an Inf or overflowed."""
        found = self._stored_loop("td_sketch", stored, logical)
        if found is None:
            return None
        function, values = found
        out, fold = summary_type()(), ctypes.c_uint64(0)
        finite = function(values.ctypes.data, values.size, ctypes.byref(out), ctypes.byref(fold)) == 0
        return (out if finite else None), int(fold.value)

    def where_sums(self, a: NDArray[Any], b: NDArray[Any]) -> tuple[NDArray[Any], NDArray[Any]] | None:
        """For C-contiguous 2-D blocks `a` and `b` of one shape and dtype (float32 or float64): per row the sum of
        the squared differences (widened to float64), per column the sum down the rows, bit for bit as
        engine/where.py's numpy path sums them; None where the kernel is not in use, has no loop for the dtype, the
        rows are longer than WHERE_ROW_LIMIT, or it met a square or a row sum that is not finite (the numpy path
        then counts those)."""
        code = {np.dtype(np.float32): "ff", np.dtype(np.float64): "dd"}.get(a.dtype)
        if code is None or b.dtype != a.dtype or a.shape != b.shape or a.ndim != 2:
            return None
        if not (a.flags.c_contiguous and b.flags.c_contiguous):
            return None
        function = self.function(f"td_where_{code}")
        if function is None:
            return None
        rows, last = a.shape
        if last > WHERE_ROW_LIMIT:
            return None
        row_sums, down, scratch = np.empty(rows), np.empty(last), np.empty(last)
        if function(
            a.ctypes.data, b.ctypes.data, rows, last, row_sums.ctypes.data, down.ctypes.data, scratch.ctypes.data
        ):
            return None
        return row_sums, down

    def fold64(self, data: NDArray[Any], first: int = 0) -> int | None:
        """The "fold64" sum (ingest/sketches.py's `content_hash`: unsigned, modulo 2^64) of the bytes of the
        contiguous array `data`, its first word being word number `first` (0-based) of the tensor, the last one
        padded with zero bytes; None where the kernel is not in use."""
        function = self.function("td_fold64")
        if function is None:
            return None
        if not data.flags.c_contiguous:
            raise ValueError("fold64 reads a C-contiguous array's bytes")
        return int(function(data.ctypes.data, data.nbytes, first))


# The longest row the compiled where pass sums: numpy's own order for a longer row changed between releases (2.0
# sums it in pieces of its 8,192-element buffer, later releases whole), so such a row keeps numpy's path and its sums
# stay those of the numpy installed, bit for bit.
WHERE_ROW_LIMIT = 8192


class _Default:
    """The kernel of callers not handed one (tests of the module's functions, a user's script that calls the
    engine directly): what `configure` and `use_family` set. Comparisons take their CompareContext's kernel, ingest
    its Ingestor's."""

    configured = Kernel()
    kernel = Kernel()


def default_kernel() -> Kernel:
    """The kernel `configure` (and `use_family`) chose for callers not handed one."""
    return _Default.kernel


def configure(kernel: str = "compiled", family: str = "") -> None:
    """The kernel of callers not handed one (`default_kernel`): Settings.kernel and Settings.kernel_family, as for
    a `Kernel`. The services never call it: comparisons carry their own (CompareContext.kernel), ingest its own
    (Ingestor.kernel)."""
    _Default.configured = _Default.kernel = Kernel(kernel, family)


def use_family(name: str | None) -> None:
    """Run the default kernel's vector family `name` from now on (ValueError unless families() has it); None goes
    back to the family configured, or the best."""
    if name is not None and name not in families():
        raise ValueError(f"kernel family {name!r} is not available here (this CPU runs: {families()})")
    _Default.kernel = _Default.configured if name is None else Kernel(_Default.configured.path, name)


def kernel_family() -> str | None:
    """The vector family the default kernel runs (None without the kernel)."""
    return _Default.kernel.family_in_use


def kernel_setting() -> str:
    """The default kernel's path: "compiled", "blocks" or "numpy"."""
    return _Default.kernel.path


def kernel_name() -> str:
    """Which statistics kernel the default kernel uses: "compiled" or "numpy" (and why)."""
    return _Default.kernel.name()


def _compute(values: NDArray[Any]) -> NDArray[Any]:
    """Contiguous float32 or float64 values, exactly: narrower floats widen to float32, anything else (ints,
    bools) to float64, as the numpy path converts them."""
    if values.dtype not in _CODES:
        values = values.astype(np.float32 if values.dtype.kind == "f" and values.dtype.itemsize < 4 else np.float64)
    return np.ascontiguousarray(values)


def empty_partial(top: int = 0) -> FusedPartial:
    """A partial of no values (max_abs and argmax -1, the rest 0) that keeps `top` worst elements (0 to
    top_limit()), for a kernel to fold values into."""
    if not 0 <= top <= top_limit():
        raise ValueError(f"the number of worst elements must be 0 to {top_limit()}, got {top}")
    out = partial_type()()
    out.max_abs, out.argmax, out.top_k = -1.0, -1, top
    return out


def fused_partial(
    a: NDArray[Any], b: NDArray[Any], atol: float, rtol: float, check: bool, edges: NDArray[Any], top: int = 0
) -> FusedPartial | None:
    """`Kernel.partial` of the default kernel."""
    return _Default.kernel.partial(a, b, atol, rtol, check, edges, top)


def kernel_address(a: np.dtype[Any], b: np.dtype[Any]) -> int | None:
    """`Kernel.address` of the default kernel."""
    return _Default.kernel.address(a, b)


def fused_summary(stored: NDArray[Any], logical: str) -> FusedSummary | None:
    """`Kernel.summary` of the default kernel."""
    return _Default.kernel.summary(stored, logical)
