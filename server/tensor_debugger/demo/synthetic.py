"""Deterministic synthetic dumps (seeded), shared by the demo session, the tests and the benchmarks.

`write_dump` writes one run as `{layer}_{stage}.pth` files, the layout of the prototype's users. A planted
divergence adds `offset` at one index of one stage's tensor in one layer, and every later tensor in the
candidate carries a smaller echo of it, as a real bug would propagate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

STAGES = (
    "post_ln_pre_attn", "query", "query_final", "key", "key_final", "value", "value_final", "post_attn",
    "scaling", "sliding", "post_attn_pre_resid", "pre_mlp", "post_mlp",
)  # fmt: skip


@dataclass(frozen=True)
class Plant:
    layer: int
    stage: str
    index: tuple[int, ...]  # where the difference is largest, in the tensor's own coordinates
    offset: float


@dataclass(frozen=True)
class DumpShape:
    tokens: int = 16
    heads: int = 4
    head_dim: int = 8

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim


def stage_tensor(layer: int, stage: str, shape: DumpShape, seed: int) -> torch.Tensor | float:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + layer * 101 + STAGES.index(stage))
    if stage == "scaling":
        return 1.0 / math.sqrt(shape.head_dim)
    if stage == "sliding":
        return torch.tensor(4096)  # an int64 scalar tensor
    if stage in ("query", "key", "value", "query_final", "key_final", "value_final"):
        return torch.randn(1, shape.heads, shape.tokens, shape.head_dim, generator=generator)
    return torch.randn(shape.tokens, shape.hidden, generator=generator)


def write_dump(
    folder: Path,
    layers: int,
    seed: int = 0,
    plant: Plant | None = None,
    shape: DumpShape = DumpShape(),
    dtype: torch.dtype = torch.float32,
) -> list[Path]:
    """Write one run's dump into `folder`; the same seed gives the same values, with or without a plant."""
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    planted_at: int | None = None
    for layer in range(layers):
        for position, stage in enumerate(STAGES):
            value = stage_tensor(layer, stage, shape, seed)
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                value = value.to(dtype)
                if plant is not None and (layer, stage) == (plant.layer, plant.stage):
                    value[plant.index] += plant.offset
                    planted_at = layer * len(STAGES) + position
                elif plant is not None and planted_at is not None:
                    value.view(-1)[0] += plant.offset * 0.01  # the error carried forward
            path = folder / f"{layer}_{stage}.pth"
            torch.save(value, path)
            written.append(path)
    return written
