"""float32_shortest against the reference it replaced, over many float32 bit patterns."""

from __future__ import annotations

import math
import random
import struct

import pytest

from shardcat.formats.base import float32_shortest

_F32 = struct.Struct("<f")
_BITS = struct.Struct("<I")


def reference(value: float) -> float:
    """The implementation before the speed-up: up to four format/parse round trips."""
    if value.is_integer() or not math.isfinite(value):
        return value
    for digits in (6, 7, 8, 9):
        text = float(f"{value:.{digits}g}")
        if _F32.unpack(_F32.pack(text))[0] == value:
            return text
    return value


def _f32(bits: int) -> float:
    return float(_F32.unpack(_BITS.pack(bits))[0])


def _round_trips(decimal: float, value: float) -> bool:
    return float(_F32.unpack(_F32.pack(decimal))[0]) == value


def _digits(value: float) -> int:
    return len(f"{value:.9e}".split("e")[0].replace("-", "").replace(".", "").rstrip("0"))


def _patterns() -> list[int]:
    rng = random.Random(12)
    bits = [rng.getrandbits(32) for _ in range(200_000)]
    bits += [m for m in range(0, 1 << 23, 211)]  # subnormals (exponent field 0)
    bits += [(e << 23) | m for e in range(255) for m in (0, 1, 2, 0x7FFFFE, 0x7FFFFF)]
    bits += [0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0x80000000]  # inf, nan, -0
    return bits + [b | 0x80000000 for b in bits[-2000:]]


# Powers of two whose rounding interval is narrower below than above: the
# reference tries the nearest 8-digit decimal (below, outside), then 9 digits;
# the new function finds the 8-digit decimal above that also rounds back.
_SHORTER = {2.0**-96, -(2.0**-96)}


def test_same_as_reference_on_float32_bit_patterns() -> None:
    differ = []
    for bits in _patterns():
        value = _f32(bits)
        new, old = float32_shortest(value), reference(value)
        if math.isnan(value):
            assert math.isnan(new)
        elif new != old or math.copysign(1, new) != math.copysign(1, old):
            differ.append(value)
            assert _round_trips(new, value) and _digits(new) < _digits(old)
    assert set(differ) == _SHORTER


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        (0.967, 0.967),
        (0.1, 0.1),
        (3.1, 3.1),
        (-2.5e-7, -2.5e-7),
        (1e-45, 1.4013e-45),
        (16777216.0, 16777216.0),
        (3.4028234663852886e38, 3.4028234663852886e38),
    ],
)
def test_values_users_type(given: float, stored: float) -> None:
    assert float32_shortest(_F32.unpack(_F32.pack(given))[0]) == stored


def test_specials_unchanged() -> None:
    assert float32_shortest(math.inf) == math.inf
    assert float32_shortest(-math.inf) == -math.inf
    assert math.isnan(float32_shortest(math.nan))
    assert math.copysign(1, float32_shortest(-0.0)) == -1
