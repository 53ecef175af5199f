"""Benchmark `tensor-debugger ingest` on a generated dump: wall time, throughput, peak RSS, size on disk.

    python bench/ingest.py                      # 1 GiB of float32 .pth files, 64 MiB each
    python bench/ingest.py --size-gib 4 --tensor-mib 256 --dtype bfloat16 --format safetensors
    python bench/ingest.py --workers 1,2        # one ingest per worker count, side by side

The dump is written one tensor at a time (never held whole in memory) as `{layer}_{stage}.{pth,safetensors}`,
then ingested by the real CLI in a child process, so the peak RSS reported is the ingest process's own.
Nothing here asserts on timings; the numbers are for reading.

This process imports neither torch nor zarr, and writes the dump from a child of its own: a child started with
vfork (as subprocess does) reports max(its own peak RSS, its parent's peak RSS) as ru_maxrss, so a parent that
had held a generated tensor would inflate the number measured.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from harness import child_env, machine_line, resolve, run_child, worker_counts

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / ".venv" / "bin" / "tensor-debugger"
DEFAULT_WORKDIR_PARENT = ROOT / "bench-data"  # gitignored
STAGES = ("post_ln_pre_attn", "query", "key", "value", "post_attn", "post_attn_pre_resid", "pre_mlp", "post_mlp")
HIDDEN = 4096  # last dimension of every generated tensor
MIB, GIB, MB = 1 << 20, 1 << 30, 1e6


def write_dump(folder: Path, size_bytes: int, tensor_bytes: int, dtype_name: str, fmt: str, seed: int) -> None:
    """Write (rows, HIDDEN) tensors until `size_bytes` of payload, and one tiny tensor in `folder`.tiny (for the
    start-up measure); print {"count", "payload", "versions"} as JSON. Runs in a child process (see the module
    docstring)."""
    from importlib.metadata import version

    import torch
    from safetensors.torch import save_file

    def save(t: torch.Tensor, path: Path) -> None:
        if fmt == "pth":
            torch.save(t, path)
        else:
            save_file({"activation": t}, str(path))

    dtype = getattr(torch, dtype_name)
    row_bytes = HIDDEN * torch.empty((), dtype=dtype).element_size()
    full_rows = max(1, tensor_bytes // row_bytes)
    generator = torch.Generator().manual_seed(seed)
    count = payload = 0
    while payload < size_bytes:
        rows = min(full_rows, -(-(size_bytes - payload) // row_bytes))
        layer, stage = divmod(count, len(STAGES))
        # activations: normal, with a scale that grows with depth as residual streams do
        t = (torch.randn(rows, HIDDEN, generator=generator) * (1.0 + 0.1 * layer)).to(dtype)
        save(t, folder / f"{layer}_{STAGES[stage]}.{fmt}")
        payload += rows * row_bytes
        count += 1
        del t
    tiny = folder.with_suffix(".tiny")
    tiny.mkdir()
    save(torch.ones(16, 16, dtype=dtype), tiny / f"0_query.{fmt}")
    os.sync()  # let write-back finish so that it does not run during the timed ingest
    print(
        json.dumps(
            {"count": count, "payload": payload, "versions": f"torch {torch.__version__}, zarr {version('zarr')}"}
        )
    )


def tree_bytes(folder: Path) -> tuple[int, int]:
    """(apparent bytes, allocated bytes on disk) of every file under `folder`."""
    apparent = allocated = 0
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            st = path.stat()
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return apparent, allocated


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gib", type=float, default=1.0, help="total tensor payload in GiB (default 1)")
    p.add_argument("--tensor-mib", type=float, default=64.0, help="payload per tensor in MiB (default 64)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--format", choices=("pth", "safetensors"), default="pth")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="keep the generated dump and data dir")
    p.add_argument(
        "--workdir",
        type=Path,
        help=f"folder for the dump and data dir (default: a new temp dir under {DEFAULT_WORKDIR_PARENT})",
    )
    p.add_argument(
        "--workers",
        type=worker_counts,
        default=[0],
        help="TENSOR_DEBUGGER_WORKERS of the ingest, or "
        "a list such as 1,2 to ingest the dump once per value and print them side by side (default 0: "
        "one thread per CPU available to the process)",
    )
    p.add_argument("--write-dump", type=Path, help=argparse.SUPPRESS)  # internal: the generating child
    return p.parse_args()


def raw_write_mb_s(workdir: Path, nbytes: int) -> float:
    """Sequential 16 MiB writes of incompressible bytes, then fsync: what this disk takes at best."""
    block = os.urandom(16 * MIB)
    target = workdir / "raw-write-probe"
    started = time.perf_counter()
    with open(target, "wb") as out:
        for _ in range(max(1, nbytes // len(block))):
            out.write(block)
        out.flush()
        os.fsync(out.fileno())
    elapsed = time.perf_counter() - started
    written = target.stat().st_size
    target.unlink()
    return written / MB / elapsed


def main() -> int:
    args = parse_args()
    sizes = int(args.size_gib * GIB), int(args.tensor_mib * MIB)
    if args.write_dump is not None:
        write_dump(args.write_dump, *sizes, args.dtype, args.format, args.seed)
        return 0
    env = child_env()
    if args.workdir is None:
        DEFAULT_WORKDIR_PARENT.mkdir(exist_ok=True)
        workdir, own_workdir = Path(tempfile.mkdtemp(prefix="ingest-", dir=DEFAULT_WORKDIR_PARENT)), True
    else:
        args.workdir.mkdir(parents=True, exist_ok=True)
        workdir, own_workdir = args.workdir.resolve(), False
    dump = Path(tempfile.mkdtemp(prefix="dump-", dir=workdir))
    data = Path(tempfile.mkdtemp(prefix="data-", dir=workdir))
    try:
        gen = [
            sys.executable,
            __file__,
            "--write-dump",
            str(dump),
            "--size-gib",
            str(args.size_gib),
            "--tensor-mib",
            str(args.tensor_mib),
            "--dtype",
            args.dtype,
            "--format",
            args.format,
            "--seed",
            str(args.seed),
        ]
        wall, _, out = run_child(gen, env)
        written = json.loads(out)
        print(machine_line(written["versions"]))
        dump_bytes, _ = tree_bytes(dump)
        print(
            f"dump: {written['count']} {args.dtype} tensors of up to {args.tensor_mib:g} MiB as .{args.format}, "
            f"{dump_bytes / GIB:.3f} GiB ({dump_bytes / MB:.0f} MB) in files, payload "
            f"{written['payload'] / MB:.0f} MB; written in {wall:.1f} s"
        )
        print("note: the dump was freshly written (then synced), so ingest reads it from the page cache, not disk")

        print(
            f"workers: {', '.join(f'{w} ({resolve(w)} threads)' if not w else str(w) for w in args.workers)}; "
            f"this process may run on {len(os.sched_getaffinity(0))} CPUs"
        )
        tiny = [
            str(CLI),
            "--data-dir",
            str(data.with_suffix(".tiny")),
            "ingest",
            "--session",
            "bench",
            "--run",
            "ref",
            str(dump.with_suffix(".tiny")),
            "--json",
        ]
        startup, startup_rss, _ = run_child(tiny, env)
        print(
            f"start-up: the same command on one 16 x 16 tensor in the same format, into a new data dir, takes "
            f"{startup:.2f} s (peak RSS {startup_rss:.0f} MB)"
        )
        rows = []
        for workers in args.workers:
            shutil.rmtree(data, ignore_errors=True)
            cmd = [
                str(CLI),
                "--data-dir",
                str(data),
                "--workers",
                str(workers),
                "ingest",
                "--session",
                "bench",
                "--run",
                "ref",
                str(dump),
                "--json",
            ]
            print("command: " + " ".join(cmd))
            wall, rss, out = run_child(cmd, env)
            result = json.loads(out.strip().splitlines()[-1])
            data_apparent, data_allocated = tree_bytes(data)
            for problem in result["problems"]:
                print(f"problem: {problem}")
            print(
                f"ingest: {result['run']['tensors']} of {written['count']} tensors stored in {wall:.2f} s wall "
                f"(process start-up included)"
            )
            print(
                f"throughput: {dump_bytes / MB / wall:.0f} MB/s of dump files; "
                f"{dump_bytes / MB / max(wall - startup, 1e-9):.0f} MB/s without the {startup:.1f} s start-up"
            )
            print(f"peak RSS of the ingest process: {rss:.0f} MB")
            print(
                f"data dir on disk: {data_allocated / MB:.0f} MB allocated ({data_apparent / MB:.0f} MB apparent), "
                f"{data_allocated / dump_bytes:.3f} x the dump"
            )
            rows.append((workers, wall, rss))
        limit = raw_write_mb_s(workdir, data_allocated)
        print(
            f"the limit: plain sequential writes of the same {data_allocated / MB:.0f} MB to this disk "
            f"(fsync at the end) run at {limit:.0f} MB/s"
        )
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB
        print(f"(this bench process peaked at {own:.0f} MB, the floor of the peak RSS readings)")
        if len(rows) > 1:
            print(
                "\n| workers | threads | wall, start-up included | MB/s of dump files | without start-up | peak RSS |"
            )
            print("| --- | --- | --- | --- | --- | --- |")
            for workers, wall, rss in rows:
                print(
                    f"| {workers} | {resolve(workers)} | {wall:.2f} s | {dump_bytes / MB / wall:.0f} | "
                    f"{dump_bytes / MB / max(wall - startup, 1e-9):.0f} | {rss:.0f} MB |"
                )
        if args.keep:
            print(f"kept: dump in {dump}, data dir in {data}")
        return 0
    finally:
        if not args.keep:
            for folder in (dump, data, dump.with_suffix(".tiny"), data.with_suffix(".tiny")):
                shutil.rmtree(folder, ignore_errors=True)
            if own_workdir:
                shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
