"""What relating a loop over heads to one batched attention by values costs (engine/head_slices.relate): GPT-2
small's shapes (12 heads of 64, 256 tokens, batch 1), the reference's batched tensors of one attention call against
the candidate's per-head ops, every head right (the worst case: every op checked, none stops it early).

    python bench/head_slices.py
    python bench/head_slices.py --tokens 512 --rounds 3

Prints the slices compared, the elements read and the CPU seconds of this process (medians). Nothing asserts.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
from harness import machine_line
from numpy.typing import NDArray
from tensor_debugger.engine.head_slices import BUDGET, relate


def _case(
    tokens: int, heads: int = 12, width: int = 64
) -> tuple[list[tuple[str, NDArray[Any]]], list[tuple[str, NDArray[Any]]]]:
    rng = np.random.default_rng(0)
    d = heads * width
    q, k, v = (rng.standard_normal((1, tokens, d)) for _ in range(3))
    qh, kh, vh = (x.reshape(1, tokens, heads, width).transpose(0, 2, 1, 3) for x in (q, k, v))
    scores = qh @ kh.transpose(0, 1, 3, 2) / width**0.5
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = weights @ vh
    reference = [("q", q), ("k", k), ("v", v), ("qh", qh), ("kh", kh), ("vh", vh), ("scores", scores)]
    reference += [("weights", weights), ("out", out), ("joined", out.transpose(0, 2, 1, 3).reshape(1, tokens, d))]
    candidate: list[tuple[str, NDArray[Any]]] = []
    for h in range(heads):
        s = slice(h * width, (h + 1) * width)
        candidate += [(f"a/getitem#{3 * h + 1}_outputs", q[..., s]), (f"a/getitem#{3 * h + 2}_outputs", k[..., s])]
        candidate += [(f"a/getitem#{3 * h + 3}_outputs", v[..., s]), (f"a/div#{h + 1}_outputs", scores[:, h])]
        candidate += [(f"a/softmax#{h + 1}_outputs", weights[:, h]), (f"a/matmul#{h + 1}_outputs", out[:, h])]
    return reference, candidate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(machine_line(f"numpy {np.__version__}"))
    reference, candidate = _case(args.tokens)
    seconds = []
    for _ in range(args.rounds):
        start = time.process_time()
        found = relate(reference, candidate, lambda a, b: bool(np.allclose(b, a)))
        seconds.append(time.process_time() - start)
    print(
        f"{len(candidate)} per-head ops, {len(reference)} batched tensors, {args.tokens} tokens: "
        f"{found.compared} slices compared, {len(found.matched)} matched, first unmatched "
        f"{found.first.candidate if found.first else None}, cut by the budget ({BUDGET:,} elements): {found.cut}; "
        f"CPU {statistics.median(seconds):.3f} s (median of {args.rounds})"
    )


if __name__ == "__main__":
    main()
