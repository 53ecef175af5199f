"""Where a first `compare A B`'s reading side spends its CPU, from its go: by thread and by what the CPU ran.

    python bench/reading_split.py                  # first_answer.py's 2 x 200 MB zips, 3 rounds
    python bench/reading_split.py --rounds 5 A B   # given inputs
    python bench/reading_split.py --env TENSOR_DEBUGGER_BUFFERED_RUN_BYTES=0   # with this setting too, in turn
    python bench/reading_split.py --whole          # the whole process: the start-up's imports counted too

Each round runs `tensor-debugger compare A B --json` into a new data dir (after `sync`) under `perf record -g` (the
kernel's samples of CPU time, every thread), in a process that imported every module the compare imports before
its go (PROBE, as `cold_split.py --imports-first` and `overlap_bound.py`'s reading process do), so that what is
counted is the reading side's work: both runs ingested (inputs read, blocks hashed, chunk files written, rows),
the pairs' statistics in lockstep, the plan and the answer. Samples before the go are dropped. Each sample is
counted to its thread (the Python thread's name, numbers stripped; threads Python did not start, such as BLAKE3's,
as "native") and to what it ran (CATEGORIES: the kernel by the path the sample's stack went through, else the first
library in the stack that is not the interpreter, else the interpreter: Python code, the pickle parse, the ORM).
With `--whole`, nothing is imported first and every sample from the interpreter's start is counted (the
start-up's imports on MainThread, as a user's first compare spends them), and the interpreter's own C parts that
show there (compiling source: dataclasses' generated methods; loading bytecode; the cyclic GC) are named apart.
The interpreter's share is not split by Python function here: `py-spy record --gil` does that (see RESULTS.md).
With `--env`, each round also runs the same compare with those settings, the two in turn. Needs `perf` (Linux);
CPU seconds are samples over the sampling frequency. Medians are printed; nothing asserts on timings. The package
is compiled to bytecode first (`harness.compile_package`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from harness import child_env, cold_inputs, compile_package, machine_line

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"

PROBE = r"""
import json, os, sys, threading, time
import numcodecs, tensor_debugger.cli.compare, tensor_debugger.cli.main, tensor_debugger.services
import tensor_debugger.compare.pipeline as imported
for name in imported.AFTER_INGEST:
    __import__(name)
from tensor_debugger.cli.main import main
names = {threading.get_native_id(): "MainThread"}
_run = threading.Thread.run
def run(self):
    names[threading.get_native_id()] = self.name
    return _run(self)
threading.Thread.run = run
go, cpu = time.clock_gettime(time.CLOCK_MONOTONIC), time.process_time()
try:
    code = main(sys.argv[2:])
finally:
    with open(sys.argv[1], "w") as f:
        json.dump({"go": go, "cpu": time.process_time() - cpu, "names": names}, f)
sys.exit(code)
"""

# `--whole`: nothing imported before the compare, every sample from the interpreter's start counted (go 0) and the
# process's CPU from its start: the start-up's imports as a user's first compare spends them, beside the rest.
WHOLE_PROBE = r"""
import json, sys, threading, time
names = {threading.get_native_id(): "MainThread"}
_run = threading.Thread.run
def run(self):
    names[threading.get_native_id()] = self.name
    return _run(self)
threading.Thread.run = run
try:
    from tensor_debugger.cli.main import main
    code = main(sys.argv[2:])
finally:
    with open(sys.argv[1], "w") as f:
        json.dump({"go": 0.0, "cpu": time.process_time(), "names": names}, f)
