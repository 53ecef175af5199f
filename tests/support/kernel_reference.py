"""What the pair kernel (engine/fused_stats.c) must compute for a block, computed by numpy: the tests compare each
family's partial with it, element-wise fields exactly and sums to the last bits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray


def check_partial(
    got: Mapping[str, Any],
    a: NDArray[Any],
    b: NDArray[Any],
    atol: float,
    rtol: float,
    edges: NDArray[Any],
    where: object = None,
) -> None:
    """`got` (a partial's fields by name, at_least as a list) is numpy's result for flat blocks `a` and `b` (with the
    tolerance test and decade `edges`; its top_k worst elements where it kept any); `where` names the case in
    failures."""
    x, y = a.astype(np.float64), b.astype(np.float64)
    d = np.abs(x - y)
    rel = d[x != 0] / np.abs(x[x != 0])
    exact = {
        "max_abs": float(d.max(initial=-1.0)),
        "argmax": int(np.argmax(d)) if d.size else -1,
        "max_rel": float(rel.max(initial=0.0)),
        "rel_count": rel.size,
        "mismatched": int((d > np.abs(x) * rtol + atol).sum()),
        "nonzero": int((d > 0).sum()),
        "at_least": [int((d.astype(np.float32) >= edge).sum()) for edge in edges.astype(np.float32)],
    }
    for field, want in exact.items():
        assert got[field] == want, (where, field)
    top_k = int(got.get("top_k", 0))
    if top_k:  # the largest differences above zero, largest first, ties in position order: exactly
        order = np.lexsort((np.arange(d.size), -d))
        order = order[d[order] > 0][:top_k]
        n = int(got["top_n"])
        kept = sorted(
            zip(got["top_abs"][:n], got["top_at"][:n], got["top_a"][:n], got["top_b"][:n], strict=True),
            key=lambda e: (-e[0], e[1]),
        )
        want_worst = [(float(d[i]), int(i), float(x[i]), float(y[i])) for i in order]
        assert kept == want_worst, (where, "worst")
    sums = {
        "sum_abs": d.sum(),
        "sum_sq": (d * d).sum(),
        "sum_rel": rel.sum(),
        "dot": (x * y).sum(),
        "norm_a": (x * x).sum(),
        "norm_b": (y * y).sum(),
    }
    for field, value in sums.items():
        assert got[field] == pytest.approx(float(value), rel=1e-12), (where, field)


def pair_case(size: int, seed: int) -> tuple[NDArray[Any], NDArray[Any]]:
    """A reference and a candidate of `size` float64 values: magnitudes over nine decades, relative differences
    over nine more, a tenth of the references zero, and maybe ties for the largest difference."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(size) * 10.0 ** rng.uniform(-6, 3, size)
    b = a * (1 + 10.0 ** rng.uniform(-9, 0, size))
    a[rng.integers(0, size, max(1, size // 10))] = 0.0
    b[rng.integers(0, size, 3)] = a[0] + 1e3
    return a, b
