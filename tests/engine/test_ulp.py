"""ULP tolerances: the spacing of each float dtype as torch steps it, and the rule in both statistics paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensor_debugger.engine.fused import configure
from tensor_debugger.engine.pair_accumulator import PairAccumulator
from tensor_debugger.engine.tolerances import Tolerance, lower_precision, ulp_bound

BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
DTYPES = ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"]


def one_up(x: torch.Tensor) -> torch.Tensor:
    """The next representable value above each |x| in x's dtype (one more in its bits)."""
    return (x.abs().view(BITS[x.element_size()]) + 1).view(x.dtype)


@pytest.mark.parametrize("name", DTYPES)
def test_one_ulp_is_the_step_to_the_next_value_of_the_dtype(name: str) -> None:
    dtype = getattr(torch, name)
    info = torch.finfo(dtype)
    x = torch.tensor([0.0, info.tiny / 4, info.tiny, 1.0, 1.5, 3.0, 100.0, -2.5, info.max / 2], dtype=torch.float64)
    x = x.to(dtype)
    step = (one_up(x).double() - x.abs().double()).numpy()
    assert np.array_equal(ulp_bound(np.abs(x.double().numpy()), name, 1), step)
    assert np.array_equal(ulp_bound(np.abs(x.double().numpy()), name, 3), 3 * step)


def test_the_lower_precision_dtype_is_the_coarser() -> None:
    assert lower_precision("float32", "bfloat16") == "bfloat16"
    assert lower_precision("float16", "bfloat16") == "bfloat16"
    assert lower_precision("float8_e4m3fn", "float8_e5m2") == "float8_e5m2"
    assert lower_precision("float64", "float32") == "float32"


@pytest.mark.parametrize("kernel", ["compiled", "numpy"])
@pytest.mark.parametrize("name", DTYPES)
def test_values_one_ulp_apart_pass_with_one_ulp_and_two_apart_do_not_with_tight_tolerances_neither(
    kernel: str, name: str
) -> None:
    dtype = getattr(torch, name)
    a = (torch.linspace(-3, 3, 5001, dtype=torch.float64)).to(dtype)
    sign = torch.where(a.double() >= 0, 1.0, -1.0).double()
    b, two = (sign * one_up(a).double()).to(dtype), (sign * one_up(one_up(a)).double()).to(dtype)
    wide = np.float32 if name != "float64" else np.float64
    ref, cand, far = (t.to(torch.float64).numpy().astype(wide) for t in (a, b, two))
    configure(kernel=kernel)
    try:
        for candidate, ulps, outside in ((cand, 1, 0), (far, 1, ref.size), (far, 3, 0)):  # 2 up: 3 across a binade
            accumulator = PairAccumulator(Tolerance(0.0, 0.0, ulps, name), False)
            accumulator.add(ref, candidate, (0,), ref.shape)
            stats = accumulator.result()
            assert stats.mismatched == outside and stats.ulp == ulps and stats.ulp_dtype == name
        tight = PairAccumulator(Tolerance(0.0, 0.0), False)
        tight.add(ref, cand, (0,), ref.shape)
        assert tight.result().mismatched == ref.size
    finally:
        configure()
