"""Benchmark a process's first `capture()` of a plain torch model (no transformers, no torch.compile): what
`import tensor_debugger` and the first capture cost in a fresh interpreter, and which heavy modules the capture
imports (torch._dynamo: about 1.5 s of CPU once, which `torch.compiler.disable` pulls in).

    python bench/capture_start.py                        # 5 fresh processes
    python bench/capture_start.py --rounds 9
    PYTHONPATH=/path/to/other/server python bench/capture_start.py   # another checkout's tensor_debugger

Each round is a new `python` process: torch imported first (not this package's cost, reported apart), then
`import tensor_debugger` timed, then one `capture()` of a two-layer MLP (values="full", into a new data dir, whose
database is made first) timed. CPU is the child's (all threads, `time.process_time`), which a busy machine disturbs
less than wall time; medians over the rounds. Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from harness import child_env, machine_line

CHILD = r"""
import json, sys, tempfile, time
t = time.process_time(); w = time.perf_counter()
import torch
torch_cpu, torch_wall = time.process_time() - t, time.perf_counter() - w
t = time.process_time(); w = time.perf_counter()
import tensor_debugger
import_cpu, import_wall = time.process_time() - t, time.perf_counter() - w
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
x = torch.randn(4, 64)
t = time.process_time(); w = time.perf_counter()
with torch.no_grad(), tensor_debugger.capture(model, "s", "r", data_dir=tempfile.mkdtemp()):
    model(x)
capture_cpu, capture_wall = time.process_time() - t, time.perf_counter() - w
print(json.dumps({
    "torch_cpu": torch_cpu, "import_cpu": import_cpu, "import_wall": import_wall,
    "capture_cpu": capture_cpu, "capture_wall": capture_wall,
    "dynamo": "torch._dynamo" in sys.modules, "transformers": "transformers" in sys.modules,
    "at": tensor_debugger.__file__, "torch": torch.__version__,
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="fresh processes measured (default 5)")
    args = parser.parse_args()
    rounds = []
    for _ in range(args.rounds):
        done = subprocess.run([sys.executable, "-c", CHILD], env=child_env(), capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(done.stderr)
        rounds.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(machine_line(f"torch {rounds[0]['torch']}"))
    print(f"tensor_debugger from {rounds[0]['at']}")
    print(f"torch._dynamo imported by the first capture: {sorted({r['dynamo'] for r in rounds})}")
    print(f"transformers imported: {sorted({r['transformers'] for r in rounds})}")
    for key, what in (
        ("torch_cpu", "import torch, CPU s"),
        ("import_cpu", "import tensor_debugger, CPU s"),
        ("import_wall", "import tensor_debugger, wall s"),
        ("capture_cpu", "first capture, CPU s"),
        ("capture_wall", "first capture, wall s"),
    ):
        values = [r[key] for r in rounds]
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{what}: median {statistics.median(values):.2f} ({shown})")


if __name__ == "__main__":
    main()
