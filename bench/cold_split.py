"""Where a first (cold) `compare` goes: its process tree, its phases, its threads and its start-up's imports.

    python bench/cold_split.py                  # 2 x 200 MB of float32 .pth in zips (first_answer.py's), 5 rounds
    python bench/cold_split.py --rounds 3 A B   # given inputs

Each round runs `tensor-debugger compare A B --json` into a new data dir (after `sync`), in a child process whose
`main` is called by a probe (PROBE, run with `python -c`) that notes, without changing what the command does:
- wall and process CPU seconds (all its threads) when the first input is opened (an audit hook on `open`), when
  the runs' ingest is over (`pipeline._ingest_at_once` returning) and at the end;
- the processes it starts (audit events of fork, exec, spawn and subprocess): none is expected;
- each thread's CPU time and its time waiting for a CPU (the run queue: other processes' load, not this
  command's), from /proc/self/task/<tid>/schedstat sampled every 10 ms, grouped by the Python thread's name
  (threads Python did not start, such as BLAKE3's, as "native");
and the process tree's user and system seconds (`wait4`). The probe's own sampling thread ("probe") takes about 0.15
CPU s of the process's figures. Then, in a fresh process each time, the process CPU of
the start-up's imports, step by step (IMPORTS). With `--imports-first`, each round also runs the same compare with
every module it imports imported before the probe's clock starts, the two in turn: the difference in the marks is
what the start-up's imports cost the answer, the most that overlapping them with the reading could save. Medians are
printed; nothing asserts on timings. The package is compiled to bytecode first (`harness.compile_package`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness import child_env, cold_inputs, compile_package, machine_line

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"

PROBE = r"""
import json, os, sys, threading, time
from collections import defaultdict
T0, C0 = time.perf_counter(), time.process_time()
marks, spawned, inputs = [], [], {os.path.abspath(p) for p in sys.argv[-3:-1]}
def mark(name):
    marks.append((name, time.perf_counter() - T0, time.process_time() - C0))
