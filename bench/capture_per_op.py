"""What a summary op capture costs per op above the plain forward: CPU seconds, per op and per tensor, and a profile.

    python bench/capture_per_op.py                    # GPT-2 small (capture.py --gpt2's model), 5 rounds
    python bench/capture_per_op.py --tiny             # 20 and 60 blocks of small ops: what each op adds
    python bench/capture_per_op.py --profile 40       # and one capture under cProfile: the 40 largest by own time

Each round runs the plain forward, then `capture(model, ..., level="op", values="summary")` of the same call into one
data dir (in use: made, with one capture into it, before the rounds; each capture a new session), after one warm-up
of each. CPU seconds are this thread's (`time.thread_time`: the forward's thread, where the capture's per-op work
runs) and this process's (all threads: torch's intra-op threads too), medians of the rounds; "per op" divides the
capture's CPU above the forward's by the ops recorded, "per tensor" by the tensors summarised (ops' outputs and
modules' inputs and outputs): what each capture pays once (opening the data dir, the run's transaction) included.
`--tiny` measures a model of small ops at two sizes (20 and 60 blocks of 33 ops) and divides the difference, which
leaves that out: what one more op costs, the summary kernel's time next to nothing. `--profile N` then profiles one
more capture (cProfile, which slows Python calls 2-3x: read its shares, not its seconds) and counts the recorded ops
by name. `PYTHONPATH=/path/to/other/server` measures
another checkout's `tensor_debugger` with the same model: run the two in turn. Nothing asserts on timings.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import machine_line


def gpt2() -> tuple[Any, Callable[[Any], Any]]:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    make_config: Callable[..., Any] = GPT2Config  # typed in some transformers releases, not in others
    make_model: Callable[..., torch.nn.Module] = GPT2LMHeadModel
    model = make_model(make_config(n_layer=12, n_embd=768, n_head=12, n_positions=256, vocab_size=50257)).eval()
    ids = torch.randint(0, 50257, (1, 256), generator=torch.Generator().manual_seed(1))
    return model, lambda m: m(input_ids=ids)


def tiny(blocks: int) -> tuple[Any, Callable[[Any], Any]]:
    """`blocks` blocks, each a layer norm, ten rounds of (h * 0.5 + 1, tanh) and a linear layer on (2, 8) tensors (33
    ops a block), whose values are too small for the summary kernel's time to count."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.norm = nn.Linear(8, 8), nn.LayerNorm(8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.norm(x)
            for _ in range(10):
                h = torch.tanh(h * 0.5 + 1.0)
            out: torch.Tensor = x + self.lin(h)
            return out

    class Blocks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return x

    torch.manual_seed(0)
    x = torch.randn(2, 8)
    return Blocks().eval(), lambda m: m(x)


def op_of(name: str) -> str:
    """`softmax` of `GPT2LMHeadModel.transformer.h.0.attn/softmax#1_outputs`."""
    return name.rpartition("/")[2].partition("#")[0]


Rounds = list[tuple[float, float]]  # (forward thread, process) CPU seconds of each round


def measure(model: Any, call: Callable[[Any], Any], rounds: int, profile: cProfile.Profile | None) -> tuple[Any, ...]:
    """(plain rounds, capture rounds, the last capture's result): see the module docstring."""
    import torch
    from tensor_debugger import capture
    from tensor_debugger.services import open_services
    from tensor_debugger.settings import Settings

    work = Path(tempfile.mkdtemp(prefix="bench-capture-per-op-"))
    data_dir = work / "data"
    sessions = iter(range(1_000_000))

    def forward() -> None:
        with torch.no_grad():
            call(model)

    def summary_capture() -> Any:
        session = f"bench {next(sessions)}"
        with torch.no_grad(), capture(model, session, "r", data_dir=data_dir, level="op", values="summary") as result:
            call(model)
        return result

    plain: Rounds = []
    captured: Rounds = []
    try:
        open_services(Settings.from_environ(data_dir=data_dir)).close()
        forward()
        result = summary_capture()
        for _ in range(rounds):
            for kind, step in ((plain, forward), (captured, summary_capture)):
                thread, process = time.thread_time(), time.process_time()
                step()
                kind.append((time.thread_time() - thread, time.process_time() - process))
        if profile is not None:
            profile.enable()
            result = summary_capture()
            profile.disable()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return plain, captured, result


