"""Where a summary op capture's CPU time above the plain forward goes: each part's own CPU on the forward's thread.

    python bench/summary_split.py              # GPT-2 small (capture.py --gpt2's model), 3 captures
    python bench/summary_split.py --runs 5

The model, input and capture are `capture.py --gpt2`'s (`capture(model, ..., level="op", values="summary")` into a
new data dir each time, after one warm-up). Each part is timed by wrapping the capture's own functions (PARTS) and,
inside the op mode's handler, the torch call itself, with `time.thread_time` (this thread's CPU seconds, which
other processes on a busy machine disturb less than wall time): a part's own time, its wrapped callees' taken out.
"The forward's own work" is the torch calls the op mode hands on, what a plain forward does; the parts the capture
adds are the rest. The wrappers cost about a microsecond a call, counted in the parts. Opening the data dir runs on
a thread of its own (not counted here: "wait for the opening thread" is what the forward's thread waited for it).
`PYTHONPATH=/path/to/other/server` measures another checkout's `tensor_debugger`. Nothing asserts on timings.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import machine_line

# (module, owner's name or "", attribute, the part's name)
PARTS = [
    ("tensor_debugger.live.ops", "OpMode", "__torch_function__", "op mode dispatch (the handler's own Python)"),
    ("tensor_debugger.live.ops", "", "caller_source", "op source line (frame walk)"),
    ("tensor_debugger.live.ops", "OpMode", "_from_module_hooks", "op: module hooks check (frame)"),
    ("tensor_debugger.live.call_recorder", "Recorder", "record_op", "record_op (names, nodes)"),
    ("tensor_debugger.live.call_recorder", "Recorder", "serialize", "serialize (entries)"),
    ("tensor_debugger.live.summary_cache", "Summaries", "sketch", "summary cache lookup"),
    ("tensor_debugger.live.summary_cache", "Summaries", "_alias", "summary alias (reshaped)"),
    ("tensor_debugger.ingest.sketches", "", "_host_sketch_folded", "summary: Python around the kernel"),
    ("tensor_debugger.ingest.sketches", "", "_contiguous", "summary: contiguous copy"),
    ("tensor_debugger.engine.fused", "Kernel", "sketch", "summary: C kernel (hash, statistics)"),
    ("tensor_debugger.ingest.sketches", "", "sampled_values", "summary: sample"),
    ("tensor_debugger.ingest.sketches", "", "fold64_digest", "summary: digest"),
    ("tensor_debugger.live.call_recorder", "Recorder", "enter", "module pre-hook (enter)"),
    ("tensor_debugger.live.call_recorder", "Recorder", "leave", "module post-hook (leave)"),
    ("tensor_debugger.live.call_recorder", "", "module_caller", "module caller line (frame walk)"),
    ("tensor_debugger.live.call_recorder", "Recorder", "settle", "summaries to JSON (settle)"),
    ("tensor_debugger.live.run_storage", "LocalRun", "finish", "the trace from memory (finish)"),
    ("tensor_debugger.ingest.runs", "Ingestor", "complete_stored", "the run's rows (complete_stored)"),
    ("tensor_debugger.live.run_storage", "LocalRun", "_wait", "wait for the opening thread"),
    ("tensor_debugger.live.run_storage", "LocalRun", "close", "close the data dir"),
]
FORWARD = "the forward's own work (torch calls)"


class Clock:
    """Exclusive CPU seconds (this thread's) and calls, by part."""

    def __init__(self) -> None:
        self.own: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter[str] = collections.Counter()
        self.stack: list[float] = []  # per open call: its wrapped callees' time so far

    def timed(self, part: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            self.stack.append(0.0)
            try:
                return function(*args, **kwargs)
            finally:
                spent = time.thread_time() - start
                inner = self.stack.pop()
                self.own[part] += spent - inner
                self.calls[part] += 1
                if self.stack:
                    self.stack[-1] += spent

        return wrapper


def instrument(clock: Clock) -> None:
    import importlib

    from tensor_debugger.live import ops

    handler = ops.OpMode.__torch_function__

    def torch_function(
        self: Any, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        timed = clock.timed(FORWARD, func)
        timed.__name__ = getattr(func, "__name__", "")
        return handler(self, timed, types, args, kwargs)

    setattr(ops.OpMode, "__torch_function__", torch_function)  # noqa: B010 (a method replaced on the class)
    for module_name, owner_name, attribute, part in PARTS:
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        setattr(owner, attribute, clock.timed(part, getattr(owner, attribute)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="captures measured (default 3)")
    args = parser.parse_args()

    import tensor_debugger
    import torch
    from tensor_debugger import capture
    from tensor_debugger.services import open_services
    from tensor_debugger.settings import Settings
    from transformers import GPT2Config, GPT2LMHeadModel

    clock = Clock()
    instrument(clock)
    torch.manual_seed(0)
    make_config: Callable[..., Any] = GPT2Config  # typed in some transformers releases, not in others
    make_model: Callable[..., torch.nn.Module] = GPT2LMHeadModel
    model = make_model(make_config(n_layer=12, n_embd=768, n_head=12, n_positions=256, vocab_size=50257)).eval()
    ids = torch.randint(0, 50257, (1, 256), generator=torch.Generator().manual_seed(1))
    work = Path(tempfile.mkdtemp(prefix="bench-summary-split-"))

    def forward() -> None:
        with torch.no_grad():
            model(input_ids=ids)

    def summary_capture(name: str) -> None:
        with torch.no_grad(), capture(model, "bench", "r", data_dir=work / name, level="op", values="summary"):
            model(input_ids=ids)

    try:
        open_services(Settings.from_environ(data_dir=work / "warm")).close()
        forward()
        summary_capture("warm-up")
        clock.own.clear()
        clock.calls.clear()
        plain: list[float] = []
        captured: list[float] = []
        for run in range(args.runs):
            start = time.thread_time()
            forward()
            plain.append(time.thread_time() - start)
            start = time.thread_time()
            summary_capture(f"run {run}")
            captured.append(time.thread_time() - start)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    runs = args.runs
    print(machine_line(f"torch {torch.__version__}"))
    print(f"tensor_debugger from {Path(tensor_debugger.__file__).parent.parent}")
    print(
        f"forward's thread CPU, medians of {runs}: plain forward {statistics.median(plain):.3f} s, summary capture "
        f"{statistics.median(captured):.3f} s"
    )
    print(f"{'part (CPU ms a capture, forward thread)':48}{'ms':>9}{'calls':>8}")
    for part, seconds in sorted(clock.own.items(), key=lambda item: -item[1]):
        print(f"{part:48}{1000 * seconds / runs:>9.1f}{clock.calls[part] // runs:>8}")
    rest = sum(captured) - sum(clock.own.values())
    print(f"{'the rest (torch hook machinery, wrappers)':48}{1000 * rest / runs:>9.1f}")
    above = (sum(captured) - clock.own[FORWARD]) / runs
    print(
        f"capture less the forward's own work: {1000 * above:.1f} ms; load average when done: {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
