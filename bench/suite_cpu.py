"""Where a pytest run's CPU goes, by process kind: the run in a cgroup v1 cpuacct group of its own (the exact total,
every descendant counted, those nobody waits for included), its processes sampled from /proc every 50 ms (each
process's user + system time at its last sample, its command line read when first seen) and summed by kind.

    .venv/bin/python bench/suite_cpu.py [--label NAME] [pytest arguments]    e.g. -n 2 --dist worksteal tests/cli

Needs root and /sys/fs/cgroup/cpuacct (as on the project's VM); the group is removed afterwards. Prints the wall
time, the group's CPU, the load average before and after, pytest's last line and a table: kind, starts (processes
seen), CPU s. A process's CPU after its last sample (under 50 ms of life) is not seen: "not sampled" is the
group's total less the sum of the kinds. The sampler runs outside the group (its own CPU is not counted)."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def kind(argv: list[str]) -> str:
    """The process kind of a command line."""
    if not argv:
        return "?"
    exe = os.path.basename(argv[0])
    joined = " ".join(argv)
    if "chromium" in exe or "chrome" in exe:
        # Chromium's children rewrite their command line as one string, words joined by spaces
        for arg in joined.split():
            if arg.startswith("--type="):
                return f"chromium {arg[7:]}"
        return "chromium browser"
    if exe == "node" or "playwright" in joined and "driver" in joined:
        return "playwright driver"
    if exe.startswith("python") or exe == "coverage":
        if "-m" in argv:
            module = argv[argv.index("-m") + 1] if argv.index("-m") + 1 < len(argv) else "?"
            if module == "tensor_debugger":
                rest = [a for a in argv[argv.index("-m") + 2 :] if not a.startswith("-")]
                # skip option values (--data-dir X): the first word that is a known command
                commands = {
                    "serve", "compare", "ingest", "sessions", "explore", "where", "compare-sessions", "answers",
                    "candidates", "coverage", "export", "pairing", "init", "reset", "status", "upload",
                }  # fmt: skip
                for word in rest:
                    if word in commands:
                        return "server (serve)" if word == "serve" else f"cli {word}"
                return "cli (other)"
            if module == "pytest":
                return "pytest controller"
            return f"python -m {module}"
        if "-c" in argv:
            code = argv[argv.index("-c") + 1] if argv.index("-c") + 1 < len(argv) else ""
            if "exec(eval(sys.stdin.readline()))" in code or "execnet" in code:
                return "pytest worker"
            if "multiprocessing" in code:
                return "python multiprocessing child"
            return "python -c"
        for arg in argv[1:]:
            if not arg.startswith("-"):
                base = os.path.basename(arg)
                if base in {"tensor-debugger", "tensor_debugger"}:
                    return "cli (script)"
                if base in {"dask-scheduler", "dask-worker", "dask"}:
                    return "dask"
                return f"python {base}"
        return "python"
    if exe in {"postgres", "initdb", "pg_ctl", "psql", "createdb", "runuser"} or exe.startswith("postgres:"):
        return "postgresql"
    if exe == "weed":
        return "seaweedfs"
    if exe in {"dask-scheduler", "dask-worker", "dask"}:
        return "dask"
    return exe


def cpu_of(pid: str) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def argv_of(pid: str) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", default="")
    parser.add_argument("--interval", type=float, default=0.05)
    args, pytest_args = parser.parse_known_args()
    group = CPUACCT / f"tensor-debugger-suite-cpu-{os.getpid()}"
    group.mkdir()
    try:
        load_before = Path("/proc/loadavg").read_text().split()[0]
        start = time.monotonic()
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
        child = subprocess.Popen(
            ["bash", "-c", f'echo $$ > {group}/cgroup.procs; exec "$@"', "bash", *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert child.stdout is not None
        os.set_blocking(child.stdout.fileno(), False)
        output = bytearray()
        seen: dict[str, tuple[str, float]] = {}  # pid -> (kind, CPU at its last sample)
        procs = group / "cgroup.procs"
        while child.poll() is None:
            with contextlib.suppress(BlockingIOError):
                output += child.stdout.read() or b""
            for pid in procs.read_text().split():
                cpu = cpu_of(pid)
                if cpu is None:
                    continue
                # a pid's kind is read at each sample: it is what the process last exec'd (a shell's `exec`,
                # Chromium's wrapper; a child seen between its fork and its exec has its parent's command line)
                argv = argv_of(pid)
                seen[pid] = (kind(argv) if argv else seen.get(pid, ("?", 0.0))[0], cpu)
            time.sleep(args.interval)
        output += child.stdout.read() or b""
        wall = time.monotonic() - start
        total = int((group / "cpuacct.usage").read_text()) / 1e9
        load_after = Path("/proc/loadavg").read_text().split()[0]
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    by_kind: defaultdict[str, list[float]] = defaultdict(list)
    for k, cpu in seen.values():
        by_kind[k].append(cpu)
    lines = output.decode(errors="replace").splitlines()
    last = next((line for line in reversed(lines) if "passed" in line or "failed" in line or "error" in line), "")
    print(f"{args.label}: wall {wall:.1f} s, CPU of the process tree {total:.1f} s, load {load_before} -> {load_after}")
    print(last)
    print("| kind | starts | CPU s |")
    print("| --- | --- | --- |")
    sampled = 0.0
    for k, cpus in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        sampled += sum(cpus)
        print(f"| {k} | {len(cpus)} | {sum(cpus):.1f} |")
    print(f"| not sampled | | {total - sampled:.1f} |")
    durations = [
        line for line in lines if line[:1].isdigit() and ("s call" in line or "s setup" in line or "s teardown" in line)
    ]
    if durations:
        print("\n".join(durations))
    if child.returncode not in (0,):
        print("\n".join(lines[-60:]))
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
