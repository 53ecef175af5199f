"""Default tolerances: torch.testing's for the lower-precision dtype of a pair; exact for integers and bools.

A pair passes when every element satisfies |candidate - reference| <= atol + rtol * |reference| (the
torch.isclose rule, with the reference as `other`) and no element is NaN. With a tolerance in ULPs instead, an
element passes when |candidate - reference| <= ulp * the spacing of the pair's lower-precision dtype at |reference|
(`ulp_bound`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

# Float formats' spacing: (significand bits with the implicit one, smallest normal exponent), as torch.finfo and
# ml_dtypes.finfo give them (eps = 2**(1 - bits), tiny = 2**exponent); a complex dtype's by its parts'.
_FORMATS: dict[str, tuple[int, int]] = {
    "float64": (53, -1022),
    "complex128": (53, -1022),
    "float32": (24, -126),
    "complex64": (24, -126),
    "float16": (11, -14),
    "complex32": (11, -14),
    "bfloat16": (8, -126),
    "float8_e4m3fn": (4, -6),
    "float8_e4m3fnuz": (4, -7),
    "float8_e5m2": (3, -14),
    "float8_e5m2fnuz": (3, -15),
}


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    ulp: int = 0  # above 0: the ULP rule instead of rtol and atol, in the spacing of `ulp_dtype`
    ulp_dtype: str = ""

    def __post_init__(self) -> None:
        if not (self.rtol >= 0 and self.atol >= 0):
            raise ValueError(f"tolerances must be non-negative numbers, got rtol={self.rtol} atol={self.atol}")
        if self.ulp < 0 or (self.ulp and self.ulp_dtype not in _FORMATS):
            raise ValueError(
                f"a tolerance in ULPs needs ulp >= 0 and a float dtype, got {self.ulp} of {self.ulp_dtype!r}"
            )

    def bound(self, magnitude: NDArray[Any]) -> NDArray[Any]:
        """The largest |difference| that passes, per element of |reference| `magnitude` (float64)."""
        if self.ulp:
            return ulp_bound(magnitude, self.ulp_dtype, self.ulp)
        return magnitude * self.rtol + self.atol

    def smallest_bound(self, magnitude: float) -> float:
        """`bound` at the smallest |reference| of a block: no bound in the block is below it (both rules grow with
        |reference|)."""
        return float(self.bound(np.array([magnitude]))[0])

    def describe(self) -> str:
        return f"{self.ulp} ULP of {self.ulp_dtype}" if self.ulp else f"rtol {self.rtol:g}, atol {self.atol:g}"


def ulp_bound(magnitude: NDArray[Any], dtype: str, count: int) -> NDArray[Any]:
    """`count` units in the last place of `dtype` at each |value| in `magnitude` (float64): the spacing from a value
    of that magnitude to the next one up, 2**(exponent - significand bits + 1), subnormals' spacing below the
    smallest normal. Infinity and NaN give NaN (no finite difference is within it)."""
    bits, smallest = _FORMATS[dtype]
    with np.errstate(invalid="ignore"):
        _, exponent = np.frexp(magnitude)  # magnitude = m * 2**exponent, 0.5 <= m < 1
        exponent = np.where(magnitude > 0, np.maximum(exponent - 1, smallest), smallest)  # zero: subnormals'
        spacing = np.ldexp(float(count), exponent - (bits - 1))
    return np.where(np.isfinite(magnitude), spacing, np.nan)


def lower_precision(dtype_a: str, dtype_b: str) -> str:
    """The float dtype of the two with the coarser spacing (fewer significand bits, then the narrower range)."""
    return max((dtype_a, dtype_b), key=lambda d: (-_FORMATS[d][0], _FORMATS[d][1]))


def real_float(dtype: str) -> bool:
    """Whether `dtype` is a real float dtype whose spacing is known (not an integer, a bool, or complex)."""
    return dtype in _FORMATS and not dtype.startswith("complex")


def less_precise(dtype: str, than: str) -> bool:
    """Whether `dtype` is a real float dtype with a coarser spacing than real float dtype `than` (fewer significand
    bits: the order of torch.finfo's eps): bfloat16 and float16 than float32, bfloat16 than float16. False for any
    other."""
    return real_float(dtype) and real_float(than) and _FORMATS[dtype][0] < _FORMATS[than][0]


def has_ulp(dtype: str) -> bool:
    """Whether ULP tolerances know the dtype's spacing."""
    return dtype in _FORMATS


# torch.testing.assert_close's defaults. torch.testing compares float8 bit for bit and takes no tolerance for it:
# here a float8 pair gets rtol of its format's epsilon (the spacing of values in [1, 2): 2**-3 with three mantissa
# bits, 2**-2 with two), so that neighbouring values of normal magnitude pass, and atol 1e-3 (README, "Verdicts";
# tests/cli/test_numerics_cli.py holds them to it). float8_e8m0fnu (powers of two) passes a factor of two.
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
