"""Benchmark comparing two runs: throughput against the store's raw read speed, peak RSS, and slice latency.

    python bench/compare.py                      # 2 x 0.5 GiB of float32 (rows, 4096) tensors, 64 MiB each
    python bench/compare.py --size-gib 4 --skip-slices

Two runs (`{i}_post_mlp.pth`; the candidate is the reference plus a small planted difference in every tensor) are
written one tensor at a time and ingested by the real CLI, which plans the pairs. A child computes them with the
library API (so the peak RSS is its own), in rounds that alternate with reading the same arrays, region by region as
the comparison reads them, on 1 and 2 threads, both through the store's chunk reader (into arrays) and through the
compiled chunk loop reading and decoding only (into a buffer that stays in cache): the best of those is the limit.
Medians are reported.
Another child reads them through zarr, for context. The real server then serves windows of 64 and 64 x 64 values of
a --slice-gib pair to one keep-alive client.
Nothing here asserts on timings. This process imports neither torch nor zarr (httpx only after the measured
children): a child started with vfork, as subprocess does, reports max(its own peak RSS, its parent's) as ru_maxrss.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import child_env, machine_line, run_child

if TYPE_CHECKING:
    import httpx

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / ".venv" / "bin" / "tensor-debugger"
DEFAULT_WORKDIR_PARENT = ROOT / "bench-data"  # gitignored
HIDDEN = 4096  # last dimension of every generated tensor (float32)
MIB, GIB, MB, GB = 1 << 20, 1 << 30, 1e6, 1e9
KEPT = ("TENSOR_DEBUGGER_KERNEL",)  # passed on to children: which statistics kernel to measure
BASELINE = ("import tensor_debugger.services, zarr, numpy; from importlib.metadata import version; "
            "print(f\"torch {version('torch')}, zarr {zarr.__version__}, numpy {numpy.__version__}\")")


def child(mode: str, *args: object) -> tuple[float, float, dict[str, Any]]:
    """This script in a child process, in one of the internal modes below; its last stdout line is JSON."""
    wall, rss, out = run_child([sys.executable, __file__, "--child", mode, *map(str, args)], child_env(KEPT))
    return wall, rss, json.loads(out.strip().splitlines()[-1])


def write_runs(folder: Path, per_run: int, tensor_bytes: int, seed: int, noise: float) -> None:
    """ref/ and cand/ under `folder`, `per_run` bytes each of (rows, HIDDEN) float32 tensors (child process); with
    `noise`, every candidate value also differs from its reference by a relative `noise` times a normal draw."""
    import torch

    row_bytes = HIDDEN * 4
    full_rows = max(1, tensor_bytes // row_bytes)
    generator = torch.Generator().manual_seed(seed)
    (folder / "ref").mkdir(parents=True)
    (folder / "cand").mkdir()
    count = payload = 0
    while payload < per_run:
        rows = min(full_rows, -(-(per_run - payload) // row_bytes))
        t = torch.randn(rows, HIDDEN, generator=generator)
        torch.save(t, folder / "ref" / f"{count}_post_mlp.pth")
        if noise:
            t += t * torch.randn(t.shape, generator=generator) * noise
        row = int(torch.randint(rows, (), generator=generator))
        col = int(torch.randint(HIDDEN - 8, (), generator=generator))
        t[row, col : col + 8] += 1e-2  # the planted difference: 8 values, far above float32's tolerance
        torch.save(t, folder / "cand" / f"{count}_post_mlp.pth")
        payload, count = payload + rows * row_bytes, count + 1
        del t
    os.sync()  # let write-back finish so that it does not run during the timed steps
    print(json.dumps({"count": count, "payload": payload}))


def measure(mode: str, data: Path, session_id: int, rounds: int) -> None:
    """In a child: `rounds` rounds of computing the session's pairs with the library API (the cache emptied
    first) and of reading the same arrays through the store's chunk reader, region by region as the comparison
    reads them, on 1 and 2 threads ("rounds"); or one read through zarr itself ("zarr"). Rounds interleave the
    three so that a slow spell of this VM slows all of them alike."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    from sqlalchemy import delete, func, select
    from tensor_debugger.compare.chunk_loop import loop_name, read_chunks
    from tensor_debugger.engine.chunking import iter_blocks, plan_chunks
    from tensor_debugger.engine.fused import kernel_name
    from tensor_debugger.engine.streaming import BLOCK_BYTES
    from tensor_debugger.services import open_services
    from tensor_debugger.settings import Settings
    from tensor_debugger.store.models import ComparisonResultRecord, PairRecord, RunRecord, TensorRecord

    services = open_services(Settings(data_dir=data, demo=False))
    with services.sessions() as db:
        tensors = db.scalars(select(TensorRecord).join(RunRecord).where(RunRecord.session_id == session_id)
                             .order_by(TensorRecord.run_id, TensorRecord.position)).all()
        runs = {run: [(t.store_key, t.digest) for t in tensors if t.run_id == run]
                for run in sorted({t.run_id for t in tensors})}
        nbytes = sum(t.nbytes for t in tensors)

    def read_all(arrays: list[tuple[str, str]], how: str = "reader") -> int:
        """Read every array in `arrays` through zarr, the store's chunk reader, or the compiled chunk loop."""
        n = 0
        for key, digest in arrays:
            if how == "zarr":
                source: Any = services.store.open(key)  # (rows, HIDDEN), chunks of whole rows
                step = source.chunks[0] * 16
                regions = [(slice(r, r + step), slice(0, source.shape[1])) for r in range(0, source.shape[0], step)]
            else:
                source = services.store.reader(key, digest)  # as the comparison opens it, and reads it:
                regions = list(iter_blocks(plan_chunks(source.shape, 8, BLOCK_BYTES), 1))  # type: ignore[arg-type]
            for region in regions:
                if how == "loop":  # (rows, HIDDEN) regions of whole rows: flat ranges
                    start, stop = region[0].start * source.shape[1], region[0].stop * source.shape[1]
                    read_chunks(source, start, stop)
                    n += (stop - start) * source.dtype.itemsize
                else:
                    n += np.asarray(source[region]).nbytes
        return n

    def timed(work: Any) -> dict[str, float]:
        started, cpu = time.perf_counter(), time.process_time()  # CPU seconds: a fairer measure on a busy VM
        work()
        return {"s": time.perf_counter() - started, "cpu": time.process_time() - cpu}

    def read_1(how: str = "reader") -> None:
        read_all([a for arrays in runs.values() for a in arrays], how)

    def read_2(how: str = "reader") -> None:
        with ThreadPoolExecutor(len(runs)) as pool:
            list(pool.map(partial(read_all, how=how), runs.values()))

    def compute() -> None:
        services.comparisons.compute_pending(session_id)

    def empty_cache() -> None:  # every round computes every pair (not timed)
        with services.sessions.begin() as db:
            db.execute(delete(ComparisonResultRecord))
        services.comparisons.refresh(session_id)

    if mode == "zarr":
        print(json.dumps({"bytes": nbytes, "one": timed(partial(read_1, "zarr")),
                          "two": timed(partial(read_2, "zarr"))}))
    else:
        figures: dict[str, list[dict[str, float]]] = {"compute": [], "one": [], "two": [], "loop one": [],
                                                      "loop two": [], "warm-up": [timed(read_1)]}
        chunks = 0
        for _ in range(rounds):
            empty_cache()
            before = services.store.chunk_reads
            figures["compute"].append(timed(compute))
            chunks = services.store.chunk_reads - before
            for name, work in (("one", read_1), ("two", read_2), ("loop one", partial(read_1, "loop")),
                               ("loop two", partial(read_2, "loop"))):
                figures[name].append(timed(work))
        with services.sessions() as db:
            statuses = {status: count for status, count in db.execute(select(PairRecord.status, func.count())
                        .where(PairRecord.session_id == session_id).group_by(PairRecord.status))}
            pairs = sum(statuses.values())
        print(json.dumps({"bytes": nbytes, "pairs": pairs, "statuses": statuses, "chunks": chunks,
                          "kernel": kernel_name(), "loop": loop_name(), **figures}))
    services.close()


