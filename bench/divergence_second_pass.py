"""Benchmark what `find_divergence` costs where the summaries pass but content hashes differ: the second pass (full
values of the first changed tensor's module and the one before it) that decides whether it diverges.

    python bench/divergence_second_pass.py              # 2 linear layers of 256, 64 rows, CPU
    python bench/divergence_second_pass.py --runs 3

Three candidates against one reference (two linear layers with a relu between, seeded): one element of the output
moved by 1e-2 (the summaries' sampled elements miss it), one element moved by 1e-3 before the relu, and the
reference itself (bit-identical: no second pass). Each `find_divergence` runs after a warm-up call into the same
data dir, each into a session of its own name (the check for a taken name opens the data dir's database; a tree
before that check ran alike, into a session of a name not taken).
Printed per case: wall and CPU time (this process, all threads), the runs stored and the first divergence, with
whether the full values found it. Nothing asserts on timings.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
from harness import machine_line
from tensor_debugger import find_divergence
from torch import nn

WIDTH, ROWS, AT = 256, 64, 12345


class TwoLayers(nn.Module):
    def __init__(self, output_by: float = 0.0, hidden_by: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.output_by, self.hidden_by = output_by, hidden_by

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.hidden_by:
            h = h + (torch.arange(h.numel()).reshape(h.shape) == AT).to(h.dtype) * self.hidden_by
        y: torch.Tensor = self.b(torch.relu(h))
        if self.output_by:
            y = y + (torch.arange(y.numel()).reshape(y.shape) == AT).to(y.dtype) * self.output_by
        return y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="timed calls per case (the median is printed)")
    args = parser.parse_args()
    print(machine_line(f"torch {torch.__version__}"))
    print(f"load average {os.getloadavg()[0]:.1f} (1 minute) at the start")
    x = torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(0))
    reference = TwoLayers().eval()
    cases = {
        "one element 1e-2 off at the output": TwoLayers(output_by=1e-2),
        "one element 1e-3 off before the relu": TwoLayers(hidden_by=1e-3),
        "no bug (bit-identical)": TwoLayers(),
    }
    for name, candidate in cases.items():
        data_dir = tempfile.mkdtemp(prefix="divergence-second-pass-")
        find_divergence(reference, candidate.eval(), x, session="warm-up", data_dir=data_dir)
        walls, cpus = [], []
        for run in range(args.runs):
            wall, cpu = time.perf_counter(), time.process_time()
            found = find_divergence(reference, candidate, x, session=f"case {run}", data_dir=data_dir)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        first = found.first
        said = (
            "none"
            if first is None
            else f"{first.reference} ({'full values' if getattr(first, 'by_full', False) else 'summaries'})"
        )
        print(
            f"{name}: {statistics.median(walls):.2f} s wall, {statistics.median(cpus):.2f} s CPU; "
            f"{len(found.runs)} runs stored; first divergence {said}"
        )


if __name__ == "__main__":
    main()
