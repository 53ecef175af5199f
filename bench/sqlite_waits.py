"""How long a cold `compare A B`'s threads sleep in SQLite's busy handler, this checkout against other ways, in turn.

    python bench/sqlite_waits.py --rounds 5 --way base:PYTHONPATH=/elsewhere/server [A B]

SQLite's busy handler (a connection that finds the write lock taken) sleeps 1, 2, 5, 10, 15, 20, 25, 25, ... ms
and looks again; it is not woken by the lock's release. Each round runs `tensor-debugger compare A B --json` into a
new data dir under `strace -f -T -e clock_nanosleep,nanosleep` and counts the relative CLOCK_REALTIME sleeps (what
SQLite's `usleep` makes) by Python thread, and the milliseconds they asked for: a count, not a timing, so it means
the same on a loaded machine. Python's own `time.sleep`s (CLOCK_MONOTONIC, to a deadline) are listed by thread
too, with the milliseconds they took ("time.sleep MainThread": `cli/answers.py` waiting for the file clock). Inputs:
`first_answer.py`'s two zips (written once), or A B given. Each answer's first divergence must be the same. Needs
`strace` (Linux). Nothing asserts.
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

from first_answer import variant
from harness import child_env, cold_inputs, compile_package

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / ".venv" / "bin" / "tensor-debugger"
PYTHON = ROOT / ".venv" / "bin" / "python"

# names each Python thread by its native id, written at exit (a sitecustomize on PYTHONPATH, before the way's own)
NAMES = """
import atexit, json, os, threading
_names = {threading.get_native_id(): "MainThread"}
_run = threading.Thread.run
def _named(self):
    _names[threading.get_native_id()] = self.name
    return _run(self)
threading.Thread.run = _named
atexit.register(lambda: json.dump(_names, open(os.environ["SQLITE_WAITS_NAMES"], "w")))
"""
SLEEP = re.compile(r"^(\d+) +(?:clock_nanosleep\(CLOCK_REALTIME, 0, |nanosleep\()\{tv_sec=(\d+), tv_nsec=(\d+)\}")
PYTHON_SLEEP = re.compile(r"^(\d+) +clock_nanosleep\(CLOCK_MONOTONIC, TIMER_ABSTIME, .* <(\d+\.\d+)>$")


def sleeps(trace: Path, names: dict[int, str]) -> Counter[str]:
    """Whole milliseconds of relative CLOCK_REALTIME sleep asked for (SQLite asks whole ones), by thread (numbers
    stripped), and the count under the key "<thread> sleeps"."""
    asked: Counter[str] = Counter()
    for line in trace.read_text().splitlines():
        python = PYTHON_SLEEP.match(line)
        if python is not None:  # time.sleep: its time spent (its deadline is absolute)
            thread = re.sub(r"_?\d+$", "", names.get(int(python.group(1)), "native"))
            asked[f"time.sleep {thread}"] += round(float(python.group(2)) * 1000)
            asked[f"time.sleep {thread} sleeps"] += 1
            continue
        found = SLEEP.match(line)
        if found is None:
            continue
        thread = re.sub(r"_?\d+$", "", names.get(int(found.group(1)), "native"))
        asked[thread] += int(found.group(2)) * 1000 + int(found.group(3)) // 1_000_000
        asked[f"{thread} sleeps"] += 1
    return asked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="*", type=Path, help="A B (default: first_answer.py's two zips, written)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--way", type=variant, action="append", default=[], help="LABEL:VAR=VALUE[,VAR=VALUE...]")
    args = parser.parse_args()
    if len(args.inputs) not in (0, 2):
        parser.error("give two inputs, or none")
    if shutil.which("strace") is None:
        sys.exit("needs strace")
    work = Path(tempfile.mkdtemp(prefix="sqlite-waits-"))
    env = child_env()
    try:
        a, b = cold_inputs(args.inputs, work, env)
        site = work / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(NAMES)
        ways: list[tuple[str, dict[str, str]]] = [("this", {})]
        ways += [(label, dict(pair.split("=", 1) for pair in pairs)) for label, pairs in args.way]
        compile_package(PYTHON, *(extra["PYTHONPATH"] for _, extra in ways if "PYTHONPATH" in extra))
        asked: dict[str, list[Counter[str]]] = {label: [] for label, _ in ways}
        found: set[str] = set()
        print(f"load {os.getloadavg()[0]:.1f} at the start; {args.rounds} rounds, in turn")
        for round_index in range(args.rounds):
            turn = round_index % len(ways)
            for label, extra in ways[turn:] + ways[:turn]:
                data, trace, names = work / f"data-{label}", work / "trace", work / "names.json"
                shutil.rmtree(data, ignore_errors=True)
                path = os.pathsep.join(p for p in (str(site), extra.get("PYTHONPATH", "")) if p)
                done = subprocess.run(
                    ["strace", "-f", "-T", "-e", "trace=clock_nanosleep,nanosleep", "-o", str(trace)]
                    + [str(CLI), "--data-dir", str(data), "compare", str(a), str(b), "--json"],
                    env={**env, **extra, "PYTHONPATH": path, "SQLITE_WAITS_NAMES": str(names)},
                    capture_output=True,
                    text=True,
                )
                try:
                    answer = json.loads(done.stdout)
                except ValueError:
                    sys.exit(f"{label} printed no JSON: {done.stdout[:2000]} {done.stderr[-2000:]}")
                found.add(json.dumps(answer["first_divergence"], sort_keys=True))
                if len(found) != 1:
                    sys.exit(f"{label} found another first divergence: {answer['first_divergence']}")
                named = {int(k): v for k, v in json.loads(names.read_text()).items()}
                asked[label].append(sleeps(trace, named))
                shutil.rmtree(data, ignore_errors=True)
        print(f"load {os.getloadavg()[0]:.1f} at the end")
        for label, _ in ways:
            rounds = asked[label]
            busy = [k for c in rounds for k in c if not k.startswith("time.sleep")]
            ms = [sum(v for k, v in c.items() if k in busy and not k.endswith(" sleeps")) for c in rounds]
            count = [sum(v for k, v in c.items() if k in busy and k.endswith(" sleeps")) for c in rounds]
            total: Counter[str] = Counter()
            for c in rounds:
                total.update(c)
            threads = ", ".join(
                f"{k} {total[k] / len(rounds):.0f} ms ({total[k + ' sleeps'] / len(rounds):.1f})"
                for k in sorted(k for k in total if not k.endswith(" sleeps"))
            )
            print(
                f"{label}: busy sleeps asked for, ms by round {' '.join(f'{x:.0f}' for x in ms)} "
                f"(median {statistics.median(ms):.0f}); sleeps by round {' '.join(f'{x:.0f}' for x in count)}; "
                f"mean by thread: {threads or 'none'}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
