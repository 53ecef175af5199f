"""The statistics kernels built for aarch64 with the build hook's own commands (cross-compiled), run under qemu-aarch64
through a small C driver (kernel_driver.c), give what numpy computes; so does the chunk loop
(compare/compute/chunk_loop.c, cross-compiled with the build hook's flags against C-Blosc2 from the blosc2 wheel for
manylinux aarch64) with the baseline family's pair kernel, on chunk files Blosc-encoded as the store writes them.
Skipped where the cross compiler, the emulator or the aarch64 C library is missing (`make install-test` installs them
with apt-get: gcc-aarch64-linux-gnu, qemu-user, libc6-arm64-cross); the chunk loop's tests are skipped where that wheel
is not unpacked in the virtual environment's cross/ folder (`make cross` downloads it)."""

from __future__ import annotations

import functools
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from numcodecs import Blosc
from numpy.typing import NDArray
from tensor_debugger.engine.fused import STORED_FLOATS
from tensor_debugger.engine.metrics import edges
from tensor_debugger.store import compression
from tensor_debugger.store.zarr_backend import DEFAULT_CODEC

from tests.support.built_once import built_once
from tests.support.kernel_reference import check_partial, pair_case

REPO = Path(__file__).resolve().parents[2]
CROSS = "aarch64-linux-gnu-gcc"
EMULATOR = "qemu-aarch64"
SYSROOT = Path("/usr/aarch64-linux-gnu")  # the aarch64 C library, for the emulator's -L
EM_AARCH64 = 183  # ELF e_machine
BLOSC2 = Path(sys.prefix) / "cross" / "blosc2"  # the blosc2 wheel for aarch64, unpacked by `make cross`

MISSING = [
    what
    for what, present in (
        (CROSS, shutil.which(CROSS)),
        (EMULATOR, shutil.which(EMULATOR)),
        (str(SYSROOT / "lib"), (SYSROOT / "lib").is_dir()),
    )
    if not present
]
pytestmark = pytest.mark.skipif(
    bool(MISSING),
    reason=f"no {', '.join(MISSING)}: cannot build and run for aarch64 "
    "here (apt-get install gcc-aarch64-linux-gnu qemu-user libc6-arm64-cross)",
)


@functools.cache
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


def build_library_and_driver(folder: Path) -> dict[str, Any]:
    library, driver = folder / "_fused_stats.so", folder / "kernel_driver"
    done, problems = build_hooks().compile_families(
        REPO, "engine/fused_stats.c", library, compiler=[CROSS], machine="aarch64"
    )
    assert done and not problems, problems
    source = REPO / "tests" / "support" / "kernel_driver.c"
    subprocess.run(
        [CROSS, "-O1", "-Wall", "-Werror", "-o", str(driver), str(source)], check=True, capture_output=True, text=True
    )
    return {}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The kernel library for aarch64, as the build hook makes it there, and the driver: built once for the run
    (tests/support/built_once.py), not once per pytest worker that runs one of the module's tests."""
    folder, _ = built_once(tmp_path_factory, "aarch64-kernels", build_library_and_driver)
    return folder / "_fused_stats.so", folder / "kernel_driver"