def make_session(data: Path, dump: Path, name: str, per_run: int, tensor_bytes: int, args: argparse.Namespace) -> int:
    """Generate a ref and a cand run and ingest both with the CLI; return the session id."""
    wall, _, written = child("dump", dump, per_run, tensor_bytes, args.seed, args.noise)
    print(f"session {name!r}: 2 runs of {written['count']} float32 tensors of up to {tensor_bytes / MIB:g} MiB, "
          f"{written['payload'] / MB:.0f} MB each, written in {wall:.1f} s"
          + (f", every candidate value off by a relative {args.noise:g} x N(0, 1)" if args.noise else "") + "; ingest:")
    for label in ("ref", "cand"):
        cmd = [str(CLI), "--data-dir", str(data), "ingest", "--session", name, "--run", label, str(dump / label),
               "--json"]
        wall, rss, out = run_child(cmd, child_env(KEPT))
        result = json.loads(out.strip().splitlines()[-1])
        print(f"  {' '.join(cmd)}\n    -> {result['run']['tensors']} tensors in {wall:.1f} s, peak RSS {rss:.0f} MB"
              + "".join(f"\n    problem: {problem}" for problem in result["problems"]))
    if not args.keep:
        shutil.rmtree(dump)  # frees its page cache for the data dir
    return int(result["session"]["id"])


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def throughput(data: Path, session_id: int, rounds: int) -> None:
    wall, rss, res = child("rounds", data, session_id, rounds)
    gb = res["bytes"] / GB

    def rates(name: str) -> str:
        return ", ".join(f"{gb / r['s']:.2f}" for r in res[name])

    def rate(name: str) -> float:
        return median([gb / r["s"] for r in res[name]])

    def per_cpu(name: str) -> float:
        return median([gb / r["cpu"] for r in res[name]])

    compute = rate("compute")
    print(f"warm-up: one untimed read of every chunk ({res['warm-up'][0]['s']:.2f} s), so that every round reads from "
          f"the page cache (this VM's DAMON pages out memory unused for about 30 s)")
    print(f"comparison (compute_pending in a child, the cache emptied before each of {rounds} rounds): {res['pairs']} "
          f"pairs, {gb:.2f} GB of tensors (both sides), {res['chunks']} chunks read by a comparison; verdicts "
          f"{res['statuses']}")
    print(f"  {compute:.2f} GB/s (median; rounds: {rates('compute')}), {per_cpu('compute'):.2f} GB per CPU-second")
    hint = (" (TENSOR_DEBUGGER_KERNEL=blocks measures reading arrays first, =numpy the numpy path)"
            if res["loop"] == "chunk loop" else "")
    print(f"  statistics kernel: {res['kernel']}; chunks read by: {res['loop']}{hint}")
    print(f"peak RSS of the comparing child: {rss:.0f} MB (target: under {GIB / MB:.0f} MB, however large the runs); "
          f"child wall {wall:.1f} s with start-up")
    print("the limit: the same arrays read in the same regions, without statistics, in the same rounds (2 threads: "
          "one per run)")
    limits = {}
    for name, label in (("one", "chunk reader into arrays, 1 thread"), ("two", "chunk reader into arrays, 2 threads"),
                        ("loop one", "compiled chunk loop, decoding only, 1 thread"),
                        ("loop two", "compiled chunk loop, decoding only, 2 threads")):
        limits[label] = rate(name)
        print(f"  {label}: {rate(name):.2f} GB/s (rounds: {rates(name)}), {per_cpu(name):.2f} GB per CPU-second")
    best = max(limits, key=limits.__getitem__)
    print(f"  comparison at {100 * compute / limits[best]:.0f}% of the best of these medians ({best}; "
          f"target: at least 80%)")
    _, _, raw = child("zarr", data, session_id, 1)
    print(f"for context, zarr's own reads of the same arrays, 16 chunks at a time: {gb / raw['one']['s']:.2f} GB/s on "
          f"1 thread, {gb / raw['two']['s']:.2f} GB/s on 2 threads")


