"""What every benchmark here shares: the machine line it prints, and children run and measured (stdlib only, so
that a benchmark's own process stays free of torch and zarr, whose memory would inflate its children's RSS)."""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

MB = 1e6


def machine_line(versions: str) -> str:
    """ "machine: CPU, cores, RAM; Python and `versions`"."""
    cpu = "unknown CPU"
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    with open("/proc/meminfo", encoding="utf-8") as f:
        ram_kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return (
        f"machine: {cpu}, {os.cpu_count()} cores, {ram_kib / (1 << 20):.1f} GiB RAM; "
        f"Python {platform.python_version()}, {versions}"
    )


def child_env(keep: tuple[str, ...] = ()) -> dict[str, str]:
    """This environment without TENSOR_DEBUGGER_* settings (but those in `keep`), so --data-dir alone decides
    where data goes."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_DEBUGGER_") or k in keep}


def compile_package(python: Path, *others: str | Path) -> None:
    """Compile this checkout's package to bytecode, as an installed copy has it, and the `others` (another
    checkout's `server/` folder timed beside it). A shell with PYTHONDONTWRITEBYTECODE=1 (this machine's) leaves an
    editable install without it, and every command timed would then compile the package's source at each import
    (0.3 CPU s of a compare's start-up at load 36)."""
    server = Path(__file__).resolve().parent.parent / "server"
    folders = [str(server), *(str(other) for other in others)]
    subprocess.run([str(python), "-m", "compileall", "-q", *folders], check=True, stdout=subprocess.DEVNULL)


def run_child(cmd: list[str], env: dict[str, str], ok: frozenset[int] = frozenset({0})) -> tuple[float, float, str]:
    """Run `cmd`; return (wall seconds, peak RSS in MB from wait4, stdout). Exits with its stderr if its exit status
    is not in `ok`."""
    wall, rss, _, out = run_child_cpu(cmd, env, ok)
    return wall, rss, out


def run_child_cpu(
    cmd: list[str], env: dict[str, str], ok: frozenset[int] = frozenset({0})
) -> tuple[float, float, float, str]:
    """`run_child`, with the CPU seconds (user and system) of the child and the children it waited for, which a
    loaded machine changes far less than wall time: (wall seconds, peak RSS in MB, CPU seconds, stdout)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode not in ok:
            sys.exit(
                f"failed (exit {proc.returncode}): {' '.join(cmd)}\nstdout: {out.read().decode()}\n"
                f"stderr: {err.read().decode()}"
            )
        rss = usage.ru_maxrss * 1024 / MB  # ru_maxrss is in KiB on Linux
        return wall, rss, usage.ru_utime + usage.ru_stime, out.read().decode()


def worker_counts(text: str) -> list[int]:
    """ "1,2" -> [1, 2]: values of TENSOR_DEBUGGER_WORKERS (0: one per available CPU), for --workers."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or any(c < 0 for c in counts):
        raise argparse.ArgumentTypeError(f"expected numbers of workers such as 1,2 (0: every CPU), got {text!r}")
    return counts


def resolve(workers: int) -> int:
    """The threads a worker count gives (Settings.threads, without importing the library into this process)."""
    return workers or len(os.sched_getaffinity(0))


def zipped(folder: Path) -> Path:
    """`folder`'s files in a stored (uncompressed) zip beside it, under the folder's name."""
    target = folder.with_suffix(".zip")
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as archive:
        for path in sorted(folder.iterdir()):
            archive.write(path, f"{folder.name}/{path.name}")
    return target


def cold_inputs(
    given: list[Path], work: Path, env: dict[str, str], size_mb: int = 200, files: int = 32
) -> tuple[Path, Path]:
    """The two inputs of a cold `compare A B`: `given` (A and B), else first_answer.py's reference and candidate
    (`size_mb` MB of float32 in `files` .pth files each), written under `work` and zipped."""
    if given:
        a, b = (p.resolve() for p in given)
        return a, b
    folder = work / "dump"
    here = Path(__file__).resolve().parent
    python = here.parent / ".venv" / "bin" / "python"
    subprocess.run(
        [str(python), str(here / "first_answer.py"), "--write-runs", str(folder), str(size_mb), str(files)],
        env=env,
        check=True,
    )
    return zipped(folder / "reference"), zipped(folder / "candidate")