def hook(event, args):
    if event == "open" and args and isinstance(args[0], str) and not any(m[0] == "first input opened" for m in marks):
        if os.path.abspath(args[0]) in inputs:
            mark("first input opened")
    elif event in ("os.fork", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen"):
        spawned.append(event)
if os.environ.get("COLD_SPLIT_IMPORTS_FIRST"):  # every module the compare imports, before the clock starts
    import numcodecs, tensor_debugger.cli.compare, tensor_debugger.cli.main, tensor_debugger.services
    import tensor_debugger.compare.pipeline as imported
    for name in imported.AFTER_INGEST:
        __import__(name)
    T0, C0 = time.perf_counter(), time.process_time()
sys.addaudithook(hook)
seen, stop = {}, threading.Event()
def sample():
    while not stop.is_set():
        names = {t.native_id: t.name for t in threading.enumerate()}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    run, wait = (int(x) for x in f.read().split()[:2])
            except OSError:
                continue
            name = names.get(int(tid)) or seen.get(tid, ("native",))[0]
            seen[tid] = (name, run, wait)
        stop.wait(0.01)
sampler = threading.Thread(target=sample, name="probe", daemon=True)
sampler.start()
import tensor_debugger.compare.pipeline as pipeline
ingest = pipeline._ingest_at_once
def timed(*args, **kwargs):
    try:
        return ingest(*args, **kwargs)
    finally:
        mark("runs ingested")
pipeline._ingest_at_once = timed
from tensor_debugger.cli.main import main
try:
    code = main(sys.argv[1:])
finally:
    mark("end")
    stop.set()
    sampler.join()
    threads = defaultdict(lambda: [0, 0.0, 0.0])
    for tid, (name, run, wait) in seen.items():
        group = name.rstrip("0123456789").rstrip("_-") or name
        threads[group][0] += 1
        threads[group][1] += run / 1e9
        threads[group][2] += wait / 1e9
    sys.stdout.flush()
    print("PROBE " + json.dumps({"marks": marks, "spawned": spawned, "threads": threads}), file=sys.stderr)
sys.exit(code)
"""

IMPORTS = r"""
import json, time
steps, last = [], time.process_time()
def step(name):
    global last
    now = time.process_time()
    steps.append((name, now - last))
    last = now
import tensor_debugger.cli.main
step("the CLI's entry (argparse, settings)")
import sqlalchemy
step("SQLAlchemy's core")
import sqlalchemy.orm
step("SQLAlchemy's ORM")
import numpy
step("numpy")
import tensor_debugger.store.models
step("the models (declarative classes)")
import tensor_debugger.services
step("the rest of services (ingest, store, comparison machinery)")
import tensor_debugger.cli.compare
step("cli.compare")
print(json.dumps(steps))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="*", type=Path, help="A B (default: first_answer.py's two zips, written)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size-mb", type=int, default=200, help="MB of float32 per run, when writing them")
    parser.add_argument("--files", type=int, default=32, help=".pth files per run, when writing them")
    parser.add_argument(
        "--imports-first",
        action="store_true",
        help="also, in turn, the same compare with every module it imports imported before the clock starts",
    )
    args = parser.parse_args()
    if len(args.inputs) not in (0, 2):
        parser.error("give two inputs, or none")
    work = Path(tempfile.mkdtemp(prefix="cold-split-"))
    env = child_env()
    compile_package(PYTHON)
    env["OPENBLAS_NUM_THREADS"] = env.get("OPENBLAS_NUM_THREADS", "1")  # as the CLI asks before numpy's import
    try:
        a, b = cold_inputs(args.inputs, work, env, args.size_mb, args.files)
        print(machine_line(f"{os.cpu_count()} CPUs seen"))
        print(f"inputs {a} and {b}; {args.rounds} rounds; load {os.getloadavg()[0]:.1f} at the start")
        rounds: list[Round] = []
        first: list[Round] = []  # --imports-first: each round's second compare, the two taking turns
        for n in range(args.rounds):
            ways = [(rounds, False), (first, True)] if args.imports_first else [(rounds, False)]
            for found, imported in ways if n % 2 == 0 else ways[::-1]:
                found.append(cold_round(work / f"data-{n}", a, b, env, imported))
        imports = [import_steps(env) for _ in range(args.rounds)]
        report(rounds, imports)
        if first:
            report_imports_first(rounds, first)
        print(f"load {os.getloadavg()[0]:.1f} at the end")
    finally:
        shutil.rmtree(work, ignore_errors=True)


@dataclass(frozen=True)
class Round:
    marks: list[tuple[str, float, float]]  # (what, wall s, process CPU s) from the start
    spawned: int  # processes the command started
    threads: dict[str, tuple[int, float, float]]  # name -> (threads, CPU s, s waiting for a CPU)
    wall: float
    user: float  # of the process tree
    system: float


def cold_round(data: Path, a: Path, b: Path, env: dict[str, str], imports_first: bool = False) -> Round:
    """One cold compare under the probe: its marks, threads and processes, and the tree's user and system time.
    `imports_first`: every module the compare imports is imported before the probe's clock starts (its marks count
    from then; the process tree's figures still include the imports)."""
    if imports_first:
        env = {**env, "COLD_SPLIT_IMPORTS_FIRST": "1"}
    os.sync()
    command = [str(PYTHON), "-c", PROBE, "--data-dir", str(data), "compare", str(a), str(b), "--json"]
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        err.seek(0)
        said = err.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(status)
    probe = next((line for line in said.splitlines() if line.startswith("PROBE ")), None)
    if code not in (0, 1) or probe is None:
        sys.exit(f"the compare failed (exit {code}): {said[-3000:]}")
    shutil.rmtree(data, ignore_errors=True)
    found = json.loads(probe.removeprefix("PROBE "))
    return Round(
        [(str(name), float(w), float(c)) for name, w, c in found["marks"]],
        len(found["spawned"]),
        {str(name): (int(n), float(run), float(waited)) for name, (n, run, waited) in found["threads"].items()},
        wall,
        usage.ru_utime,
        usage.ru_stime,
    )


