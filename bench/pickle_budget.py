"""Benchmark of the pickle pre-check (ingest/pickle_budget.py) on the data.pkl of a torch.save'd state dict.

    python bench/pickle_budget.py
    python bench/pickle_budget.py --tensors 300 20000 --repeats 5
    git show REV:server/tensor_debugger/ingest/pickle_budget.py > /tmp/before.py
    python bench/pickle_budget.py --against /tmp/before.py    # another version of the module, side by side

For each size: `check_pickles` over the pickle's bytes (the pre-check that refuses a pickle bomb before anything is
unpickled), beside the restricted unpickler's own load of the same bytes (pth_files' `_Unpickler`, what reading the
file costs anyway) and `check_reach` of what it returned; each as ms per 1,000 tensors, the best of `--repeats`.
With `--against FILE`, that file's `check_pickles` too, in the same process on the same bytes (on a shared machine
only figures taken side by side compare).
Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import sys
import time
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from harness import machine_line
from tensor_debugger.ingest.pickle_budget import check_pickles, check_reach
from tensor_debugger.ingest.pth_files import _globals, _Unpickler


def data_pkl(tensors: int) -> bytes:
    """The data.pkl torch.save writes for a state dict of `tensors` small tensors named as a transformer's."""
    state = OrderedDict((f"model.layers.{i // 8}.block_{i % 8}.weight", torch.zeros(2, 2)) for i in range(tensors))
    buffer = io.BytesIO()
    torch.save(state, buffer)
    with zipfile.ZipFile(buffer) as archive:
        [name] = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        return archive.read(name)


def other_version(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("pickle_budget_against", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def best(repeats: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", type=int, nargs="+", default=[300, 2000, 20000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--against", type=Path, help="another pickle_budget.py, timed beside this one")
    args = parser.parse_args()
    other = other_version(args.against) if args.against else None
    print(machine_line(f"torch {torch.__version__}"))
    against = f" {'against':>9}" if other else ""
    print(
        f"{'tensors':>8} {'pickle KiB':>10}{against} {'check_pickles':>14} {'unpickle':>9} {'check_reach':>12}"
        "  (ms per 1k tensors)"
    )
    allowed = _globals()
    for n in args.tensors:
        pkl = data_pkl(n)
        loaded = _Unpickler(io.BytesIO(pkl), allowed).load()
        per_k = 1000 / n * 1000  # seconds for n tensors -> ms per 1,000 tensors
        before = ""
        if other is not None:
            before = f" {best(args.repeats, lambda: other.check_pickles(io.BytesIO(pkl))) * per_k:>9.1f}"  # noqa: B023
        pre = best(args.repeats, lambda: check_pickles(io.BytesIO(pkl))) * per_k  # noqa: B023
        load = best(args.repeats, lambda: _Unpickler(io.BytesIO(pkl), allowed).load()) * per_k  # noqa: B023
        reach = best(args.repeats, lambda: check_reach(loaded)) * per_k  # noqa: B023
        print(f"{n:>8} {len(pkl) / 1024:>10.0f}{before} {pre:>14.1f} {load:>9.1f} {reach:>12.1f}")


if __name__ == "__main__":
    main()
