"""Small helpers: timing medians, percentiles, silencing tfd-utils, result rows."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


def timed(fn: Callable[[], Any]) -> float:
    """Seconds one call of ``fn`` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_seconds(
    fn: Callable[[], Any], repeats: int, setup: Callable[[], Any] | None = None
) -> float:
    """Median wall time of ``fn`` over ``repeats`` runs (``setup`` runs untimed before each)."""
    times = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        times.append(timed(fn))
    return statistics.median(times)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence stdout at the file-descriptor level (tfd-utils prints, also in its workers)."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def tfd_reader(ds: Any, index_file: Any = None, **kwargs: Any) -> Any:
    """tfd-utils' reader over a benchmark dataset (its progress prints turned down)."""
    from tfd_utils import TFRecordRandomAccess

    return TFRecordRandomAccess(
        ds.glob, index_file=str(index_file or ds.tfd_index), progress_interval=10**9, **kwargs
    )


@dataclass
class Row:
    """One line of the results table: shardcat vs a competitor for one metric."""

    benchmark: str
    metric: str
    unit: str
    shardcat: float
    other_name: str
    other: float
    target: str = ""

    @property
    def ratio(self) -> float:
        return self.shardcat / self.other if self.other else float("nan")

    def show(self) -> str:
        return (
            f"  {self.metric}: shardcat {fmt(self.shardcat)} {self.unit} | "
            f"{self.other_name} {fmt(self.other)} {self.unit} | "
            f"ratio shardcat/{self.other_name} = {self.ratio:.3g}"
            + (f"  (target: {self.target})" if self.target else "")
        )


def fmt(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def markdown(rows: list[Row], header: str) -> str:
    lines = [
        header,
        "",
        "| benchmark | metric | shardcat | compared with | other | shardcat / other | target |",
        "| --- | --- | ---: | --- | ---: | ---: | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.benchmark} | {r.metric} | {fmt(r.shardcat)} {r.unit} | {r.other_name} "
            f"| {fmt(r.other)} {r.unit} | {r.ratio:.3g} | {r.target} |"
        )
    return "\n".join(lines) + "\n"
