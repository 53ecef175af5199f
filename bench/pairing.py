"""Benchmark of pairing alone: two runs of `--tensors` tensors each, paired by the engine (no ingest, no store).

    python bench/pairing.py
    python bench/pairing.py --tensors 20000 --repeats 3

Scenarios, each a reference and a candidate of the same tensors under other names:
- dumps: `{layer}_{stage}` files on both sides (layer and stage pair them);
- state dicts: `a.layers.7.self_attn.q_proj.weight` against `b.model.layers.7.self_attn.q_proj.weight`
  (identities and normalised names);
- renamed: `layers.7.attention_out` against `layers.7.attn_out` and the like (fuzzy names);
- strangers: no name in common and every shape repeated, so every strategy runs over everything and nothing pairs.
Wall time of the best of `--repeats`, of `pair_runs` only. Nothing here asserts on timings; the target is under
2 s for 20,000 tensors per side.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from harness import machine_line
from tensor_debugger.engine.logical_tensors import TensorRef
from tensor_debugger.engine.pairing import pair_runs

STAGES = (
    "post_ln_pre_attn",
    "query",
    "key",
    "value",
    "post_attn",
    "post_attn_pre_resid",
    "pre_mlp",
    "post_mlp",
    "q_norm",
    "k_norm",
)
WEIGHTS = (
    ("self_attn.q_proj", "attn.q_proj"),
    ("self_attn.k_proj", "attn.k_proj"),
    ("self_attn.v_proj", "attn.v_proj"),
    ("self_attn.o_proj", "attn.o_proj"),
    ("mlp.gate_proj", "mlp.gate_projection"),
    ("mlp.up_proj", "mlp.up_projection"),
    ("mlp.down_proj", "mlp.down_projection"),
    ("input_layernorm", "input_norm"),
    ("post_attention_layernorm", "post_attention_norm"),
    ("attention_output", "attn_out"),
)


def refs(names: list[str], keyed: bool, shape: Callable[[int], tuple[int, ...]]) -> list[TensorRef]:
    made = []
    for i, name in enumerate(names):
        key = (name.split(".", 1)[1],) if keyed else ()
        layer = int(name.split("_", 1)[0]) if not keyed and name[0].isdigit() else None
        stage = name.split("_", 1)[1] if layer is not None else None
        made.append(TensorRef(i, name, shape(i), "float32", i, layer, stage, key))
    return made


def scenarios(n: int) -> dict[str, tuple[list[TensorRef], list[TensorRef]]]:
    layers = n // len(STAGES)
    dumps = [f"{layer}_{stage}" for layer in range(layers) for stage in STAGES]
    a_weights = [f"a.layers.{layer}.{old}.weight" for layer in range(layers) for old, _ in WEIGHTS]
    b_weights = [f"b.model.layers.{layer}.{old}.weight" for layer in range(layers) for old, _ in WEIGHTS]
    renamed = [f"layers.{layer}.{new}" for layer in range(layers) for _, new in WEIGHTS]
    original = [f"layers.{layer}.{old}" for layer in range(layers) for old, _ in WEIGHTS]

    def unique(i: int) -> tuple[int, ...]:
        return (i + 1,)

    def repeated(i: int) -> tuple[int, ...]:
        return (i % 2 + 1,)

    return {
        "dumps": (refs(dumps, False, unique), refs(list(reversed(dumps)), False, unique)),
        "state dicts": (refs(a_weights, True, repeated), refs(b_weights, True, repeated)),
        "renamed": (refs(original, False, repeated), refs(renamed, False, repeated)),
        "strangers": (
            refs([f"x{i}" for i in range(n)], False, repeated),
            refs([f"y{i}.z" for i in range(n)], False, repeated),
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tensors", type=int, default=20_000, help="tensors per side (default 20000)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(machine_line("tensor_debugger.engine.pairing"))
    for name, (a, b) in scenarios(args.tensors).items():
        best = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            pairing = pair_runs(a, b)
            best = min(best, time.perf_counter() - start)
        strategies = sorted({p.strategy.split()[0] for p in pairing.pairs})
        print(
            f"{name:12s} {len(a):>6} x {len(b):>6} tensors: {best:6.3f} s, {len(pairing.pairs)} pairs "
            f"({', '.join(strategies) or 'none'}), {len(pairing.unmatched_a)} + {len(pairing.unmatched_b)} "
            f"unmatched"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
