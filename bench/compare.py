"""Benchmark comparing two runs: throughput against the store's raw read speed, peak RSS, and slice latency.

    python bench/compare.py                      # 2 x 0.5 GiB of float32 (rows, 4096) tensors, 64 MiB each
    python bench/compare.py --size-gib 4 --skip-slices
    python bench/compare.py --workers 1,2 --skip-slices   # comparisons on 1 and on 2 threads, side by side
    python bench/compare.py --top 0,8 --skip-slices       # without and with the worst elements, side by side

Two runs (`{i}_post_mlp.pth`; the candidate is the reference plus a small planted difference in every tensor) are
written one tensor at a time and ingested by the real CLI, which plans the pairs. A child computes them with the
library API (so the peak RSS is its own) with each --workers count, in rounds that alternate with reading the same
arrays, region by region as the comparison reads them, on 1 thread and on the most workers' threads, both through
the store's chunk reader (into arrays) and through the compiled chunk loop reading and decoding only (into a buffer
that stays in cache): the best of those is the limit. Medians are reported.
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

from harness import child_env, machine_line, resolve, run_child, worker_counts

if TYPE_CHECKING:
    import httpx

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / ".venv" / "bin" / "tensor-debugger"
DEFAULT_WORKDIR_PARENT = ROOT / "bench-data"  # gitignored
HIDDEN = 4096  # last dimension of every generated tensor (float32)
MIB, GIB, MB, GB = 1 << 20, 1 << 30, 1e6, 1e9
KEPT = ("TENSOR_DEBUGGER_KERNEL", "TENSOR_DEBUGGER_TOP")  # passed on to children: which kernel, how many worst elements
BASELINE = (
    "import tensor_debugger.services, zarr, numpy; from importlib.metadata import version; "
    "print(f\"torch {version('torch')}, zarr {zarr.__version__}, numpy {numpy.__version__}\")"
)


def child(mode: str, *args: object) -> tuple[float, float, dict[str, Any]]:
    """This script in a child process, in one of the internal modes below; its last stdout line is JSON."""
    wall, rss, out = run_child([sys.executable, __file__, "--child", mode, *map(str, args)], child_env(KEPT))
    return wall, rss, json.loads(out.strip().splitlines()[-1])


def write_runs(folder: Path, per_run: int, tensor_bytes: int, seed: int, noise: float, growing: float) -> None:
    """ref/ and cand/ under `folder`, `per_run` bytes each of (rows, HIDDEN) float32 tensors (child process); with
    `noise`, every candidate value also differs from its reference by a relative `noise` times a normal draw; with
    `growing`, by a difference growing along each tensor from 0 to `growing` (every sub-block a new largest)."""
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
        if growing:
            t += torch.linspace(0, growing, t.numel()).reshape(t.shape)
        row = int(torch.randint(rows, (), generator=generator))
        col = int(torch.randint(HIDDEN - 8, (), generator=generator))
        t[row, col : col + 8] += 1e-2  # the planted difference: 8 values, far above float32's tolerance
        torch.save(t, folder / "cand" / f"{count}_post_mlp.pth")
        payload, count = payload + rows * row_bytes, count + 1
        del t
    os.sync()  # let write-back finish so that it does not run during the timed steps
    print(json.dumps({"count": count, "payload": payload}))


def measure(mode: str, data: Path, session_id: int, rounds: int, workers: list[int], tops: list[int]) -> None:
    """In a child: `rounds` rounds of computing the session's pairs with the library API (the cache emptied
    first) once per count in `workers`, and of reading the same arrays through the store's chunk reader, region by
    region as the comparison reads them, on 1 thread and on the most workers ("rounds"); or one read through zarr
    itself ("zarr"). Rounds interleave them all so that a slow spell of this VM slows all of them alike. `tops`:
    the worst elements kept per pair, each measured in the same rounds (empty: the setting's)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    from sqlalchemy import delete, func, select
    from tensor_debugger.compare.compute.chunk_loop import loop_name, read_chunks
    from tensor_debugger.compare.compute.pending import compute_pending
    from tensor_debugger.compare.context import open_context
    from tensor_debugger.compare.planning.plan import refresh_session
    from tensor_debugger.engine.chunking import iter_blocks, plan_chunks
    from tensor_debugger.engine.fused import kernel_name
    from tensor_debugger.engine.streaming import BLOCK_BYTES
    from tensor_debugger.services import open_services
    from tensor_debugger.settings import Settings
    from tensor_debugger.store.models import ComparisonResultRecord, PairRecord, RunRecord, TensorRecord

    # TENSOR_DEBUGGER_KERNEL (kept in this child's environment) picks the statistics path to measure
    services = open_services(Settings.from_environ(data_dir=data, demo=False, workers=max(workers)))
    threads = services.settings.threads
    tops = tops or [services.settings.top]
    comparisons = {
        (w, k): open_context(services.sessions, services.store, resolve(w), top=k) for w in workers for k in tops
    }
    with services.sessions() as db:
        tensors = db.scalars(
            select(TensorRecord)
            .join(RunRecord)
            .where(RunRecord.session_id == session_id)
            .order_by(TensorRecord.run_id, TensorRecord.position)
        ).all()
        runs = {
            run: [(t.store_key, t.digest) for t in tensors if t.run_id == run]
            for run in sorted({t.run_id for t in tensors})
        }
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

    def read_n(how: str = "reader") -> None:  # on `threads` threads, an array at a time each
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda array: read_all([array], how), [a for arrays in runs.values() for a in arrays]))

    def compute(count: int, top: int) -> None:
        compute_pending(comparisons[count, top], session_id)

    def empty_cache() -> None:  # every round computes every pair (not timed)
        with services.sessions.begin() as db:
            db.execute(delete(ComparisonResultRecord))
        refresh_session(services.context, session_id)

    if mode == "zarr":
        print(
            json.dumps(
                {
                    "bytes": nbytes,
                    "threads": threads,
                    "one": timed(partial(read_1, "zarr")),
                    "n": timed(partial(read_n, "zarr")),
                }
            )
        )
    else:
        figures: dict[str, list[dict[str, float]]] = {
            "one": [],
            "n": [],
            "loop one": [],
            "loop n": [],
            "warm-up": [timed(read_1)],
        }
        chunks = 0
        for _ in range(rounds):
            for count in workers:
                for top in tops:
                    empty_cache()
                    before = services.store.chunk_reads
                    figures.setdefault(f"compute {count} top {top}", []).append(timed(partial(compute, count, top)))
                    chunks = services.store.chunk_reads - before
            for name, work in (
                ("one", read_1),
                ("n", read_n),
                ("loop one", partial(read_1, "loop")),
                ("loop n", partial(read_n, "loop")),
            ):
                figures[name].append(timed(work))
        with services.sessions() as db:
            statuses = {
                status: count
                for status, count in db.execute(
                    select(PairRecord.status, func.count())
                    .where(PairRecord.session_id == session_id)
                    .group_by(PairRecord.status)
                )
            }
            pairs = sum(statuses.values())
        print(
            json.dumps(
                {
                    "bytes": nbytes,
                    "pairs": pairs,
                    "statuses": statuses,
                    "chunks": chunks,
                    "threads": threads,
                    "kernel": kernel_name(),
                    "loop": loop_name(),
                    "tops": tops,
                    **figures,
                }
            )
        )
    for each in comparisons.values():
        each.close()
    services.close()