sys.exit(code)
"""

# (label, kernel symbols any of which in a kernel sample's stack puts it there), first match wins
KERNEL_PATHS = (
    ("kernel: chunk files written into the page cache", ("generic_perform_write", "copy_folio_from_iter")),
    ("kernel: chunk files written direct", ("iomap_dio_rw", "__iomap_dio_rw")),
    ("kernel: files created (ext4 inodes)", ("ext4_create", "__ext4_new_inode")),
    ("kernel: inputs read (copied from the page cache)", ("filemap_read", "_copy_to_iter")),
    ("kernel: files and folders deleted", ("do_unlinkat", "do_rmdir", "evict")),
    ("kernel: fsync", ("fsync", "fdatasync")),
    ("kernel: page faults", ("asm_exc_page_fault",)),
    ("kernel: scheduling, futexes", ("futex", "schedule", "sched_yield")),
)
# (label, a part of the library's file name), for user-space samples: the first in the stack (leaf first) wins
LIBRARIES = (
    ("BLAKE3", "blake3"),
    ("statistics kernel (_fused_stats)", "_fused_stats"),
    ("chunk loop (_chunk_loop)", "_chunk_loop"),
    ("Blosc (compression sample)", "blosc"),
    ("SQLite", "sqlite"),
    ("numpy", "_multiarray"),
    ("numpy", "numpy"),
)
# (label, interpreter symbols any of which in a sample's stack puts an interpreter sample there), first match wins:
# the parts of the interpreter's own C that `--whole` shows in the start-up (Python frames are not named in 3.11)
INTERPRETER_PARTS = (
    ("interpreter: compiling source (exec: dataclasses' methods)", ("_PyPegen_", "_PyAST_Compile", "compiler_")),
    ("interpreter: loading bytecode (.pyc unmarshal)", ("r_object", "PyMarshal_")),
    ("interpreter: cyclic GC", ("gc_collect_main",)),
)


def category(frames: list[tuple[str, str]]) -> str:
    """What a sample (its stack, leaf first, as (library, symbol)) ran."""
    if frames and "kernel" in frames[0][0]:
        symbols = " ".join(symbol for _, symbol in frames)
        for label, marks in KERNEL_PATHS:
            if any(mark in symbols for mark in marks):
                return label
        return "kernel: other"
    for library, _ in frames:
        for label, part in LIBRARIES:
            if part in library:
                return label
    leaf = frames[0][0] if frames else ""
    if "libc" in leaf:
        return "libc (memcpy, malloc)"
    if "python" in leaf:
        symbols = " ".join(symbol for _, symbol in frames)
        for label, marks in INTERPRETER_PARTS:
            if any(mark in symbols for mark in marks):
                return label
        return "interpreter (Python code, pickle parse, ORM)"
    return "other"


def samples(data: Path, go: float, names: dict[int, str]) -> tuple[Counter[str], Counter[str]]:
    """Samples after `go`, by thread group and by category."""
    script = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "tid,time,ip,sym,dso"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    threads: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    head: tuple[int, float] | None = None
    frames: list[tuple[str, str]] = []

    def flush() -> None:
        if head is None or head[1] < go or not frames:
            return
        group = re.sub(r"[_-]?\d+$", "", names.get(head[0], "native")) or "native"
        threads[group] += 1
        kinds[category(frames)] += 1

    for line in script.splitlines():
        if not line.strip():
            flush()
            head, frames = None, []
        elif not line.startswith("\t"):  # a sample's head: its thread id, right-aligned (a small one has spaces first)
            match = re.match(r"\s*(\d+)\s+([\d.]+):", line)
            head = (int(match.group(1)), float(match.group(2))) if match else None
            frames = []
        else:
            found = re.match(r"\s*\S+\s+(.*) \((.*)\)$", line)
            if found:
                frames.append((found.group(2), found.group(1)))
    flush()
    return threads, kinds


def one(
    a: Path, b: Path, env: dict[str, str], work: Path, frequency: int, whole: bool = False
) -> tuple[float, Counter[str], Counter[str]]:
    """One compare under perf: (process CPU s from the go, samples by thread, samples by category). `whole`: nothing
    imported first, every sample and the process's CPU from its start."""
    data_dir, probe, data = work / "data", work / "probe.json", work / "perf.data"
    shutil.rmtree(data_dir, ignore_errors=True)
    os.sync()
    probe_code = WHOLE_PROBE if whole else PROBE
    command = [
        "perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-F", str(frequency), "-g", "-o", str(data), "--",
        str(PYTHON), "-c", probe_code, str(probe), "--data-dir", str(data_dir), "compare", str(a), str(b), "--json",
    ]  # fmt: skip
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode not in (0, 1):  # 1: a pair failed (the inputs' candidate differs)
        sys.exit(f"failed (exit {done.returncode}): {' '.join(command)}\n{done.stderr}")
    marks = json.loads(probe.read_text())
    threads, kinds = samples(data, marks["go"], {int(k): v for k, v in marks["names"].items()})
    return float(marks["cpu"]), threads, kinds


