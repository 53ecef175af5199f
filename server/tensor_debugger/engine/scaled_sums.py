"""Sums of products that neither overflow nor underflow: a float64 mantissa with a separate power-of-two exponent.

A pair's cosine similarity and SNR come from sums of squares and a dot product. In plain float64, values past
about 1e154 square to infinity and values below about 1e-154 square to zero or to a few bits of a subnormal, so
x and -x of values ~1e200 came out with cosine 1.0 (inf / inf) and tiny tensors as if they were all zeros. Here a
sum is `mantissa * 2**exponent`: blocks whose plain sums are safely in range (most) are taken as they are
(exponent 0), the others are summed again with each side scaled by a power of two near its largest magnitude
(exact: only the exponent changes), and partial sums of blocks are added at the larger exponent, as plain float64
addition would add them, rounding once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

# Below this, a plain sum of squares may have lost more than rounding to squares under float64's smallest normal:
# a square under 2**-1022 is off by at most 2**-1075, and a sum of at least 2**-900 is then off by n * 2**-175
# of itself at most. Above it (and finite), a plain sum is as good as a scaled one.
SAFE_LOW = 2.0**-900


@dataclass(frozen=True)
class Scaled:
    """`mantissa * 2**exponent`; the mantissa is 0, in [0.5, 1) in magnitude, or not finite (a NaN or an Inf
    met)."""

    mantissa: float = 0.0
    exponent: int = 0

    @classmethod
    def of(cls, value: float, exponent: int = 0) -> Scaled:
        """`value * 2**exponent`, normalized."""
        if value == 0 or not math.isfinite(value):
            return cls(value, 0)
        mantissa, shift = math.frexp(value)
        return cls(mantissa, exponent + shift)

    def __add__(self, other: Scaled) -> Scaled:
        if other.mantissa == 0 or not math.isfinite(self.mantissa):
            return self
        if self.mantissa == 0 or not math.isfinite(other.mantissa):
            return other
        top = max(self.exponent, other.exponent)
        total = math.ldexp(self.mantissa, self.exponent - top) + math.ldexp(other.mantissa, other.exponent - top)
        return Scaled.of(total, top)

    def __float__(self) -> float:
        """The value in float64 (infinity past its range, zero below it)."""
        if not math.isfinite(self.mantissa):
            return self.mantissa
        try:
            return math.ldexp(self.mantissa, self.exponent)
        except OverflowError:
            return math.copysign(math.inf, self.mantissa)

    def divided(self, count: int) -> float:
        """The value divided by `count` (> 0), in float64."""
        return float(Scaled.of(self.mantissa / count, self.exponent))

    def is_zero(self) -> bool:
        return self.mantissa == 0


def safe(value: float) -> bool:
    """Whether a plain float64 sum of squares is as good as a scaled one: finite and not near underflow."""
    return SAFE_LOW <= value < math.inf


def products(x: NDArray[Any], y: NDArray[Any], norm_x: float, norm_y: float) -> tuple[Scaled, Scaled, Scaled]:
    """(the real part of sum(conj(x) * y), sum |x|**2, sum |y|**2) of finite float64 or complex128 vectors, exact up
    to rounding at any magnitude; `norm_x` and `norm_y` are the plain float64 sums of squares, taken where safe."""
    plain_x, plain_y = safe(norm_x), safe(norm_y)
    sum_x = Scaled.of(norm_x) if plain_x else sum_squares(x)
    sum_y = Scaled.of(norm_y) if plain_y else sum_squares(y)
    if plain_x and plain_y:
        return Scaled.of(real_dot(_conj(x), y)), sum_x, sum_y
    scale_x, scale_y = _scale(x), _scale(y)
    if scale_x is None or scale_y is None:
        return Scaled(), sum_x, sum_y  # a side of zeros
    dot = real_dot(_conj(_times_power_of_two(x, -scale_x)), _times_power_of_two(y, -scale_y))
    return Scaled.of(dot, scale_x + scale_y), sum_x, sum_y


def sum_squares(x: NDArray[Any], plain: float | None = None) -> Scaled:
    """sum(|x|**2) of float64 or complex128 values at any magnitude (infinity where one is infinite, NaN for a
    NaN); `plain`: the sum already computed in float64, taken where safe."""
    if plain is not None and safe(plain):
        return Scaled.of(plain)
    scale = _scale(x)
    if scale is None:
        return Scaled()
    sx = _times_power_of_two(x, -scale)
    return Scaled.of(real_dot(_conj(sx), sx), 2 * scale)


def cosine(dot: Scaled, norm_a: Scaled, norm_b: Scaled) -> float:
    """dot / sqrt(norm_a * norm_b), within [-1, 1]: 1 where both norms are zero (all zeros on both sides: identical),
    0 where one is. Exactly -1 for x and -x, and 0 for a dot product of zero, at any magnitude."""
    if norm_a.is_zero() and norm_b.is_zero():
        return 1.0
    if norm_a.is_zero() or norm_b.is_zero():
        return 0.0
    if not all(math.isfinite(s.mantissa) for s in (dot, norm_a, norm_b)):
        return math.nan
    product, exponent = norm_a.mantissa * norm_b.mantissa, norm_a.exponent + norm_b.exponent
    if exponent % 2:  # an even exponent, halved under the square root
        product, exponent = product * 2.0, exponent - 1
    value = math.ldexp(dot.mantissa / math.sqrt(product), dot.exponent - exponent // 2)
    return max(-1.0, min(1.0, value))


def decibels(signal: Scaled, noise: Scaled) -> float:
    """10 * log10(signal / noise): infinity for no noise, -infinity for no signal."""
    if noise.is_zero():
        return math.inf
    if signal.is_zero():
        return -math.inf
    if not (math.isfinite(signal.mantissa) and math.isfinite(noise.mantissa)):
        ratio = float(signal) / float(noise)
        return 10.0 * math.log10(ratio) if ratio > 0 else -math.inf if ratio == 0 else math.nan
    return 10.0 * (math.log10(signal.mantissa / noise.mantissa) + (signal.exponent - noise.exponent) * math.log10(2.0))


def _conj(x: NDArray[Any]) -> NDArray[Any]:
    return x.conj() if np.iscomplexobj(x) else x


def _scale(x: NDArray[Any]) -> int | None:
    """The power of two of x's largest magnitude (None where x is all zeros)."""
    if x.size == 0:
        return None
    top = float(np.max(np.abs(x)))
    if not math.isfinite(top):
        return 0  # an Inf or a NaN: the sums are not finite whatever the scale
    return math.frexp(top)[1] if top > 0 else None


def _times_power_of_two(x: NDArray[Any], power: int) -> NDArray[Any]:
    """x * 2**power, exactly (only the exponents change, but for values pushed under float64's smallest normal)."""
    if np.iscomplexobj(x):
        out = np.empty(x.shape, dtype=np.complex128)
        out.real, out.imag = np.ldexp(x.real, power), np.ldexp(x.imag, power)
        return out
    return np.asarray(np.ldexp(x, power))


def real_dot(x: NDArray[Any], y: NDArray[Any]) -> float:
    """The real part of sum(x * y), in one pass with no temporary; not BLAS, whose threads spin on the cores the
    comparison's own threads need."""
    return float(np.real(np.einsum("i,i->", x, y)))