def make_session(data: Path, dump: Path, name: str, per_run: int, tensor_bytes: int, args: argparse.Namespace) -> int:
    """Generate a ref and a cand run and ingest both with the CLI; return the session id."""
    wall, _, written = child("dump", dump, per_run, tensor_bytes, args.seed, args.noise, args.growing)
    print(
        f"session {name!r}: 2 runs of {written['count']} float32 tensors of up to {tensor_bytes / MIB:g} MiB, "
        f"{written['payload'] / MB:.0f} MB each, written in {wall:.1f} s"
        + (f", every candidate value off by a relative {args.noise:g} x N(0, 1)" if args.noise else "")
        + (f", a difference growing along each tensor from 0 to {args.growing:g}" if args.growing else "")
        + "; ingest:"
    )
    for label in ("ref", "cand"):
        cmd = [
            str(CLI),
            "--data-dir",
            str(data),
            "--workers",
            str(max(args.workers)),
            "ingest",
            "--session",
            name,
            "--run",
            label,
            str(dump / label),
            "--json",
        ]
        wall, rss, out = run_child(cmd, child_env(KEPT))
        result = json.loads(out.strip().splitlines()[-1])
        print(
            f"  {' '.join(cmd)}\n    -> {result['run']['tensors']} tensors in {wall:.1f} s, peak RSS {rss:.0f} MB"
            + "".join(f"\n    problem: {problem}" for problem in result["problems"])
        )
    if not args.keep:
        shutil.rmtree(dump)  # frees its page cache for the data dir
    return int(result["session"]["id"])


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def throughput(data: Path, session_id: int, rounds: int, workers: list[int], tops: list[int]) -> None:
    wall, rss, res = child("rounds", data, session_id, rounds, ",".join(map(str, workers)), ",".join(map(str, tops)))
    gb, threads, tops = res["bytes"] / GB, res["threads"], res["tops"]

    def rates(name: str) -> str:
        return ", ".join(f"{gb / r['s']:.2f}" for r in res[name])

    def rate(name: str) -> float:
        return median([gb / r["s"] for r in res[name]])

    def per_cpu(name: str) -> float:
        return median([gb / r["cpu"] for r in res[name]])

    print(
        f"warm-up: one untimed read of every chunk ({res['warm-up'][0]['s']:.2f} s), so that every round reads from "
        f"the page cache (this VM's DAMON pages out memory unused for about 30 s)"
    )
    print(
        f"comparison (compute_pending in a child, the cache emptied before each of {rounds} rounds): {res['pairs']} "
        f"pairs, {gb:.2f} GB of tensors (both sides), {res['chunks']} chunks read by a comparison; verdicts "
        f"{res['statuses']}"
    )
    for count in workers:
        for top in tops:
            name = f"compute {count} top {top}"
            print(
                f"  workers {count} ({resolve(count)} threads), top {top}: {rate(name):.2f} GB/s (median; rounds: "
                f"{rates(name)}), {per_cpu(name):.2f} GB per CPU-second"
            )
    hint = (
        " (TENSOR_DEBUGGER_KERNEL=blocks measures reading arrays first, =numpy the numpy path)"
        if res["loop"] == "chunk loop"
        else ""
    )
    print(f"  statistics kernel: {res['kernel']}; chunks read by: {res['loop']}{hint}")
    print(
        f"peak RSS of the comparing child: {rss:.0f} MB (target: under {GIB / MB:.0f} MB, however large the runs); "
        f"child wall {wall:.1f} s with start-up"
    )
    print(
        f"the limit: the same arrays read in the same regions, without statistics, in the same rounds (1 thread, and "
        f"{threads} threads: an array at a time each)"
    )
    limits = {}
    for name, label in (
        ("one", "chunk reader into arrays, 1 thread"),
        ("n", f"chunk reader into arrays, {threads} threads"),
        ("loop one", "compiled chunk loop, decoding only, 1 thread"),
        ("loop n", f"compiled chunk loop, decoding only, {threads} threads"),
    ):
        limits[label] = rate(name)
        print(f"  {label}: {rate(name):.2f} GB/s (rounds: {rates(name)}), {per_cpu(name):.2f} GB per CPU-second")
    best = max(limits, key=limits.__getitem__)
    for count in workers:
        for top in tops:
            print(
                f"  comparison with {count} workers, top {top}, at "
                f"{100 * rate(f'compute {count} top {top}') / limits[best]:.0f}% of the best of these medians "
                f"({best}; target: at least 80% with every CPU)"
            )
    if len(workers) > 1 or len(tops) > 1:
        print(
            "\n| workers | threads | top | comparison GB/s (median) | rounds | GB per CPU-second | share of the limit "
            "| "
            f"time vs top {tops[0]} (median of per-round ratios) |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for count in workers:
            first = res[f"compute {count} top {tops[0]}"]
            for top in tops:
                name = f"compute {count} top {top}"
                ratio = median([r["s"] / f["s"] for r, f in zip(res[name], first, strict=True)])
                print(
                    f"| {count} | {resolve(count)} | {top} | {rate(name):.2f} | {rates(name)} | {per_cpu(name):.2f} | "
                    f"{100 * rate(name) / limits[best]:.0f}% | {100 * (ratio - 1):+.1f}% |"
                )
    _, _, raw = child("zarr", data, session_id, 1, str(max(workers)), "")
    print(
        f"for context, zarr's own reads of the same arrays, 16 chunks at a time: {gb / raw['one']['s']:.2f} GB/s on "
        f"1 thread, {gb / raw['n']['s']:.2f} GB/s on {raw['threads']} threads"
    )


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
    cmd = [
        str(CLI),
        "--data-dir",
        str(data),
        "--workers",
        str(max(args.workers)),
        "serve",
        "--port",
        str(port),
        "--no-demo",
    ]
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
            print(
                f"  the server's worker finished the pairs (pair {pair['id']}: {rows} x {cols}, "
                f"{pair['status']}) {time.perf_counter() - started:.1f} s after start (start-up included)"
            )
            rng, url = random.Random(args.seed), f"/api/pairs/{pair['id']}/slice?"
            for kind, two_d in (("1-D window of 64", False), ("2-D window of 64 x 64", True)):
                queries = [
                    f"index=:,:&start={rng.randrange(rows - 63)},{rng.randrange(cols - 63)}&count=64,64"
                    if two_d
                    else f"index={rng.randrange(rows)},:&start={rng.randrange(cols - 63)}&count=64"
                    for _ in range(args.requests + 1)
                ]
                (first, *_), _ = time_requests(client, url, queries[:1])
                ms, sizes = time_requests(client, url, queries[1:])
                p50, p99 = (ms[max(0, math.ceil(q * len(ms)) - 1)] for q in (0.5, 0.99))  # nearest rank
                print(
                    f"  slice, {kind}: {len(ms)} requests after one warm-up of {first:.1f} ms, JSON responses of "
                    f"{min(sizes)}-{max(sizes)} B: p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {ms[-1]:.1f} ms "
                    f"(targets: p50 under 10 ms, p99 under 50 ms)"
                )
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
    p.add_argument(
        "--rounds", type=int, default=3, help="rounds of comparing and reading (default 3): the medians are reported"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--noise",
        type=float,
        default=0.0,
        help="relative noise on every candidate value, e.g. 0.004 "
        "for bfloat16-like differences (default 0: only the planted difference)",
    )
    p.add_argument(
        "--growing",
        type=float,
        default=0.0,
        help="a difference growing linearly along each candidate tensor from 0 to this, e.g. 0.01: every sub-block "
        "holds new largest differences, the worst elements' costliest case (default 0)",
    )
    p.add_argument("--keep", action="store_true", help="keep the generated dumps and data dir")
    p.add_argument(
        "--workdir",
        type=Path,
        help=f"folder for dumps and data (default: a new temp dir under {DEFAULT_WORKDIR_PARENT})",
    )
    p.add_argument(
        "--workers",
        type=worker_counts,
        default=[0],
        help="TENSOR_DEBUGGER_WORKERS of the comparison, "
        "or a list such as 1,2 to compare with each, in the same rounds, side by side (default 0: one "
        "thread per CPU available to the process)",
    )
    p.add_argument(
        "--top",
        type=lambda text: [int(k) for k in text.split(",")],
        default=[],
        help="worst elements kept per pair (TENSOR_DEBUGGER_TOP), or a list such as 0,8 to measure each in the same "
        "rounds, side by side (default: the setting's)",
    )
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)  # internal: MODE ARGS...
    return p.parse_args()


def main() -> int:
    args = parse_args()
    if args.child:
        mode, folder, *rest = args.child
        if mode == "dump":
            write_runs(Path(folder), int(rest[0]), int(rest[1]), int(rest[2]), float(rest[3]), float(rest[4]))
        else:
            tops = [int(k) for k in rest[3].split(",")] if len(rest) > 3 and rest[3] else []
            measure(mode, Path(folder), int(rest[0]), int(rest[1]), worker_counts(rest[2]), tops)
        return 0
    wall, rss, versions = run_child([sys.executable, "-c", BASELINE], child_env(KEPT))
    print(machine_line(versions.strip()))
    print(
        f"baseline child (import tensor_debugger.services, zarr; what a comparing child imports before it "
        f"works): {wall:.2f} s, peak RSS {rss:.0f} MB"
    )
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
            throughput(data, session_id, args.rounds, args.workers, args.top)
            session_id = session_id if min(tensor_bytes, per_run) >= slice_bytes else None  # its pair 0 will do
        if not args.skip_slices:
            slices(
                data,
                session_id or make_session(data, work / "slice-dump", "bench-slices", slice_bytes, slice_bytes, args),
                args,
            )
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