def time_requests(client: httpx.Client, url: str, queries: list[str]) -> tuple[list[float], list[int]]:
    """Latencies in ms (sorted) and response sizes in bytes."""
    times, sizes = [], []
    for query in queries:
        started = time.perf_counter()
        sizes.append(len(client.get(url + query).raise_for_status().content))
        times.append(1000 * (time.perf_counter() - started))
    return sorted(times), sizes


def slices(data: Path, session_id: int, args: argparse.Namespace) -> None:
    import httpx  # only now: this process's peak RSS no longer matters

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [str(CLI), "--data-dir", str(data), "serve", "--port", str(port), "--no-demo"]
    print(f"server: {' '.join(cmd)}")
    log = open(data.parent / "server.log", "w+b")
    started = time.perf_counter()
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env(KEPT))
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            report: dict[str, Any] = {}
            while not report or report["progress"]["pending"]:
                if server.poll() is not None:
                    log.seek(0)
                    sys.exit(f"the server exited ({server.returncode}):\n{log.read().decode()}")
                with contextlib.suppress(httpx.TransportError):  # not listening yet
                    report = client.get(f"/api/sessions/{session_id}/pairs").raise_for_status().json()
                time.sleep(0.25)
            pair = report["pairs"][0]
            rows, cols = pair["aligned_shape"]
            print(f"  the server's worker finished the pairs (pair {pair['id']}: {rows} x {cols}, "
                  f"{pair['status']}) {time.perf_counter() - started:.1f} s after start (start-up included)")
            rng, url = random.Random(args.seed), f"/api/pairs/{pair['id']}/slice?"
            for kind, two_d in (("1-D window of 64", False), ("2-D window of 64 x 64", True)):
                queries = [f"index=:,:&start={rng.randrange(rows - 63)},{rng.randrange(cols - 63)}&count=64,64"
                           if two_d else f"index={rng.randrange(rows)},:&start={rng.randrange(cols - 63)}&count=64"
                           for _ in range(args.requests + 1)]
                (first, *_), _ = time_requests(client, url, queries[:1])
                ms, sizes = time_requests(client, url, queries[1:])
                p50, p99 = (ms[max(0, math.ceil(q * len(ms)) - 1)] for q in (0.5, 0.99))  # nearest rank
                print(f"  slice, {kind}: {len(ms)} requests after one warm-up of {first:.1f} ms, JSON responses of "
                      f"{min(sizes)}-{max(sizes)} B: p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {ms[-1]:.1f} ms "
                      f"(targets: p50 under 10 ms, p99 under 50 ms)")
        with open(f"/proc/{server.pid}/status", encoding="utf-8") as f:
            hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        print(f"  peak RSS of the server (VmHWM): {hwm * 1024 / MB:.0f} MB")
    finally:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=60)
        server.kill()  # a no-op once it has exited
        log.close()


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gib", type=float, default=1.0, help="total of both runs in GiB (default 1)")
    p.add_argument("--tensor-mib", type=float, default=64.0, help="payload per tensor in MiB (default 64)")
    p.add_argument("--slice-gib", type=float, default=1.0, help="the slice session's tensor, per run (default 1)")
    p.add_argument("--requests", type=int, default=300, help="slice requests of each kind (default 300)")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--skip-slices", action="store_true")
    p.add_argument("--rounds", type=int, default=3, help="rounds of comparing and reading (default 3): the medians "
                   "are reported")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noise", type=float, default=0.0, help="relative noise on every candidate value, e.g. 0.004 "
                   "for bfloat16-like differences (default 0: only the planted difference)")
    p.add_argument("--keep", action="store_true", help="keep the generated dumps and data dir")
    p.add_argument("--workdir", type=Path, help=f"folder for dumps and data (default: a new temp dir under "
                   f"{DEFAULT_WORKDIR_PARENT})")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)  # internal: MODE ARGS...
    return p.parse_args()


