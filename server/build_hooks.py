"""Hatch build hook: compile the statistics kernel (tensor_debugger/engine/fused_stats.c) and the chunk-pair loop
(tensor_debugger/compare/compute/chunk_loop.c) into the wheel.

A wheel gets `tensor_debugger/engine/_fused_stats.so`, `tensor_debugger/compare/compute/_chunk_loop.so` and a platform
tag; an editable install gets each library beside its source, where the package is imported from. Without a C compiler
(or when it fails) the build goes on pure Python, says so, and comparisons compute with numpy alone, about three times
slower (`tensor_debugger.engine.fused.kernel_name()` tells which one is in use). CC names the compiler (default cc).

The kernel is compiled once per vector family of the target architecture (FAMILIES: the instruction set and the
doubles per vector of each) and once for the functions the families share, into one library (compile_families);
the loader picks the best family the CPU runs. A family the compiler cannot build (say, one too old for
-march=x86-64-v4) is left out, with a warning.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGE = Path("server/tensor_debugger")
# source -> library, both relative to the package; the loop links nothing: it gets the kernel as a pointer
LIBRARIES = {
    "engine/fused_stats.c": "engine/_fused_stats.so",
    "compare/compute/chunk_loop.c": "compare/compute/_chunk_loop.so",
}
NEEDS_BLOSC2 = frozenset({"compare/compute/chunk_loop.c"})  # compiled against C-Blosc2, linked in statically
# No fused multiply-add (the tolerance test must round as numpy does); the kernel's own vectors do the rest.
FLAGS = [
    "-O3",
    "-shared",
    "-fPIC",
    "-pthread",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-Wall",
    "-Wno-psabi",
]
# x86-64: the AVX-512 clone converts float32 to double 512 bits at a time, not in 256-bit halves (measured: 10%
# faster on AMD EPYC); other architectures do not know the flag.
X86_FLAGS = ["-mprefer-vector-width=512"]


def blosc2_flags(package: Path | None = None) -> list[str] | str:
    """Compiler flags that build against C-Blosc2's header and link its static library in, both from the blosc2
    package (a build requirement: its wheels ship C-Blosc2's headers and libraries for other programs to build
    against); else why not. `package` is the package's folder (say, one unpacked from another architecture's wheel
    for a cross build); by default, the one installed where the build runs."""
    if package is None:
        spec = importlib.util.find_spec("blosc2")  # finds the package without importing it
        if spec is None or not spec.submodule_search_locations:
            return "the blosc2 package (C-Blosc2's header and library) is not installed where the build runs"
        package = Path(next(iter(spec.submodule_search_locations)))
    header, archive = package / "include" / "blosc2.h", package / "lib" / "libblosc2.a"
    if not header.is_file() or not archive.is_file():
        return f"the blosc2 package at {package} has no include/blosc2.h or lib/libblosc2.a (blosc2 4.0 or newer has)"
    # the archive's own symbols stay private to the library, so another C-Blosc2 in the process is not disturbed
    return (
        [f"-I{header.parent}", str(archive), "-Wl,--exclude-libs,ALL", "-lm"]
        if sys.platform.startswith("linux")
        else [f"-I{header.parent}", str(archive), "-lm"]
    )


def compile_library(root: Path, source: str, output: Path) -> str | None:
    """Compile `source` (relative to the package) to `output`; None on success, else why not."""
    compiler = shlex.split(os.environ.get("CC", "cc"))
    if shutil.which(compiler[0]) is None:
        return f"no C compiler ({compiler[0]!r} not found; set CC)"
    if sys.platform == "win32":
        return "the kernel is built with a Unix C compiler only"
    extra: list[str] = []
    if source in NEEDS_BLOSC2:
        found = blosc2_flags()
        if isinstance(found, str):
            return f"{source} not built: {found}"
        extra = found
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    command = [*compiler, *FLAGS, *(X86_FLAGS if x86 else []), "-o", str(output), str(root / PACKAGE / source), *extra]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return f"{' '.join(command)} failed:\n{done.stderr.strip()}"
    return None


# The sources compiled by compile_families.
PER_FAMILY = {"engine/fused_stats.c"}
# architecture -> family -> (doubles per vector, flags), best first; any other architecture gets BASELINE alone.
BASELINE = {"baseline": (2, [])}
FAMILIES = {
    "x86_64": {"avx512": (8, ["-march=x86-64-v4", *X86_FLAGS]), "avx2": (4, ["-march=x86-64-v3"]), **BASELINE},
    "aarch64": BASELINE,  # NEON: 128 bits
}


def architecture(machine: str) -> str:
    """FAMILIES' name for `machine` as platform.machine() gives it."""
    machine = machine.lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def _run(command: list[str]) -> str | None:
    done = subprocess.run(command, capture_output=True, text=True)
    return None if done.returncode == 0 else f"{' '.join(command)} failed:\n{done.stderr.strip()}"


