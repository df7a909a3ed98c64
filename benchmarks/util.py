"""Small helpers: timing medians, percentiles, silencing tfd-utils, result rows."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any


def timed(fn: Callable[[], Any]) -> float:
    """Seconds one call of ``fn`` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def rotated(names: list[str], r: int) -> list[str]:
    """``names`` starting ``r`` later (round ``r`` of a rotating order: who goes first
    changes, so none always finds the caches the one before it warmed)."""
    return names[r % len(names) :] + names[: r % len(names)]


def round_robin_times(
    contenders: dict[str, Callable[[], Any]],
    repeats: int,
    before_each: Callable[[], Any] | None = None,
    *,
    rotate: bool = False,
) -> dict[str, list[float]]:
    """Seconds of every call per contender, running them in turn (A, B, C, A, B, C, ...).

    Interleaving makes a noisy neighbour slow every contender alike, so the
    ratios between them hold even when the absolute times wander.
    ``before_each`` runs (untimed) before every timed call. With ``rotate``,
    round ``r`` starts ``r`` contenders later (A, B, C, B, C, A, C, A, B, ...).
    """
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(repeats):
        order = rotated(names, r) if rotate else names
        for name in order:
            if before_each is not None:
                before_each()
            times[name].append(timed(contenders[name]))
    return times


def round_robin(
    contenders: dict[str, Callable[[], Any]],
    repeats: int,
    before_each: Callable[[], Any] | None = None,
    *,
    rotate: bool = False,
) -> dict[str, float]:
    """Median seconds per contender of :func:`round_robin_times`."""
    times = round_robin_times(contenders, repeats, before_each, rotate=rotate)
    return {name: statistics.median(t) for name, t in times.items()}


def spread(ours: Sequence[float], theirs: Sequence[float]) -> dict[str, Any]:
    """``rounds`` and ``spread`` of a :class:`Row`: the lowest and highest ratio
    ours / theirs over the rounds both ran in (round ``i`` of each)."""
    ratios = [a / b for a, b in zip(ours, theirs, strict=True) if b]
    low_high = (min(ratios), max(ratios)) if ratios else None
    return {"rounds": len(ratios), "spread": low_high}


def print_table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    """Print ``rows`` under ``header`` as left-aligned columns joined by `` | ``."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


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
    """One line of the results table: shardcat vs a competitor for one metric.

    A design target is either ``max_ratio`` (shardcat / other must not exceed
    it) or ``max_value`` (shardcat's own number, in ``unit``, must stay below).
    """

    benchmark: str
    metric: str
    unit: str
    shardcat: float
    other_name: str
    other: float
    max_ratio: float | None = None
    max_value: float | None = None
    rounds: int | None = None  # how many rounds the medians are of
    spread: tuple[float, float] | None = None  # lowest, highest ratio over the rounds

    @property
    def ratio(self) -> float:
        return self.shardcat / self.other if self.other else float("nan")

    @property
    def target(self) -> str:
        if self.max_ratio is not None:
            return f"ratio <= {self.max_ratio:.2g}"
        if self.max_value is not None:
            return f"shardcat < {fmt(self.max_value)} {self.unit}"
        return ""

    @property
    def met(self) -> str:
        if self.max_ratio is not None:
            return "yes" if self.ratio <= self.max_ratio else "**no**"
        if self.max_value is not None:
            return "yes" if self.shardcat < self.max_value else "**no**"
        return ""

    def show(self) -> str:
        verdict = f"  [target {self.target}: {self.met.strip('*')}]" if self.target else ""
        return (
            f"  {self.metric}: shardcat {fmt(self.shardcat)} {self.unit} | "
            f"{self.other_name} {fmt(self.other)} {self.unit} | "
            f"shardcat/other = {fmt_ratio(self.ratio)}{verdict}"
        )


def fmt(x: float) -> str:
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def fmt_ratio(x: float) -> str:
    if x < 0.1:
        return f"{x:.2g}"
    if x < 10:
        return f"{x:.2f}"
    return f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def markdown(rows: list[Row], header: str) -> str:
    """The rows as a markdown table (the benchmark's name only on its first row)."""
    lines = [
        header,
        "",
        "| benchmark | metric | shardcat | compared with | other | shardcat / other "
        "| target | met |",
        "| --- | --- | ---: | --- | ---: | ---: | --- | --- |",
    ]
    previous = None
    for r in rows:
        name = "" if r.benchmark == previous else f"**{r.benchmark}**"
        previous = r.benchmark
        lines.append(
            f"| {name} | {r.metric} | {fmt(r.shardcat)} {r.unit} | {r.other_name} "
            f"| {fmt(r.other)} {r.unit} | {fmt_ratio(r.ratio)} | {r.target} | {r.met} |"
        )
    return "\n".join(lines) + "\n"


DROP_CACHES = "/proc/sys/vm/drop_caches"


def drop_page_cache() -> None:
    """Empty the OS page cache (Linux, root), so the next run reads from storage."""
    os.sync()
    try:
        with open(DROP_CACHES, "w") as f:
            f.write("1\n")
    except OSError as exc:
        raise SystemExit(
            f"--cold needs to write {DROP_CACHES} (Linux, as root): {exc.strerror or exc}"
        ) from None
