"""Readers on a snapshot vs on the catalog it was taken of, and the snapshot's cost.

``python -m benchmarks.snapshot_bench [--records N] [--rounds R]``. Builds (once,
in ``benchmarks/data/``) a dataset of N tiny records in 8 shards with its catalog,
takes ``Catalog.snapshot`` of it (timed: seconds per million records, against
SQLite's own ``VACUUM INTO`` copy of the whole source file, the floor for writing
a compact copy, interleaved), then,
round-robin in the same run on warm files: ``get_feature(key, "label")`` per key
and ``get_many(1000 keys)`` per key on the source catalog (opened
``readonly=True``, the usual reader) and on the snapshot (``immutable=True``).
Prints medians and the ratio snapshot / source (below 1: the snapshot is faster).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.data import ensure_catalog, get_dataset, key_of
from benchmarks.util import print_table
from shardcat import Catalog


def _single_us(reader: Any, keys: list[str]) -> float:
    get = reader.get_feature
    start = time.perf_counter()
    for key in keys:
        get(key, "label")
    return (time.perf_counter() - start) / len(keys) * 1e6


def _many_us(reader: Any, batches: list[list[str]]) -> float:
    start = time.perf_counter()
    for batch in batches:
        reader.get_many(batch)
    return (time.perf_counter() - start) / sum(map(len, batches)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    ds = get_dataset(args.records, shards=8, image_bytes=0)
    ensure_catalog(ds)
    rng = random.Random(0)
    keys = [key_of(rng.randrange(args.records)) for _ in range(20_000)]
    batches = [[key_of(rng.randrange(args.records)) for _ in range(1000)] for _ in range(10)]
    with tempfile.TemporaryDirectory(dir=ds.directory) as tmp:
        snap = Path(tmp) / "snapshot.sqlite"
        floor = Path(tmp) / "vacuum-into.sqlite"
        with Catalog(ds.catalog, readonly=True) as cat:
            taken, copied = [], []
            for _ in range(3):
                start = time.perf_counter()
                cat.snapshot("train", snap, overwrite=True)
                taken.append(time.perf_counter() - start)
                floor.unlink(missing_ok=True)
                start = time.perf_counter()
                with contextlib.closing(
                    sqlite3.connect(f"{ds.catalog.as_uri()}?mode=ro", uri=True)
                ) as raw:
                    raw.execute("VACUUM INTO ?", (str(floor),))
                copied.append(time.perf_counter() - start)
        per_million = statistics.median(taken) / args.records * 1e6
        floor_per_million = statistics.median(copied) / args.records * 1e6
        src_size, snap_size = ds.catalog.stat().st_size, snap.stat().st_size
        with (
            Catalog(ds.catalog, readonly=True) as src,
            Catalog(snap, immutable=True) as dst,
            src.dataset("train") as a,
            dst.dataset("train") as b,
        ):
            assert a.get_many(batches[0], raw=True) == b.get_many(batches[0], raw=True)
            for reader in (a, b):  # warm
                _single_us(reader, keys)
                _many_us(reader, batches)
            single: dict[str, list[float]] = {"source": [], "snapshot": []}
            many: dict[str, list[float]] = {"source": [], "snapshot": []}
            for r in range(args.rounds):
                order = [("source", a), ("snapshot", b)][:: 1 if r % 2 == 0 else -1]
                for name, reader in order:
                    single[name].append(_single_us(reader, keys))
                    many[name].append(_many_us(reader, batches))
    rows = []
    for label, times in (("get_feature, us/key", single), ("get_many(1000), us/key", many)):
        s, n = statistics.median(times["source"]), statistics.median(times["snapshot"])
        rows.append((label, f"{s:.2f}", f"{n:.2f}", f"{n / s:.2f}"))
    print(f"{args.records:,} records, 8 shards; median of {args.rounds} interleaved rounds")
    print_table(("lookup", "source (readonly)", "snapshot (immutable)", "snapshot / source"), rows)
    print(
        f"snapshot: {per_million:.2f} s per million records, VACUUM INTO of the source "
        f"{floor_per_million:.2f} s (ratio {per_million / floor_per_million:.2f}); "
        f"{snap_size / 2**20:.1f} MiB (source catalog {src_size / 2**20:.1f} MiB)"
    )


if __name__ == "__main__":
    main()