def report(title: str, runs: list[Counter[str]], frequency: int) -> None:
    """Each key's CPU seconds and share of the samples (medians over the rounds), largest first."""
    keys = sorted({k for run in runs for k in run}, key=lambda k: -sum(run[k] for run in runs))
    print(f"  by {title:<56} CPU s (median)  share")
    for key in keys:
        seconds = statistics.median(run[key] / frequency for run in runs)
        share = statistics.median(run[key] / max(1, sum(run.values())) for run in runs)
        print(f"  {key:<59} {seconds:12.3f}  {share:5.1%}")
    print(f"  {'all samples':<59} {statistics.median(sum(run.values()) / frequency for run in runs):12.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="*", type=Path, help="A B (default: first_answer.py's two zips, written)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--frequency", type=int, default=999, help="perf's samples per second of CPU")
    parser.add_argument("--env", action="append", default=[], metavar="VAR=VALUE", help="also run with these set")
    parser.add_argument(
        "--whole", action="store_true", help="the whole process: its start-up's imports counted too, from its start"
    )
    args = parser.parse_args()
    if shutil.which("perf") is None:
        sys.exit("reading_split.py needs `perf` (linux-tools) on PATH")
    if len(args.inputs) not in (0, 2):
        parser.error("give both inputs, A and B, or none")
    env = child_env()
    ways = {"as now": env}
    if args.env:
        settings = {var: value for var, _, value in (assignment.partition("=") for assignment in args.env)}
        ways[" ".join(args.env)] = {**env, **settings}
    compile_package(PYTHON)
    work = Path(tempfile.mkdtemp(prefix="reading-split-"))
    try:
        a, b = cold_inputs(args.inputs, work, env)
        print(machine_line("perf record -g, every thread"))
        with open("/proc/loadavg", encoding="utf-8") as f:
            print(f"inputs {a} and {b}; {args.rounds} rounds; load {f.read().split()[0]} at the start")
        cpu: dict[str, list[float]] = {name: [] for name in ways}
        split: dict[str, dict[str, list[Counter[str]]]] = {name: {"thread": [], "what it ran": []} for name in ways}
        for round_index in range(args.rounds):
            order = list(ways) if round_index % 2 == 0 else list(reversed(ways))
            for name in order:
                seconds, threads, kinds = one(a, b, ways[name], work, args.frequency, args.whole)
                cpu[name].append(seconds)
                split[name]["thread"].append(threads)
                split[name]["what it ran"].append(kinds)
        for name in ways:
            since = "its start" if args.whole else "the go"
            print(f"\n{name}: process CPU s from {since}, by round: {' '.join(f'{c:.2f}' for c in cpu[name])}")
            for title, runs in split[name].items():
                report(title, runs, args.frequency)
            sampled = [sum(run.values()) / args.frequency for run in split[name]["thread"]]
            if any(s < 0.9 * c for s, c in zip(sampled, cpu[name], strict=True)):  # perf lost a thread's samples
                print(f"  note: samples of {' '.join(f'{s:.2f}' for s in sampled)} CPU s: short of a round's CPU")
        with open("/proc/loadavg", encoding="utf-8") as f:
            print(f"\nload {f.read().split()[0]} at the end")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
