"""Default tolerances: torch.testing's for the lower-precision dtype of a pair; exact for integers and bools.

A pair passes when every element satisfies |candidate - reference| <= atol + rtol * |reference| (the
torch.isclose rule, with the reference as `other`) and no element is NaN.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float

    def __post_init__(self) -> None:
        if not (self.rtol >= 0 and self.atol >= 0):
            raise ValueError(f"tolerances must be non-negative numbers, got rtol={self.rtol} atol={self.atol}")


# torch.testing.assert_close's defaults; float8 and float4 (which it has none for) get about one unit in the
# last place of their mantissa.
_DEFAULTS: dict[str, Tolerance] = {
    "float64": Tolerance(1e-7, 1e-7),
    "complex128": Tolerance(1e-7, 1e-7),
    "float32": Tolerance(1.3e-6, 1e-5),
    "complex64": Tolerance(1.3e-6, 1e-5),
    "float16": Tolerance(1e-3, 1e-5),
    "complex32": Tolerance(1e-3, 1e-5),
    "bfloat16": Tolerance(1.6e-2, 1e-5),
    "float8_e4m3fn": Tolerance(0.125, 1e-3),
    "float8_e4m3fnuz": Tolerance(0.125, 1e-3),
    "float8_e5m2": Tolerance(0.25, 1e-3),
    "float8_e5m2fnuz": Tolerance(0.25, 1e-3),
    "float8_e8m0fnu": Tolerance(1.0, 0.0),
}
EXACT = Tolerance(0.0, 0.0)


def default_tolerance(dtype_a: str, dtype_b: str) -> Tolerance:
    """The looser of the two dtypes' defaults; exact when either is an integer, a bool or packed float4."""
    found = [_DEFAULTS.get(d) for d in (dtype_a, dtype_b)]
    if any(t is None for t in found):
        return EXACT
    return max((t for t in found if t is not None), key=lambda t: (t.rtol, t.atol))


def is_exact_dtype(dtype: str) -> bool:
    return dtype not in _DEFAULTS
