"""The statistics kernels built for aarch64 with the build hook's own commands (cross-compiled), run under
qemu-aarch64 through a small C driver (kernel_driver.c), give what numpy computes. The chunk loop (compare/chunk_loop.c)
is left out: it needs C-Blosc2, which the Python packages here hold for this machine only. Skipped where the cross
compiler, the emulator or the aarch64 C library is missing (`make install-test` installs them with apt-get:
gcc-aarch64-linux-gnu, qemu-user, libc6-arm64-cross)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from tensor_debugger.engine.metrics import edges

from tests.kernel_reference import check_partial, pair_case

REPO = Path(__file__).resolve().parent.parent
CROSS = "aarch64-linux-gnu-gcc"
EMULATOR = "qemu-aarch64"
SYSROOT = Path("/usr/aarch64-linux-gnu")  # the aarch64 C library, for the emulator's -L
EM_AARCH64 = 183  # ELF e_machine

MISSING = [what for what, present in ((CROSS, shutil.which(CROSS)), (EMULATOR, shutil.which(EMULATOR)),
                                       (str(SYSROOT / "lib"), (SYSROOT / "lib").is_dir())) if not present]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"no {', '.join(MISSING)}: cannot build and run for aarch64 "
                                "here (apt-get install gcc-aarch64-linux-gnu qemu-user libc6-arm64-cross)")


def build_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_hooks", REPO / "server" / "build_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def elf_machine(path: Path) -> int:
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF"
    return int.from_bytes(header[18:20], "little")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The kernel library for aarch64, as the build hook makes it there, and the driver."""
    folder = tmp_path_factory.mktemp("aarch64")
    library, driver = folder / "_fused_stats.so", folder / "kernel_driver"
    done, problems = build_hooks().compile_families(REPO, "engine/fused_stats.c", library, compiler=[CROSS],
                                                    machine="aarch64")
    assert done and not problems, problems
    subprocess.run([CROSS, "-O1", "-Wall", "-Werror", "-o", str(driver), str(REPO / "tests" / "kernel_driver.c")],
                   check=True, capture_output=True, text=True)
    return library, driver


def run(built: tuple[Path, Path], *args: str | Path) -> dict[str, str]:
    """The driver's output lines under the emulator, by name."""
    library, driver = built
    done = subprocess.run([EMULATOR, "-L", str(SYSROOT), str(driver), str(library), "baseline", *map(str, args)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["runs"] == "1"
    return lines


def test_the_library_and_the_driver_are_built_for_aarch64(built: tuple[Path, Path]) -> None:
    assert elf_machine(built[0]) == elf_machine(built[1]) == EM_AARCH64


@pytest.mark.parametrize("pair", ["ff", "fd", "df", "dd"])
def test_pair_kernel_on_aarch64_gives_what_numpy_computes(built: tuple[Path, Path], tmp_path: Path,
                                                         pair: str) -> None:
    dtypes = {"f": np.float32, "d": np.float64}
    atol, rtol = 1e-5, 1.3e-6
    bins = edges()
    (tmp_path / "edges").write_bytes(bins.astype(np.float64).tobytes())
    for size in (1, 2, 3, 2047, 2049, 5000):
        a, b = pair_case(size, seed=size)
        a, b = a.astype(dtypes[pair[0]]), b.astype(dtypes[pair[1]])
        (tmp_path / "a").write_bytes(a.tobytes())
        (tmp_path / "b").write_bytes(b.tobytes())
        out = run(built, "stats", pair, size, atol, rtol, tmp_path / "a", tmp_path / "b", tmp_path / "edges")
        assert out["returned"] == "0 0"
        got: dict[str, object] = {name: float(value) for name, value in out.items()
                                  if name not in ("runs", "returned", "at_least")}
        got["at_least"] = [int(v) for v in out["at_least"].split()]
        check_partial(got, a, b, atol, rtol, bins, (pair, size))


def test_nan_inf_and_overflow_are_reported_on_aarch64(built: tuple[Path, Path], tmp_path: Path) -> None:
    """The kernel returns 1 from the call that meets a NaN, an Inf or a square that overflows (the block is then
    the numpy path's), 0 before it."""
    (tmp_path / "edges").write_bytes(edges().astype(np.float64).tobytes())
    for bad in (np.nan, np.inf, 1e200):
        a = np.linspace(-1, 1, 100)
        b = a + 1e-3
        b[70] = bad
        (tmp_path / "a").write_bytes(a.tobytes())
        (tmp_path / "b").write_bytes(b.tobytes())
        out = run(built, "stats", "dd", a.size, 1e-5, 1e-5, tmp_path / "a", tmp_path / "b", tmp_path / "edges")
        assert out["returned"] == "0 1", bad


@pytest.mark.parametrize("code", ["f", "d", "h", "b"])
def test_summary_kernel_on_aarch64_gives_what_numpy_computes(built: tuple[Path, Path], tmp_path: Path,
                                                            code: str) -> None:
    values = np.random.default_rng(3).standard_normal(5003).astype(np.float32) * 3 + 1
    stored = {"f": values, "d": values.astype(np.float64), "h": values.astype(np.float16),
              "b": (values.view(np.uint32) >> 16).astype(np.uint16)}[code]
    widened = (stored.astype(np.uint32) << 16).view(np.float32) if code == "b" else stored
    exact = widened.astype(np.float64)
    (tmp_path / "values").write_bytes(stored.tobytes())
    out = run(built, "summary", code, stored.size, tmp_path / "values")
    assert out["returned"] == "0"
    assert (float(out["count"]), float(out["min"]), float(out["max"])) == (exact.size, exact.min(), exact.max())
    assert float(out["mean"]) == pytest.approx(exact.mean(), rel=1e-12)
    assert float(out["m2"]) == pytest.approx(((exact - exact.mean()) ** 2).sum(), rel=1e-12)
    stored[17] = np.nan if code != "b" else 0x7FC0  # a NaN: the numpy path's block
    (tmp_path / "values").write_bytes(stored.tobytes())
    assert run(built, "summary", code, stored.size, tmp_path / "values")["returned"] == "1"
