"""Benchmark of the pair kernel alone: ns per pair of float32 values already in cache, per vector family.

    python bench/kernel.py
    python bench/kernel.py --pairs 1048576 --repeats 100

The kernel (engine/fused_stats.c) folds `--pairs` pairs, `--repeats` times, through each vector family this CPU runs
(avx512: 8 doubles a vector, AVX-512 intrinsics; avx2: 4, AVX2 and FMA; baseline: 2, SSE2 on x86-64, NEON on
aarch64), side by side, for a candidate with one planted difference and one where every value differs by a
relative 0.4% (differences spanning seven decades, so seven histogram passes). CPU time of this process, best of
3; each family's speed is also given as a share of the best family's. Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from harness import machine_line
from numpy.typing import NDArray
from tensor_debugger.engine.fused import _library, empty_partial, families, kernel_family
from tensor_debugger.engine.metrics import edges


def ns_per_pair(function: Callable[..., int], reference: NDArray[Any], candidate: NDArray[Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for _ in range(repeats):
            out = empty_partial()
            function(
                ctypes.c_void_p(reference.ctypes.data),
                ctypes.c_void_p(candidate.ctypes.data),
                ctypes.c_int64(reference.size),
                ctypes.c_int64(0),
                ctypes.c_double(1e-5),
                ctypes.c_double(1.3e-6),
                1,
                ctypes.c_void_p(edges().ctypes.data),
                ctypes.byref(out),
            )
        best = min(best, time.process_time() - started)
    return best / (repeats * reference.size) * 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=1 << 18, help="pairs per call (default 262144: 2 MiB, in L2/L3)")
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    library = _library()
    runs = families()
    if library is None or not runs:
        print("no compiled kernel this CPU runs: nothing to measure")
        return 1
    print(machine_line(f"numpy {np.__version__}"))
    print(f"kernel families this CPU runs: {', '.join(runs)} (comparisons use {kernel_family()})")
    rng = np.random.default_rng(0)
    reference = rng.standard_normal(args.pairs, dtype=np.float32)
    planted = reference.copy()
    planted[args.pairs // 3] += 1
    noisy = (reference * (1 + np.float32(4e-3) * rng.standard_normal(args.pairs, dtype=np.float32))).astype(np.float32)
    print(
        f"ns per pair of float32 ({args.pairs} pairs in cache, {args.repeats} calls, best of 3; in brackets: speed "
        f"as a share of {runs[0]}'s)"
    )
    print(f"{'case':22s}" + "".join(f"{family:>18s}" for family in runs))
    for label, candidate in (("planted difference", planted), ("every value differs", noisy)):
        times = [
            ns_per_pair(getattr(library, f"td_stats_ff_{family}"), reference, candidate, args.repeats)
            for family in runs
        ]
        print(f"{label:22s}" + "".join(f"{f'{t:.3f} ns ({times[0] / t:.0%})':>18s}" for t in times))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