def run(built: tuple[Path, Path], *args: object) -> dict[str, str]:
    """The driver's output lines under the emulator, by name."""
    library, driver = built
    done = subprocess.run(
        [EMULATOR, "-L", str(SYSROOT), str(driver), str(library), "baseline", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["runs"] == "1"
    return lines


def fields(out: dict[str, str]) -> dict[str, object]:
    """The partial's fields from the driver's lines, at_least as a list."""
    got: dict[str, object] = {
        name: float(value) for name, value in out.items() if name not in ("runs", "returned", "at_least", "float16")
    }
    got["at_least"] = [int(v) for v in out["at_least"].split()]
    return got


def test_the_library_and_the_driver_are_built_for_aarch64(built: tuple[Path, Path]) -> None:
    assert elf_machine(built[0]) == elf_machine(built[1]) == EM_AARCH64


@pytest.mark.parametrize("pair", ["ff", "fd", "df", "dd"])
def test_pair_kernel_on_aarch64_gives_what_numpy_computes(built: tuple[Path, Path], tmp_path: Path, pair: str) -> None:
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
        check_partial(fields(out), a, b, atol, rtol, bins, (pair, size))


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
def test_summary_kernel_on_aarch64_gives_what_numpy_computes(
    built: tuple[Path, Path], tmp_path: Path, code: str
) -> None:
    values = np.random.default_rng(3).standard_normal(5003).astype(np.float32) * 3 + 1
    by_code: dict[str, NDArray[Any]] = {
        "f": values,
        "d": values.astype(np.float64),
        "h": values.astype(np.float16),
        "b": (values.view(np.uint32) >> 16).astype(np.uint16),
    }
    stored = by_code[code]
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


@pytest.fixture(scope="module")
def chunk_loop(built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chunk-loop library for aarch64, compiled with the build hook's flags and linked with the aarch64 wheel's
    C-Blosc2, once for the run as `built`."""
    hooks = build_hooks()
    flags = hooks.blosc2_flags(BLOSC2)
    if isinstance(flags, str):
        why = "it is not there" if not BLOSC2.is_dir() else flags
        pytest.skip(
            f"no C-Blosc2 for aarch64: `make cross` unpacks the blosc2 wheel for manylinux aarch64 into "
            f"{BLOSC2.parent}, and {why} (say, it could not be downloaded)"
        )

    def build(folder: Path) -> dict[str, Any]:
        subprocess.run(
            [
                CROSS,
                *hooks.FLAGS,
                "-o",
                str(folder / "_chunk_loop.so"),
                str(REPO / hooks.PACKAGE / "compare" / "compute" / "chunk_loop.c"),
                *flags,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        return {}

    library = built_once(tmp_path_factory, "aarch64-chunk-loop", build)[0] / "_chunk_loop.so"
    assert elf_machine(library) == EM_AARCH64
    return library


STORED = {code: dtype for code, dtype in STORED_FLOATS.values()}  # the loop's letter -> the stored numpy dtype


def storage(values: NDArray[Any], code: str) -> NDArray[Any]:
    """`values` as stored for the loop's letter `code` (bfloat16 as its raw bits)."""
    if code == "b":
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(STORED[code])


def widened(stored: NDArray[Any], code: str) -> NDArray[Any]:
    """The values the pair kernel reads for `stored` values: float64 as they are, the rest as float32."""
    if code == "b":
        return (stored.astype(np.uint32) << 16).view(np.float32)
    return stored if code == "d" else stored.astype(np.float32)


def write_chunks(folder: Path, stored: NDArray[Any], chunk: int) -> list[Path]:
    """`stored` (flat) in chunk files of `chunk` values each, Blosc-encoded with the store's codec settings (the
    last chunk whole, padded with zeros, as Zarr stores an edge chunk)."""
    codec = Blosc(
        cname=compression.CNAME,  # the settings DEFAULT_CODEC is built from (zarr types its fields differently)
        clevel=compression.CLEVEL,
        shuffle=getattr(Blosc, compression.SHUFFLE.upper()),
        blocksize=DEFAULT_CODEC.blocksize,
        typesize=stored.itemsize,
    )
    folder.mkdir()
    padded = np.zeros(-(-stored.size // chunk) * chunk, dtype=stored.dtype)
    padded[: stored.size] = stored
    paths = []
    for i in range(padded.size // chunk):
        path = folder / str(i)
        path.write_bytes(codec.encode(padded[i * chunk : (i + 1) * chunk]))
        paths.append(path)
    return paths


def side(paths: list[Path], chunk: int, itemsize: int, start: int, stop: int) -> list[str | int | Path]:
    """The driver's arguments for one side of flat values [start, stop): chunk bytes, the number of pieces, and
    each piece's file, the values of its chunk before it, and its count (what ChunkReader.flat_pieces gives)."""
    pieces: list[str | int | Path] = []
    for i in range(start // chunk, -(-stop // chunk)):
        first, last = max(start, i * chunk), min(stop, (i + 1) * chunk)
        pieces += [paths[i], first - i * chunk, last - first]
    return [chunk * itemsize, len(pieces) // 3, *pieces]


@pytest.mark.parametrize("codes", ["ff", "bb", "hh", "fb", "hd", "df"])
def test_chunk_loop_on_aarch64_gives_what_numpy_computes(
    built: tuple[Path, Path], chunk_loop: Path, tmp_path: Path, codes: str
) -> None:
    """Chunks of 640 values on one side and 1000 on the other; blocks from the whole array to one value, starting
    at a chunk's start or inside one on either side."""
    atol, rtol = 1e-5, 1.3e-6
    bins = edges()
    (tmp_path / "edges").write_bytes(bins.astype(np.float64).tobytes())
    size, chunks = 4999, (640, 1000)
    a, b = pair_case(size, seed=7)
    stored = storage(a, codes[0]), storage(b, codes[1])
    wa, wb = widened(stored[0], codes[0]), widened(stored[1], codes[1])
    paths = [
        write_chunks(tmp_path / name, values, chunk) for name, values, chunk in zip("ab", stored, chunks, strict=True)
    ]
    for start, stop in ((0, size), (300, 4321), (1280, 3000), (2500, 2501), (4990, size)):
        out = run(
            built,
            "loop",
            chunk_loop,
            codes,
            atol,
            rtol,
            tmp_path / "edges",
            *side(paths[0], chunks[0], stored[0].itemsize, start, stop),
            *side(paths[1], chunks[1], stored[1].itemsize, start, stop),
        )
        if "h" in codes and out["float16"] == "0":
            pytest.skip("the aarch64 compiler has no _Float16: the loop does not widen float16 there")
        assert out["returned"] == "0 - -1", (codes, start, stop)
        check_partial(fields(out), wa[start:stop], wb[start:stop], atol, rtol, bins, (codes, start, stop))


def test_chunk_loop_on_aarch64_stops_at_a_missing_or_cut_chunk_or_a_nan(
    built: tuple[Path, Path], chunk_loop: Path, tmp_path: Path
) -> None:
    """A missing chunk file gives TDC_MISSING (1), one cut short TDC_NOT_A_CHUNK (3), each with its side and piece;
    a NaN gives TDC_NOT_FINITE (6)."""
    (tmp_path / "edges").write_bytes(edges().astype(np.float64).tobytes())
    a = np.linspace(0.0, 1.0, 3000, dtype=np.float32)  # smooth: compressed, not stored as it is
    b = a + np.float32(1e-3)
    paths = [write_chunks(tmp_path / name, values, 500) for name, values in (("a", a), ("b", b))]

    def returned() -> str:
        out = run(
            built,
            "loop",
            chunk_loop,
            "ff",
            1e-5,
            1e-5,
            tmp_path / "edges",
            *side(paths[0], 500, 4, 100, 2900),
            *side(paths[1], 500, 4, 100, 2900),
        )
        return out["returned"]

    assert returned() == "0 - -1"
    intact = paths[1][3].read_bytes()
    paths[1][3].write_bytes(intact[:-7])  # cut short
    assert returned() == "3 b 3"
    paths[1][3].write_bytes(intact)
    paths[0][2].unlink()
    assert returned() == "1 a 2"
    paths[0] = write_chunks(tmp_path / "nan", np.where(np.arange(3000) == 1234, np.float32(np.nan), a), 500)
    assert returned() == "6 - -1"
