"""Benchmark `tensor-debugger ingest` on a generated dump: wall time, throughput, peak RSS, size on disk.

    python bench/ingest.py                      # 1 GiB of float32 .pth files, 64 MiB each
    python bench/ingest.py --size-gib 4 --tensor-mib 256 --dtype bfloat16 --format safetensors

The dump is written one tensor at a time (never held whole in memory) as `{layer}_{stage}.{pth,safetensors}`,
then ingested by the real CLI in a child process, so the peak RSS reported is the ingest process's own.
Nothing here asserts on timings; the numbers are for reading.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import zarr

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / ".venv" / "bin" / "tensor-debugger"
DEFAULT_WORKDIR_PARENT = ROOT / "bench-data"  # gitignored
STAGES = ("post_ln_pre_attn", "query", "key", "value", "post_attn", "post_attn_pre_resid", "pre_mlp", "post_mlp")
HIDDEN = 4096  # last dimension of every generated tensor
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MIB, GIB, MB = 1 << 20, 1 << 30, 1e6


def machine_line() -> str:
    cpu = "unknown CPU"
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo", encoding="utf-8") as f:
        ram_kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return (f"machine: {cpu}, {os.cpu_count()} cores, {ram_kib / (1 << 20):.1f} GiB RAM; "
            f"Python {platform.python_version()}, torch {torch.__version__}, zarr {zarr.__version__}")


def write_dump(folder: Path, size_bytes: int, tensor_bytes: int, dtype: torch.dtype, fmt: str,
               seed: int) -> tuple[int, int]:
    """Write tensors of (rows, HIDDEN) until `size_bytes` of payload; return (tensor count, payload bytes)."""
    from safetensors.torch import save_file

    itemsize = torch.empty((), dtype=dtype).element_size()
    row_bytes = HIDDEN * itemsize
    full_rows = max(1, tensor_bytes // row_bytes)
    generator = torch.Generator().manual_seed(seed)
    count = payload = 0
    while payload < size_bytes:
        rows = min(full_rows, -(-(size_bytes - payload) // row_bytes))
        layer, stage = divmod(count, len(STAGES))
        # activations: normal, with a scale that grows with depth as residual streams do
        t = (torch.randn(rows, HIDDEN, generator=generator) * (1.0 + 0.1 * layer)).to(dtype)
        path = folder / f"{layer}_{STAGES[stage]}.{fmt}"
        if fmt == "pth":
            torch.save(t, path)
        else:
            save_file({"activation": t}, str(path))
        payload += t.numel() * itemsize
        count += 1
        del t
    os.sync()  # let write-back finish so it does not run during the timed ingest
    return count, payload


def tree_bytes(folder: Path) -> tuple[int, int]:
    """(apparent bytes, allocated bytes on disk) of every file under `folder`."""
    apparent = allocated = 0
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            st = path.stat()
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return apparent, allocated


def run_child(cmd: list[str], env: dict[str, str]) -> tuple[int, float, float, str, str]:
    """Run `cmd`; return (exit code, wall seconds, peak RSS in MB, stdout, stderr). RSS from wait4: this child only."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return code, wall, usage.ru_maxrss * 1024 / MB, out.read().decode(), err.read().decode()


def child_env() -> dict[str, str]:
    """This environment without TENSOR_DEBUGGER_* settings, so --data-dir alone decides where data goes."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_DEBUGGER_")}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gib", type=float, default=1.0, help="total tensor payload in GiB (default 1)")
    p.add_argument("--tensor-mib", type=float, default=64.0, help="payload per tensor in MiB (default 64)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--format", choices=("pth", "safetensors"), default="pth")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="keep the generated dump and data dir")
    p.add_argument("--workdir", type=Path, help=f"folder for the dump and data dir (default: a new temp dir "
                   f"under {DEFAULT_WORKDIR_PARENT})")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    print(machine_line())
    if args.workdir is None:
        DEFAULT_WORKDIR_PARENT.mkdir(exist_ok=True)
        workdir, own_workdir = Path(tempfile.mkdtemp(prefix="ingest-", dir=DEFAULT_WORKDIR_PARENT)), True
    else:
        args.workdir.mkdir(parents=True, exist_ok=True)
        workdir, own_workdir = args.workdir.resolve(), False
    dump = Path(tempfile.mkdtemp(prefix="dump-", dir=workdir))
    data = Path(tempfile.mkdtemp(prefix="data-", dir=workdir))
    env = child_env()
    try:
        code, wall, rss, _, err = run_child([sys.executable, "-c", "import tensor_debugger.cli, torch, zarr"], env)
        if code != 0:
            print(f"baseline child failed (exit {code}):\n{err}", file=sys.stderr)
            return 1
        print(f"baseline (import tensor_debugger.cli, torch, zarr): {wall:.2f} s, peak RSS {rss:.0f} MB")

        started = time.perf_counter()
        count, payload = write_dump(dump, int(args.size_gib * GIB), int(args.tensor_mib * MIB),
                                    DTYPES[args.dtype], args.format, args.seed)
        dump_bytes, _ = tree_bytes(dump)
        print(f"dump: {count} {args.dtype} tensors of up to {args.tensor_mib:g} MiB as .{args.format}, "
              f"{dump_bytes / GIB:.3f} GiB ({dump_bytes / MB:.0f} MB) in files, payload {payload / MB:.0f} MB; "
              f"written in {time.perf_counter() - started:.1f} s")
        print("note: the dump was freshly written and synced, so it is read from the page cache (warm), "
              "not from disk")

        cmd = [str(CLI), "--data-dir", str(data), "ingest", "--session", "bench", "--run", "ref", str(dump), "--json"]
        print("command: " + " ".join(cmd))
        code, wall, rss, out, err = run_child(cmd, env)
        if code != 0:
            print(f"ingest failed (exit {code}):\nstdout: {out}\nstderr: {err}", file=sys.stderr)
            return 1
        result = json.loads(out.strip().splitlines()[-1])
        stored = result["run"]["tensors"]
        for problem in result["problems"]:
            print(f"problem: {problem}")
        data_apparent, data_allocated = tree_bytes(data)
        print(f"ingest: {stored} of {count} tensors stored in {wall:.2f} s wall (including process start-up)")
        print(f"throughput: {dump_bytes / MB / wall:.0f} MB/s of dump files")
        print(f"peak RSS of the ingest process: {rss:.0f} MB")
        print(f"data dir on disk: {data_allocated / MB:.0f} MB allocated ({data_apparent / MB:.0f} MB apparent), "
              f"{data_allocated / dump_bytes:.3f} x the dump")
        if args.keep:
            print(f"kept: dump in {dump}, data dir in {data}")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(dump, ignore_errors=True)
            shutil.rmtree(data, ignore_errors=True)
            if own_workdir:
                shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
