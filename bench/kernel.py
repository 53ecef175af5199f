"""Benchmark of the pair kernel alone: ns per pair of float32 values already in cache, per vector family.

    python bench/kernel.py
    python bench/kernel.py --pairs 1048576 --repeats 100

The kernel (engine/fused_stats.c) folds `--pairs` pairs, `--repeats` times, through each family this CPU runs
(`g`: generic vectors, in the clone the CPU picks; `v4`: AVX-512 intrinsics), for a candidate with one planted
difference and one where every value differs by a relative 0.4% (differences spanning seven decades, so seven
histogram passes). CPU time of this process; nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import ctypes
import time

import numpy as np
from harness import machine_line
from tensor_debugger.engine.fused import _library, empty_partial
from tensor_debugger.engine.metrics import edges


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=1 << 18, help="pairs per call (default 262144: 2 MiB, in L2/L3)")
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    library = _library()
    if library is None:
        print("no compiled kernel: nothing to measure")
        return 1
    print(machine_line(f"numpy {np.__version__}"))
    families = ["g"] + (["v4"] if hasattr(library, "td_v4_usable") and library.td_v4_usable() else [])
    print(f"families this CPU runs: {', '.join(families)} (comparisons use {families[-1]})")
    rng = np.random.default_rng(0)
    reference = rng.standard_normal(args.pairs, dtype=np.float32)
    planted = reference.copy()
    planted[args.pairs // 3] += 1
    noisy = (reference * (1 + np.float32(4e-3) * rng.standard_normal(args.pairs, dtype=np.float32))).astype(np.float32)
    for label, candidate in (("planted difference", planted), ("every value differs", noisy)):
        for family in families:
            function = getattr(library, f"td_stats_ff_{family}")
            best = float("inf")
            for _ in range(3):
                started = time.process_time()
                for _ in range(args.repeats):
                    out = empty_partial()
                    function(ctypes.c_void_p(reference.ctypes.data), ctypes.c_void_p(candidate.ctypes.data),
                             ctypes.c_int64(args.pairs), ctypes.c_int64(0), ctypes.c_double(1e-5),
                             ctypes.c_double(1.3e-6), 1, ctypes.c_void_p(edges().ctypes.data), ctypes.byref(out))
                best = min(best, time.process_time() - started)
            per_pair = best / (args.repeats * args.pairs) * 1e9
            print(f"{label:20s} {family:3s} {per_pair:.3f} ns per pair, {8 / per_pair:.1f} GB of float32 pairs per "
                  "CPU-second (best of 3)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
