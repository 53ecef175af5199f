"""Benchmark of the `where` pass of one block (engine/where.py's `block_masses`): numpy's slabs against the compiled
row and column sums (`Kernel.where_sums`, td_where_ff/dd) of each vector family this CPU runs.

    python bench/where_pass.py
    python bench/where_pass.py --rows 1024 --columns 1024 --dtype float64 --repeats 50

A block of `--rows` x `--columns` values a side (the default: one `where` block of first_answer.py's float32 tensors,
1024 rows of 1024), the candidate the reference plus a relative 1e-3 of noise. CPU time of this process per block,
best of 3; each path's results are checked to be numpy's, bit for bit, before any is timed. Nothing here asserts
on timings.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from harness import machine_line
from tensor_debugger.engine.fused import Kernel, families
from tensor_debugger.engine.where import block_masses


def ms_per_block(run: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for _ in range(repeats):
            run()
        best = min(best, (time.process_time() - started) / repeats)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--columns", type=int, default=1024)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((args.rows, args.columns)).astype(args.dtype)
    b = (a + 1e-3 * rng.standard_normal(a.shape)).astype(args.dtype)
    print(machine_line(f"numpy {np.__version__}"))
    print(
        f"one block of {args.rows} x {args.columns} {args.dtype} a side ({a.nbytes / 2**20:.1f} MiB), CPU ms, best of 3"
    )
    want = block_masses(a, b)
    paths: list[tuple[str, Kernel | None]] = [("numpy", None)] + [
        (f"compiled, {f}", Kernel("compiled", f)) for f in families()
    ]
    for label, kernel in paths:
        got = block_masses(a, b, kernel)
        same = all(x.tobytes() == y.tobytes() for x, y in zip([*got[0], *got[1]], [*want[0], *want[1]], strict=True))
        if not same:
            raise SystemExit(f"{label}: not numpy's sums, bit for bit")
        ms = ms_per_block(partial(block_masses, a, b, kernel), args.repeats)
        print(f"{label:20s} {ms:8.3f} ms a block  {a.size / ms / 1e3:8.1f} M pairs/s")


if __name__ == "__main__":
    main()
