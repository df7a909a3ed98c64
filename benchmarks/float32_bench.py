"""float32_shortest before and after, side by side: ns per value, interleaved rounds.

``python -m benchmarks.float32_bench [--values N] [--rounds R]``. Two inputs:
random float32 bit patterns (most need 8-9 digits, like the ingest benchmark's
``score``) and values typed with 3 decimals (``0.967``). Prints the median ns
per value of each contender and the ratio new/old.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import struct
import time
from collections.abc import Callable

from shardcat.formats.base import float32_shortest

_F32 = struct.Struct("<f")


def before(value: float) -> float:
    """The implementation this replaced: up to four format/parse round trips."""
    if value.is_integer() or not math.isfinite(value):
        return value
    for digits in (6, 7, 8, 9):
        text = float(f"{value:.{digits}g}")
        if _F32.unpack(_F32.pack(text))[0] == value:
            return text
    return value


def _ns(fn: Callable[[float], float], values: list[float]) -> float:
    start = time.perf_counter_ns()
    for v in values:
        fn(v)
    return (time.perf_counter_ns() - start) / len(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--values", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(7)
    f32 = [
        float(_F32.unpack(struct.pack("<I", rng.getrandbits(32)))[0]) for _ in range(args.values)
    ]
    inputs = {
        "random float32": [v for v in f32 if math.isfinite(v)],
        "3 decimals": [
            _F32.unpack(_F32.pack(round(rng.random(), 3)))[0] for _ in range(args.values)
        ],
    }
    for name, values in inputs.items():
        times: dict[str, list[float]] = {"before": [], "after": []}
        for _ in range(args.rounds):  # interleaved, so both see the same machine
            times["before"].append(_ns(before, values))
            times["after"].append(_ns(float32_shortest, values))
        old, new = (statistics.median(times[k]) for k in ("before", "after"))
        print(f"{name:15s} before {old:6.0f} ns  after {new:6.0f} ns  after/before {new / old:.2f}")


if __name__ == "__main__":
    main()