def recorded_ops(result: Any) -> collections.Counter[str]:
    calls = {name.rpartition("_outputs")[0] for name in result.sources if "/" in name}  # an op's tuple: one call
    return collections.Counter(op_of(call) for call in calls)


def above(plain: Rounds, captured: Rounds, index: int) -> float:
    """The median over rounds of the capture's CPU less the forward's (index 0: the thread's, 1: the process's)."""
    return statistics.median(c[index] - p[index] for p, c in zip(plain, captured, strict=True))


def report(label: str, plain: Rounds, captured: Rounds, result: Any) -> tuple[int, int]:
    recorded, tensors = sum(recorded_ops(result).values()), result.tensors
    print(f"\n{label}: ops recorded {recorded}, tensors summarised {tensors}")
    print(f"{'CPU (median)':34}{'forward thread':>16}{'process':>12}")
    for name, values in (("plain forward", plain), ("summary capture", captured)):
        print(
            f"{name:34}{statistics.median(v[0] for v in values):>14.3f} s"
            f"{statistics.median(v[1] for v in values):>10.3f} s"
        )
    print(f"{'capture less forward':34}{above(plain, captured, 0):>14.3f} s{above(plain, captured, 1):>10.3f} s")
    for unit, count in (("per op", recorded), ("per tensor", tensors)):
        thread, process = above(plain, captured, 0), above(plain, captured, 1)
        print(f"{'  ' + unit:34}{1e6 * thread / count:>13.1f} us{1e6 * process / count:>9.1f} us")
    return recorded, tensors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="forward and capture pairs measured (default 5)")
    parser.add_argument("--tiny", action="store_true", help="the small-op model (20 and 60 blocks), not GPT-2 small")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="profile one capture: the N top lines")
    args = parser.parse_args()

    import tensor_debugger
    import torch

    print(machine_line(f"torch {torch.__version__}"))
    print(f"tensor_debugger from {Path(tensor_debugger.__file__).parent.parent}; {args.rounds} rounds")
    profile = cProfile.Profile() if args.profile else None
    if not args.tiny:
        model, call = gpt2()
        plain, captured, result = measure(model, call, args.rounds, profile)
        report("GPT-2 small, 256 tokens", plain, captured, result)
    else:
        # two sizes: the difference is what each op adds, without what each capture pays once (opening the data
        # dir, the run's rows' transaction, closing)
        sizes = []
        for blocks in (20, 60):
            model, call = tiny(blocks)
            plain, captured, result = measure(model, call, args.rounds, profile if blocks == 60 else None)
            counts = report(f"{blocks} blocks of small ops", plain, captured, result)
            sizes.append((counts, above(plain, captured, 0), above(plain, captured, 1)))
        (ops_a, tensors_a), thread_a, process_a = sizes[0]
        (ops_b, tensors_b), thread_b, process_b = sizes[1]
        print(f"\neach op more (60 blocks less 20): {ops_b - ops_a} ops, {tensors_b - tensors_a} tensors")
        for unit, count in (("per op", ops_b - ops_a), ("per tensor", tensors_b - tensors_a)):
            print(
                f"{'  ' + unit:34}{1e6 * (thread_b - thread_a) / count:>13.1f} us"
                f"{1e6 * (process_b - process_a) / count:>9.1f} us"
            )
        fixed = thread_a - (thread_b - thread_a) / (ops_b - ops_a) * ops_a
        print(f"{'  per capture (the rest, thread)':34}{1e3 * fixed:>13.1f} ms")
    print(f"load average when done: {os.getloadavg()[0]:.1f}")
    if profile is not None:
        print("\nrecorded ops by name (the profiled capture):")
        print(", ".join(f"{name} {n}" for name, n in recorded_ops(result).most_common()))
        print(f"\none capture under cProfile, the {args.profile} largest by own time:")
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
