"""Benchmark what recording each module input's parameter costs a capture: `live/parameters.forward_parameters`,
read once per module (by path) during a capture, and the `tensors.parameter` column it fills.

    python bench/module_parameters.py              # GPT-2 small (12 layers, hidden 768, random weights), 256 tokens
    python bench/module_parameters.py --reads 20

An op capture with `values="summary"` of the model into a new data dir, then: the module inputs stored and how many
have a parameter, the signatures read (one per module path), the CPU of reading every module's signature
(`time.process_time`, this process, `--reads` times over, per read), against the capture's own CPU, and the bytes the
column holds. Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from harness import machine_line
from sqlalchemy import select
from tensor_debugger import capture
from tensor_debugger.live.parameters import forward_parameters
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import TensorRecord
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=10, help="times every module's signature is read (default 10)")
    reads = parser.parse_args().reads
    print(machine_line(f"torch {torch.__version__}, transformers {transformers.__version__}"))
    torch.manual_seed(0)
    make_config: Callable[..., Any] = GPT2Config  # typed in some transformers releases, not in others
    make_model: Callable[..., torch.nn.Module] = GPT2LMHeadModel
    model = make_model(make_config(n_layer=12, n_embd=768, n_head=12, n_positions=256, vocab_size=50257)).eval()
    ids = torch.randint(0, 50257, (1, 256), generator=torch.Generator().manual_seed(1))
    modules = [m for _, m in model.named_modules()]
    with tempfile.TemporaryDirectory() as folder:
        settings = Settings(data_dir=Path(folder) / "data")
        started = time.process_time()
        with (
            torch.no_grad(),
            capture(model, "gpt2", "run", data_dir=settings.data_dir, level="op", values="summary") as result,
        ):
            model(ids)
        capture_cpu = time.process_time() - started
        services = open_services(settings)
        try:
            with services.sessions() as db:
                rows = db.execute(
                    select(TensorRecord.module_path, TensorRecord.place, TensorRecord.parameter).where(
                        TensorRecord.run_id == result.run_id
                    )
                ).all()
        finally:
            services.close()
    inputs = [(path, place, p) for path, place, p in rows if (place or "").startswith("inputs")]
    bound = [p for _, _, p in inputs if p is not None]
    unbound = sorted(
        {
            f"{type(model.get_submodule(path.partition('.')[2])).__name__} {place}"
            for path, place, p in inputs
            if p is None
        }
    )
    started = time.process_time()
    for _ in range(reads):
        for module in modules:
            forward_parameters(module)
    per_read = (time.process_time() - started) / (reads * len(modules))
    print(f"tensors stored: {len(rows)}; module inputs: {len(inputs)}, {len(bound)} with a parameter")
    print(f"modules: {len(modules)} (a capture reads each one's signature once): {per_read * 1e6:.1f} us CPU a read,")
    print(
        f"  {per_read * len(modules) * 1e3:.2f} ms CPU for all, {100 * per_read * len(modules) / capture_cpu:.2f}% "
        f"of the capture's {capture_cpu:.2f} s CPU"
    )
    print(f"parameter column: {sum(len(p) for p in bound)} bytes of text over {len(bound)} rows")
    print(f"inputs without one (module class, place): {', '.join(unbound) or 'none'}")


if __name__ == "__main__":
    main()
