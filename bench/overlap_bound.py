"""The most a first `compare A B` could gain from reading while it imports (issue 31's design: the reading side in
a child process started before the heavy imports), measured with today's code, not built.

    python bench/overlap_bound.py                  # first_answer.py's 2 x 200 MB zips, 5 rounds
    python bench/overlap_bound.py --rounds 8 A B   # given inputs
    python bench/overlap_bound.py --env TENSOR_DEBUGGER_BUFFERED_RUN_BYTES=0   # both ways with this setting

Each round, in turn (each way going first in alternate rounds), after `sync`:
- *as now*: `tensor-debugger compare A B --json` into a new data dir, one process;
- *halves*: the two sides of the design as processes of their own, started at one moment, the wall taken when the
  last ends. The parent's side (PARENT): the CLI's entry, `services` and `cli.compare` imported, a new data dir
  opened (its new database made) and closed. The child's side: the imports the reading side needs (CHILD_IMPORTS:
  numpy and the SQLAlchemy-free modules `tests/ingest/test_reading_side.py` lists), then, once they are done, the
  ingest and comparison: the same `compare A B --json` into its own new data dir in a process that imported every
  module before it was told to go (READING: the clock of that process starts at the go).
The halves leave out what the design adds (the pipe, the records sent over it, the staged arrays moved into place)
and keep what it would not do twice (the reading process opens its own new database and writes its rows, work the
parent does in the design): so their wall is the design's best case, give or take those, not a figure of it.
CPU seconds are the processes' own (user and system, from `wait4`); the reading process's counts from its go only.
Each answer's first divergence must be the same. Nothing asserts on timings. The package's bytecode is compiled
first (`harness.compile_package`): without it every import of the package compiles its source, more often in the
halves (three interpreters) than as now (one), as no installed copy does.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import child_env, cold_inputs, compile_package, machine_line

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / ".venv" / "bin" / "tensor-debugger"
PYTHON = ROOT / ".venv" / "bin" / "python"

PARENT = r"""
import sys
from pathlib import Path
import tensor_debugger.cli.main, tensor_debugger.services, tensor_debugger.cli.compare
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
open_services(Settings.from_environ(data_dir=Path(sys.argv[1])), writes=True).close()
"""

CHILD_IMPORTS = r"""
import numpy
for name in ("ingest.run_copy", "ingest.writer", "ingest.block_readers", "ingest.tensor_files", "ingest.fingerprints",
             "store.arrays", "store.chunk_reader", "compare.compute.chunk_loop", "engine.streaming", "engine.where"):
    __import__("tensor_debugger." + name)
"""

READING = r"""
import json, os, resource, sys
import numcodecs, tensor_debugger.cli.compare, tensor_debugger.cli.main, tensor_debugger.services
import tensor_debugger.compare.pipeline as pipeline
for name in pipeline.AFTER_INGEST:
    __import__(name)
before = resource.getrusage(resource.RUSAGE_SELF)
os.write(int(os.environ.pop("OVERLAP_READY_FD")), b"ready\n")
sys.stdin.readline()
from tensor_debugger.cli.main import main
code = main(sys.argv[1:])
after = resource.getrusage(resource.RUSAGE_SELF)
cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
print("CPU " + json.dumps([cpu, after.ru_utime + after.ru_stime]), file=sys.stderr)
sys.exit(code)
"""


def _cpu(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def _first(out: str) -> str:
    answer = json.loads(out)
    return str((answer.get("first_divergence") or {}).get("name"))


def as_now(a: Path, b: Path, data: Path, env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, CPU s, first divergence) of today's cold compare."""
    _children_usage_delta()
    start = time.perf_counter()
    out = subprocess.run(
        [str(CLI), "--data-dir", str(data), "compare", str(a), str(b), "--json"], env=env, stdout=subprocess.PIPE
    ).stdout
    wall = time.perf_counter() - start
    return wall, _cpu(_children_usage_delta()), _first(out.decode())


_LAST_CHILDREN = [resource.getrusage(resource.RUSAGE_CHILDREN)]


class _Delta:
    def __init__(self, utime: float, stime: float) -> None:
        self.ru_utime, self.ru_stime = utime, stime


def _children_usage_delta() -> resource.struct_rusage:
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    last = _LAST_CHILDREN[0]
    _LAST_CHILDREN[0] = now
    return _Delta(now.ru_utime - last.ru_utime, now.ru_stime - last.ru_stime)  # type: ignore[return-value]


