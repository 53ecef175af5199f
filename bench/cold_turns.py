"""Cold `compare A B` only, in turns: this checkout against another and against settings, many rounds, quickly.

    python bench/cold_turns.py --rounds 8 --way direct:TENSOR_DEBUGGER_BUFFERED_RUN_BYTES=0 \
        --way base:PYTHONPATH=/elsewhere/server \
        --way base-direct:PYTHONPATH=/elsewhere/server,TENSOR_DEBUGGER_BUFFERED_RUN_BYTES=0

`first_answer.py` times the plain script and the warm path as well (a round takes a minute on a loaded machine);
this times only what a change to the cold compare moves, so that more rounds fit: `tensor-debugger compare A B
--json` into a new data dir, after `sync`, with this checkout's package ("this") and each `--way LABEL:VAR=VALUE[,...]`
(environment additions: `PYTHONPATH=DIR` runs another checkout's `server/` folder, its compiled libraries built,
its `migrations/` beside it; `TENSOR_DEBUGGER_*` a setting), taking turns at going first. Inputs: `first_answer.py`'s
two zips (written once into a temporary folder), or A B given. Each answer's first divergence must be the same.
Prints the median and least wall and CPU seconds (user and system, the child's) of each way, and every round's.
Nothing asserts on timings. The packages timed are compiled to bytecode first (`harness.compile_package`).
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

from first_answer import variant
from harness import child_env, cold_inputs, compile_package

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / ".venv" / "bin" / "tensor-debugger"
PYTHON = ROOT / ".venv" / "bin" / "python"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="*", type=Path, help="A B (default: first_answer.py's two zips, written)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--way", type=variant, action="append", default=[], help="LABEL:VAR=VALUE[,VAR=VALUE...]")
    args = parser.parse_args()
    if len(args.inputs) not in (0, 2):
        parser.error("give two inputs, or none")
    work = Path(tempfile.mkdtemp(prefix="cold-turns-"))
    env = child_env()
    try:
        a, b = cold_inputs(args.inputs, work, env)
        ways: list[tuple[str, dict[str, str]]] = [("this", {})]
        ways += [(label, dict(pair.split("=", 1) for pair in pairs)) for label, pairs in args.way]
        compile_package(PYTHON, *(extra["PYTHONPATH"] for _, extra in ways if "PYTHONPATH" in extra))
        walls: dict[str, list[float]] = {label: [] for label, _ in ways}
        cpus: dict[str, list[float]] = {label: [] for label, _ in ways}
        found: set[str] = set()
        print(f"load {os.getloadavg()[0]:.1f} at the start; {args.rounds} rounds, in turn")
        for round_index in range(args.rounds):
            turn = round_index % len(ways)
            for label, extra in ways[turn:] + ways[:turn]:
                data = work / f"data-{label}"
                shutil.rmtree(data, ignore_errors=True)
                os.sync()
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                start = time.perf_counter()
                done = subprocess.run(
                    [str(CLI), "--data-dir", str(data), "compare", str(a), str(b), "--json"],
                    env={**env, **extra},
                    capture_output=True,
                    text=True,
                )
                wall = time.perf_counter() - start
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                try:
                    answer = json.loads(done.stdout)
                except ValueError:
                    sys.exit(f"{label} printed no JSON: {done.stdout[:2000]} {done.stderr[-2000:]}")
                found.add(json.dumps(answer["first_divergence"], sort_keys=True))
                if len(found) != 1:
                    sys.exit(f"{label} found another first divergence: {answer['first_divergence']}")
                walls[label].append(wall)
                cpus[label].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
                shutil.rmtree(data, ignore_errors=True)
        print(f"load {os.getloadavg()[0]:.1f} at the end")
        print(f"{'':14} {'wall s':>7} {'least':>7} {'CPU s':>7} {'least':>7}")
        for label, _ in ways:
            w, c = walls[label], cpus[label]
            print(f"{label:14} {statistics.median(w):7.2f} {min(w):7.2f} {statistics.median(c):7.2f} {min(c):7.2f}")
        for label, _ in ways:
            print(
                f"{label} by round: wall "
                + " ".join(f"{x:.2f}" for x in walls[label])
                + "; CPU "
                + " ".join(f"{x:.2f}" for x in cpus[label])
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
