"""Benchmark `find_divergence`'s precision floor: what the converted copy of the reference costs.

    python bench/precision_floor.py                      # 12 blocks of hidden 512, 64 tokens, float32 vs bfloat16
    python bench/precision_floor.py --dtype float16 --runs 3

The model is `tensor_debugger.demo.models.ResidualStack` (blocks of a linear layer, GELU, another linear layer and
a residual), seeded; the reference runs in float32, the candidate is the same model converted to `--dtype` (no bug:
two forwards with summaries, three with the floor, then, as the hashes differ by rounding, the second pass's full
values of the first changed tensor's module, which decide), and again with a bug
planted in the last block's activation (SiLU for GELU: the second pass runs, full values of two modules). Each
`find_divergence` runs into a new data dir, with `precision_floor=False` and with the floor; printed: its wall and
CPU time (this process, all threads), the answer's first divergence and culprits, the bytes the data dir holds
afterwards (the floor's runs "noise" and "noise (full)" are stored in the session), the session's runs, and the
bytes of the converted copy's parameters; and each module the floor hid that was called again on the reference's
arguments (live/own_error.py), with its own error in times the floor copy's. Nothing asserts on timings.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tensor_debugger import find_divergence
from tensor_debugger.demo.models import ResidualStack


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    machine = platform.processor() or platform.machine()
    print(f"{machine}, {os.cpu_count()} CPUs, torch {torch.__version__}, load {os.getloadavg()}")
    reference = ResidualStack(args.layers, args.hidden).eval()
    copy_bytes = sum(p.numel() for p in reference.parameters()) * torch.finfo(dtype).bits // 8
    print(
        f"{args.layers} blocks, hidden {args.hidden}, {args.tokens} tokens; float32 against {args.dtype}; the "
        f"converted copy's parameters: {copy_bytes / 2**20:.1f} MiB"
    )
    x = torch.randn(1, args.tokens, args.hidden, generator=torch.Generator().manual_seed(1))
    for bug in (False, True):
        candidate = ResidualStack(args.layers, args.hidden, bug).to(dtype).eval()
        for floor in (False, True):
            walls, cpus, sizes = [], [], []
            for _ in range(args.runs):
                with tempfile.TemporaryDirectory() as data_dir:
                    wall, cpu = time.perf_counter(), _cpu()
                    found = find_divergence(
                        reference, candidate, (x,), session="bench", data_dir=data_dir, precision_floor=floor
                    )
                    walls.append(time.perf_counter() - wall)
                    cpus.append(_cpu() - cpu)
                    sizes.append(sum(f.stat().st_size for f in Path(data_dir).rglob("*") if f.is_file()))
            first = found.first.module if found.first is not None else None
            print(
                f"{'bug in the last block' if bug else 'no bug':22} floor {'on ' if floor else 'off'}: "
                f"wall {statistics.median(walls):.2f} s, CPU {statistics.median(cpus):.2f} s (median of {args.runs}); "
                f"data dir {statistics.median(sizes) / 2**20:.2f} MiB; runs {', '.join(found.runs)}; "
                f"first divergence {first}, culprits {found.culprits}"
            )
            for own in found.own_errors:  # modules within the floor replayed on the reference's arguments
                ratio = f"{own.ratio:.2f}x" if own.reason is None else f"not replayed ({own.reason})"
                print(
                    f"    own error of {own.module}: {ratio} the floor copy's (max |diff| {own.candidate_error:.4g} "
                    f"against {own.floor_error:.4g}; relative RMSE {own.candidate_rmse:.3g} against "
                    f"{own.floor_rmse:.3g}){', culprit' if own.culprit else ''}"
                )


if __name__ == "__main__":
    main()