def import_steps(env: dict[str, str]) -> list[tuple[str, float]]:
    done = subprocess.run([str(PYTHON), "-c", IMPORTS], env=env, capture_output=True, text=True, check=True)
    steps: list[tuple[str, float]] = [(name, float(s)) for name, s in json.loads(done.stdout)]
    return steps


def report(rounds: list[Round], imports: list[list[tuple[str, float]]]) -> None:
    def median(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    marks: dict[str, list[tuple[float, float]]] = {}
    for found in rounds:
        for name, at, cpu in found.marks:
            marks.setdefault(name, []).append((at, cpu))
    print(f"{'cold compare (medians)':34} {'wall s':>7} {'process CPU s':>14}")
    for name, values in marks.items():
        print(f"{name:34} {median([w for w, _ in values]):7.3f} {median([c for _, c in values]):14.3f}")
    user = median([f.user for f in rounds])
    system = median([f.system for f in rounds])
    wall = median([f.wall for f in rounds])
    print(f"{'the process tree (wait4)':34} {wall:7.3f} {user + system:14.3f}  (user {user:.3f}, system {system:.3f})")
    print(f"processes started by the command: {max(f.spawned for f in rounds)} (of any round)")
    groups: dict[str, list[tuple[int, float, float]]] = {}
    for found in rounds:
        for name, figures in found.threads.items():
            groups.setdefault(name, []).append(figures)
    print(f"{'threads, by name (medians)':34} {'count':>6} {'CPU s':>7} {'waiting for a CPU s':>20}")
    for name, each in sorted(groups.items(), key=lambda kv: -median([r for _, r, _ in kv[1]])):
        print(
            f"{name:34} {max(n for n, _, _ in each):6d} {median([r for _, r, _ in each]):7.3f} "
            f"{median([w for _, _, w in each]):20.3f}"
        )
    print(f"{'start-up imports, one step each (medians)':60} {'process CPU s':>14}")
    for index, (name, _) in enumerate(imports[0]):
        print(f"{name:60} {median([steps[index][1] for steps in imports]):14.3f}")
    print(f"{'all of them':60} {median([sum(s for _, s in steps) for steps in imports]):14.3f}")


def report_imports_first(rounds: list[Round], first: list[Round]) -> None:
    """The marks of the compare as it runs beside those of the same compare with its imports done before the clock:
    what the start-up's imports cost this compare's answer, the most that overlapping them with the reading could
    save."""
    print("the same compare with every module it imports imported before the clock (in turn with the above)")
    print(
        f"{'medians (min), from the clock':34} {'as it runs: wall s':>20} {'CPU s':>14} "
        f"{'imports first: wall s':>22} {'CPU s':>14}"
    )
    for name in ("first input opened", "runs ingested", "end"):
        cells = []
        for found in (rounds, first):
            values = [(w, c) for each in found for mark, w, c in each.marks if mark == name]
            walls, cpus = [w for w, _ in values], [c for _, c in values]
            cells += [
                f"{statistics.median(walls):.3f} ({min(walls):.3f})",
                f"{statistics.median(cpus):.3f} ({min(cpus):.3f})",
            ]
        print(f"{name:34} {cells[0]:>20} {cells[1]:>14} {cells[2]:>22} {cells[3]:>14}")
    for label, found in (("as it runs", rounds), ("imports first", first)):
        ends = [f"{w:.2f}/{c:.2f}" for each in found for mark, w, c in each.marks if mark == "end"]
        print(f"{label}, end by round (wall/CPU s): {' '.join(ends)}")


if __name__ == "__main__":
    main()