def compile_families(
    root: Path, source: str, output: Path, compiler: list[str] | None = None, machine: str | None = None
) -> tuple[bool, list[str]]:
    """Compile `source` (relative to the package) once per family of the CPU architecture `machine` (default: this
    one's) with TD_FAMILY and TD_LANES defined, once without, and link the objects into the shared library
    `output`, with `compiler` (default: CC). Whether the library was built, and what went wrong (a family left out
    is named there though the library was built)."""
    compiler = compiler or shlex.split(os.environ.get("CC", "cc"))
    if shutil.which(compiler[0]) is None:
        return False, [f"no C compiler ({compiler[0]!r} not found; set CC)"]
    if sys.platform == "win32":
        return False, ["the kernel is built with a Unix C compiler only"]
    path = str(root / PACKAGE / source)
    families = FAMILIES.get(architecture(machine or platform.machine()), BASELINE)
    with tempfile.TemporaryDirectory(prefix="tensor-debugger-kernel-") as scratch:
        shared = Path(scratch) / "shared.o"
        commands = [[*compiler, *FLAGS, "-c", "-o", str(shared), path]]
        for family, (lanes, flags) in families.items():
            target = Path(scratch) / f"{family}.o"
            commands.append(
                [
                    *compiler,
                    *FLAGS,
                    *flags,
                    f"-DTD_FAMILY={family}",
                    f"-DTD_LANES={lanes}",
                    "-c",
                    "-o",
                    str(target),
                    path,
                ]
            )
        # the objects are independent: compiled side by side, one compiler per CPU
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            shared_problem, *family_problems = pool.map(_run, commands)
        if shared_problem is not None:
            return False, [shared_problem]
        objects = [str(shared)]
        problems = []
        for family, problem in zip(families, family_problems, strict=True):
            if problem is None:
                objects.append(str(Path(scratch) / f"{family}.o"))
            else:
                problems.append(f"kernel family {family} left out: {problem}")
        if len(objects) == 1:
            return False, problems
        problem = _run([*compiler, "-shared", "-o", str(output), *objects])
        return problem is None, problems + ([] if problem is None else [problem])


def build(root: Path, source: str, output: Path) -> tuple[bool, list[str]]:
    """compile_families or compile_library, as `source` needs."""
    if source in PER_FAMILY:
        return compile_families(root, source, output)
    problem = compile_library(root, source, output)
    return problem is None, [] if problem is None else [problem]


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        problems = []
        built = 0
        if version != "editable":
            self._scratch = tempfile.mkdtemp(prefix="tensor-debugger-kernel-")
        for source, library in LIBRARIES.items():
            if version == "editable":  # imported from server/: the library goes beside its source
                done, trouble = build(root, source, root / PACKAGE / library)
            else:
                output = Path(self._scratch) / Path(library).name
                done, trouble = build(root, source, output)
                if done:
                    build_data["force_include"][str(output)] = "tensor_debugger/" + library
            built += done
            problems += trouble
        if problems:  # without the kernel, numpy computes; without the chunk loop, blocks are read into arrays
            self.app.display_warning(
                "tensor-debugger: compiled parts not built or not whole (comparisons may be "
                "slower): " + "\n".join(problems)
            )
        if not built:
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
