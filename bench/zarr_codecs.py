"""Measure candidate Zarr v3 codecs for storing activations: write and read speed and stored size.

    python bench/zarr_codecs.py              # about 256 MiB per case, best of 3
    python bench/zarr_codecs.py --mib 64     # quicker

Arrays are laid out as the app lays them out (tensor_debugger.engine.chunking): (rows, 4096) with chunks of about 1 MiB
spanning whole rows, written in blocks of 16 chunks (array_writer.CHUNKS_PER_BLOCK) and read back whole, into a
LocalStore on this machine's disk. Writes land in the page cache (no fsync; the store is synced before each
timed step so that earlier write-back does not compete) and reads come from it, so the numbers are the codec's
and zarr's cost, not the disk's. Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import torch
import zarr
from harness import machine_line
from numpy.typing import NDArray
from tensor_debugger.store.zarr_backend import DEFAULT_CODEC
from zarr.codecs import BloscCodec, ZstdCodec
from zarr.storage import LocalStore

ROOT = Path(__file__).resolve().parent.parent
WORKDIR_PARENT = ROOT / "bench-data"  # gitignored
HIDDEN = 4096
CHUNK_BYTES = 1 << 20
CHUNKS_PER_BLOCK = 16
MIB, MB = 1 << 20, 1e6
CODECS: dict[str, Any] = {
    "none": None,
    "blosc lz4 shuffle": BloscCodec(cname="lz4", clevel=1, shuffle="shuffle"),
    "blosc lz4 bitshuffle": BloscCodec(cname="lz4", clevel=1, shuffle="bitshuffle"),
    "blosc lz4 bitshuffle level 5": BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle"),
    "blosc lz4 bitshuffle level 9": BloscCodec(cname="lz4", clevel=9, shuffle="bitshuffle"),
    "blosc zstd bitshuffle": BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle"),
    "zstd 1": ZstdCodec(level=1),
}
DTYPES = ("float32", "bfloat16", "float16")


def make_data(dtype: str, mib: float, seed: int) -> NDArray[Any]:
    """Normal activations of about `mib` MiB as (rows, HIDDEN), in the dtype the store holds
    (bfloat16 as its raw uint16 bits, as the app stores it)."""
    itemsize = 4 if dtype == "float32" else 2
    rows = max(1, int(mib * MIB) // (HIDDEN * itemsize))
    t = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(seed))
    if dtype == "bfloat16":
        return t.to(torch.bfloat16).view(torch.int16).numpy().view("uint16")
    if dtype == "float16":
        return t.to(torch.float16).numpy()
    return t.numpy()


def stored_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def measure(root: Path, data: NDArray[Any], compressor: Any, repeats: int) -> tuple[list[float], list[float], int]:
    """Write and read seconds of each of `repeats` runs, and the stored size in bytes."""
    rows_per_chunk = max(1, CHUNK_BYTES // (HIDDEN * data.itemsize))
    step = rows_per_chunk * CHUNKS_PER_BLOCK
    store = LocalStore(root)
    writes: list[float] = []
    reads: list[float] = []
    size = 0
    for attempt in range(repeats):
        name = f"a{attempt}"
        os.sync()  # earlier runs' write-back must not compete with this one for the CPUs
        started = time.perf_counter()
        array = zarr.create_array(
            store,
            name=name,
            shape=data.shape,
            dtype=data.dtype,
            chunks=(rows_per_chunk, HIDDEN),
            compressors=compressor,
            fill_value=np.zeros((), dtype=data.dtype)[()],
        )
        for start in range(0, data.shape[0], step):
            array[start : start + step] = data[start : start + step]
        writes.append(time.perf_counter() - started)

        os.sync()
        started = time.perf_counter()
        back: NDArray[Any] = np.asarray(zarr.open_array(store, path=name, mode="r")[:])
        reads.append(time.perf_counter() - started)
        if attempt == 0:
            bits = f"u{data.itemsize}"
            if not np.array_equal(back.view(bits), data.view(bits)):
                sys.exit(f"read-back differs from what was written ({data.dtype}, {compressor})")
            size = stored_bytes(root / name)
        del back
        shutil.rmtree(root / name)
    return writes, reads, size


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=float, default=256.0, help="MiB of data per case (default 256)")
    p.add_argument("--repeats", type=int, default=3, help="runs per case; the best is reported (default 3)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> int:
    args = parse_args()
    print(machine_line(f"torch {torch.__version__}, zarr {zarr.__version__}, numcodecs {numcodecs.__version__}"))
    print(
        f"{args.mib:g} MiB per case, (rows, {HIDDEN}) arrays, ~{CHUNK_BYTES // MIB} MiB chunks written "
        f"{CHUNKS_PER_BLOCK} at a time, best of {args.repeats}; 1 MB = 1e6 bytes; "
        f"ratio = stored bytes / raw bytes; spread = slowest / fastest run, write and read; "
        f"* = tensor_debugger.store.zarr_backend.DEFAULT_CODEC"
    )
    print(f"{'dtype':<9} {'codec':<24} {'write MB/s':>10} {'read MB/s':>10} {'ratio':>6}  spread")
    default = DEFAULT_CODEC.to_dict()
    WORKDIR_PARENT.mkdir(exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="codecs-", dir=WORKDIR_PARENT))
    started = time.perf_counter()
    try:
        for dtype in DTYPES:
            data = make_data(dtype, args.mib, args.seed)
            for label, codec in CODECS.items():
                writes, reads, size = measure(workdir, data, codec, args.repeats)
                mark = "*" if codec is not None and codec.to_dict() == default else " "
                print(
                    f"{dtype:<9} {label + mark:<24} {data.nbytes / MB / min(writes):>10.0f} "
                    f"{data.nbytes / MB / min(reads):>10.0f} {size / data.nbytes:>6.3f}  "
                    f"x{max(writes) / min(writes):.1f} x{max(reads) / min(reads):.1f}",
                    flush=True,
                )
            del data
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
