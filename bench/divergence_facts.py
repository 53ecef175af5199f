"""What the session's report spends on the facts of its first divergence that find_divergence's answer says too
(compare/reports/before_divergence.py: the candidate's tensors recorded early, the reference's tensor holding what
the candidate's holds, what only find_divergence can check, whether the models' outputs agree), against the whole
report, with the first divergence in the last of L residual blocks (every row of both runs before it).

    python bench/divergence_facts.py                       # L = 48, 192, 768
    python bench/divergence_facts.py --layers 96 --repeats 5

Each session is two summary op captures (`values="summary"`) of a seeded `ResidualStack` (demo/models.py), the
candidate's bug planted in its last block, planned and compared by the library into a fresh SQLite data dir. The
report is `session_pairs` (what the session page and the pairs API read); the facts are timed alone on the same
first divergence. CPU seconds of this process (`time.process_time`), the median of the repeats.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tensor_debugger import capture
from tensor_debugger.compare.reports.before_divergence import (
    held_before_of,
    model_checks,
    outputs_agree,
    recorded_early,
)
from tensor_debugger.compare.reports.pair_reports import session_pairs
from tensor_debugger.demo.models import ResidualStack
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings

sys.path.insert(0, str(Path(__file__).parent))
from harness import machine_line  # noqa: E402 (bench/ is no package)

HIDDEN = 32


def cpu_median(work: Callable[[], object], repeats: int) -> float:
    """The median CPU seconds of `work` over `repeats` calls."""
    spent = []
    for _ in range(repeats):
        start = time.process_time()
        work()
        spent.append(time.process_time() - start)
    return statistics.median(spent)


def measure(layers: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "data"
        x = torch.randn(1, 8, HIDDEN, generator=torch.Generator().manual_seed(1))
        for run, bug in (("reference", False), ("candidate", True)):
            model = ResidualStack(layers, HIDDEN, bug=bug).eval()
            with torch.no_grad(), capture(model, "facts", run, data_dir=data, level="op", values="summary") as done:
                model(x)
        assert done.session_id is not None
        services = open_services(Settings(data_dir=data, demo=False))
        try:
            services.plan(done.session_id)
            services.compute(done.session_id)
            with services.sessions() as db:
                report = session_pairs(db, done.session_id)
                first = report.first_divergence
                assert first is not None, "no first divergence"
                mine = [p for p in report.pairs if p.b.run_id == report.pairs[-1].b.run_id]
                at = next(k for k, p in enumerate(mine) if p.id == first.pair_id)
                whole = cpu_median(lambda: session_pairs(db, done.session_id), repeats)
                early = cpu_median(lambda: recorded_early(db, mine, at, ()), repeats)
                held = cpu_median(lambda: held_before_of(db, mine[at]), repeats)
                checks = cpu_median(lambda: model_checks(mine[at], first.first_changed, first.lowered_first), repeats)
                agree = cpu_median(lambda: outputs_agree(db, mine, []), repeats)
        finally:
            services.close()
        print(
            f"L={layers}: {len(report.pairs)} pairs, first divergence {first.name} (pair {at + 1} of {len(mine)}); "
            f"report {whole * 1e3:.1f} ms CPU; of which candidate_early_before {early * 1e3:.2f} ms, "
            f"candidate_holds {held * 1e3:.2f} ms, find_divergence_checks {checks * 1e3:.3f} ms, outputs_agree "
            f"{agree * 1e3:.2f} ms ({(early + held + checks + agree) / whole:.1%} of the report)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="48,192,768", help="comma-separated block counts")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(machine_line(f"torch {torch.__version__}"))
    with open("/proc/loadavg", encoding="utf-8") as f:
        print(f"load average at start: {f.read().split()[0]}")
    for layers in (int(n) for n in args.layers.split(",")):
        measure(layers, args.repeats)


if __name__ == "__main__":
    main()