def halves(a: Path, b: Path, work: Path, env: dict[str, str]) -> tuple[float, float, str, float]:
    """(wall s, CPU s of the three processes, first divergence, the reading process's CPU s from its go)."""
    ready_r, ready_w = os.pipe()
    reading = subprocess.Popen(
        [str(PYTHON), "-c", READING, "--data-dir", str(work / "reading"), "compare", str(a), str(b), "--json"],
        env={**env, "OVERLAP_READY_FD": str(ready_w)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(ready_w,),
    )
    os.close(ready_w)
    with os.fdopen(ready_r) as ready:
        if ready.readline().strip() != "ready":
            sys.exit(f"the reading process did not start: {reading.communicate()[1].decode()}")
    _children_usage_delta()
    start = time.perf_counter()
    parent = subprocess.Popen([str(PYTHON), "-c", PARENT, str(work / "parent")], env=env)
    imports = subprocess.Popen([str(PYTHON), "-c", CHILD_IMPORTS], env=env)
    imports.wait()
    assert reading.stdin is not None
    reading.stdin.write(b"go\n")
    reading.stdin.flush()
    out, err = reading.communicate()
    parent.wait()
    wall = time.perf_counter() - start
    line = next(line for line in err.decode().splitlines() if line.startswith("CPU "))
    from_go, whole = json.loads(line.removeprefix("CPU "))
    # the parent's side, the child's imports, and the reading process less what it spent before its go
    cpu = _cpu(_children_usage_delta()) - (whole - from_go)
    return wall, cpu, _first(out.decode()), from_go


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="*", type=Path, help="A B (default: first_answer.py's two zips, written)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--env", action="append", default=[], metavar="VAR=VALUE", help="set in both ways' environment (repeatable)"
    )
    args = parser.parse_args()
    env = child_env()
    for assignment in args.env:
        name, equals, value = assignment.partition("=")
        if not equals or not name:
            parser.error(f"--env: expected VAR=VALUE, got {assignment!r}")
        env[name] = value
    env["OPENBLAS_NUM_THREADS"] = "1"  # as the CLI sets before numpy is imported (cli/main.py)
    compile_package(PYTHON)
    work = Path(tempfile.mkdtemp(prefix="overlap-bound-"))
    try:
        a, b = cold_inputs(args.inputs, work, env)
        print(machine_line("today's code"))
        settings = f"; with {' '.join(args.env)}" if args.env else ""
        print(f"load {os.getloadavg()[0]:.1f} at the start; {args.rounds} rounds, in turn{settings}")
        walls: dict[str, list[float]] = {"as now": [], "halves": []}
        cpus: dict[str, list[float]] = {"as now": [], "halves": []}
        reading_cpu: list[float] = []
        answers: set[str] = set()
        for n in range(args.rounds):
            for way in ("as now", "halves") if n % 2 == 0 else ("halves", "as now"):
                round_dir = work / f"{n}-{way.replace(' ', '-')}"
                round_dir.mkdir()
                os.sync()
                if way == "as now":
                    wall, cpu, first = as_now(a, b, round_dir / "data", env)
                else:
                    wall, cpu, first, mine = halves(a, b, round_dir, env)
                    reading_cpu.append(mine)
                walls[way].append(wall)
                cpus[way].append(cpu)
                answers.add(first)
                shutil.rmtree(round_dir)
        if len(answers) != 1:
            sys.exit(f"the first divergence differs between rounds: {sorted(answers)}")
        print(f"load {os.getloadavg()[0]:.1f} at the end; first divergence {answers.pop()}")
        print(f"{'':10} {'wall s':>8} {'least':>7} {'CPU s':>7} {'least':>7}")
        for way in walls:
            print(
                f"{way:10} {statistics.median(walls[way]):8.2f} {min(walls[way]):7.2f} "
                f"{statistics.median(cpus[way]):7.2f} {min(cpus[way]):7.2f}"
            )
        for way in walls:
            print(
                f"{way} by round: wall {' '.join(f'{w:.2f}' for w in walls[way])}; "
                f"CPU {' '.join(f'{c:.2f}' for c in cpus[way])}"
            )
        print(f"the reading process from its go, CPU s by round: {' '.join(f'{c:.2f}' for c in reading_cpu)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
