"""Benchmark what finding a module's caller costs a capture: `live/ops.module_caller`, the line that called a module
(its inputs' source), looked up once per recorded module call, from a forward pre-hook as the capture's is.

    python bench/module_callers.py                 # a tiny Llama (transformers), 50 forwards
    python bench/module_callers.py --forwards 200

One torch thread, no grad; CPU (`time.process_time`, this process), which a busy machine disturbs less than wall
time. Prints the lookups, CPU per lookup, and their share of the forwards' CPU with the hook in place (the hook alone
does nothing else, so a capture, whose hooks copy or summarise every tensor, spends a smaller share). Nothing here
asserts on timings.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import transformers
from harness import machine_line
from tensor_debugger.live.ops import module_caller, user_code_skips

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.traces import input_ids, tiny_llama  # noqa: E402 (the repository's root, put on the path above)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forwards", type=int, default=50)
    forwards = parser.parse_args().forwards
    torch.set_num_threads(1)
    model = tiny_llama()
    skip = user_code_skips()
    spent = [0.0, 0]

    def pre(_: torch.nn.Module, __: Any) -> None:
        frame: FrameType = sys._getframe(0)
        start = time.process_time()
        module_caller(frame, skip)
        spent[0] += time.process_time() - start
        spent[1] += 1

    for module in model.modules():
        module.register_forward_pre_hook(pre)
    ids = input_ids()
    with torch.no_grad():
        for _ in range(3):
            model(ids)
        spent[:] = [0.0, 0]
        start = time.process_time()
        for _ in range(forwards):
            model(ids)
        total = time.process_time() - start
    print(machine_line(f"torch {torch.__version__}, transformers {transformers.__version__}"))
    calls = int(spent[1])
    print(
        f"tiny Llama, {forwards} forwards: {calls} module_caller lookups, {spent[0] * 1e6 / calls:.1f} us CPU each, "
        f"{spent[0]:.4f} s of {total:.3f} s CPU ({100 * spent[0] / total:.1f}% of the hooked forwards)"
    )


if __name__ == "__main__":
    main()