def main() -> int:
    args = parse_args()
    if args.child:
        mode, folder, *rest = args.child
        if mode == "dump":
            write_runs(Path(folder), int(rest[0]), int(rest[1]), int(rest[2]), float(rest[3]))
        else:
            measure(mode, Path(folder), int(rest[0]), int(rest[1]))
        return 0
    wall, rss, versions = run_child([sys.executable, "-c", BASELINE], child_env(KEPT))
    print(machine_line(versions.strip()))
    print(f"baseline child (import tensor_debugger.services, zarr; what a comparing child imports before it "
          f"works): {wall:.2f} s, peak RSS {rss:.0f} MB")
    if args.workdir is None:
        DEFAULT_WORKDIR_PARENT.mkdir(exist_ok=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="compare-", dir=DEFAULT_WORKDIR_PARENT))
    workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=workdir.resolve()))
    data, slice_bytes = work / "data", int(args.slice_gib * GIB)
    try:
        session_id = None
        if not args.skip_throughput:
            per_run, tensor_bytes = int(args.size_gib * GIB) // 2, int(args.tensor_mib * MIB)
            session_id = make_session(data, work / "dump", "bench", per_run, tensor_bytes, args)
            print("note: the data dir was freshly written, so every read below comes from the page cache, not disk")
            throughput(data, session_id, args.rounds)
            session_id = session_id if min(tensor_bytes, per_run) >= slice_bytes else None  # its pair 0 will do
        if not args.skip_slices:
            slices(data, session_id or make_session(data, work / "slice-dump", "bench-slices", slice_bytes,
                                                    slice_bytes, args), args)
        if args.keep:
            print(f"kept: {work}")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            if args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
