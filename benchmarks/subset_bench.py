"""A reader over some of an indexed dataset's shards (issue 31, item 5): opened by
reference vs a fresh index of the same shards vs the copy it made before.

``python -m benchmarks.subset_bench [--records N] [--big M] [--rounds R]``. Writes
(into a temporary directory, once per run) 8 TFRecord shards of N records
(64-byte images; default 160,000: 8 x 20,000), indexes them all, then round-robin
on warm files:

- **shared**: ``Catalog.ingest`` of 3 of the 8 shards as a new dataset plus its
  first read: the rows are the donor's, by reference (``shardcat_shares``);
- **fresh**: the same 3 shards indexed into an empty catalog plus the first read;
- **copy**: the ``INSERT ... SELECT`` of those shards' rows that seeding did before
  (now :func:`shardcat.catalog.shares.materialize`, run when something writes them),
  timed after the opens (its writes would slow the next open's checkpoint).

Then reads on the shared subset against the fresh index of the same shards
(``get_feature`` per key, ``get_many(1000)`` per key, a ``count(*)`` over the
view). With ``--big M`` (e.g. 10,000,000) it also builds an M-record set once and
times opening half of it (4 of 8 shards) by reference, and copying those rows
once: opening should cost the same at M records as at N. Prints medians and
ratios (shardcat's way / the other).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.data import _write_shards, key_of
from benchmarks.util import print_table
from shardcat import Catalog
from shardcat.catalog import shares

SHARDS = 8


def build(directory: Path, records: int) -> tuple[list[str], Path]:
    """The shards and a catalog that indexed them all (dataset ``train``)."""
    files = _write_shards(directory, records, SHARDS, 64)
    catalog = directory / "catalog.sqlite"
    with Catalog(catalog) as cat:
        cat.ingest(files, "train", workers=2).close()
        cat.checkpoint()
    return files, catalog


def _opened(catalog: Path, files: list[str], name: str, first: str) -> float:
    start = time.perf_counter()
    with Catalog(catalog) as cat, cat.ingest(files, name, workers=2) as reader:
        reader.get_feature(first, "label")
    return time.perf_counter() - start


def _copied(catalog: Path, name: str) -> float:
    """Seconds to copy a shared dataset's rows into its own table (the old seed)."""
    with Catalog(catalog) as cat:
        dataset_id = cat.store.dataset_row(name).id
        start = time.perf_counter()
        with cat.store._transaction() as conn:
            shares.materialize(conn, dataset_id)
        return time.perf_counter() - start


def _per_key_us(fn: Callable[[], Any], n: int) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) / n * 1e6


def _reads(shared: Any, fresh: Any, keys: list[str], rounds: int) -> list[tuple[str, ...]]:
    rng = random.Random(1)
    sample = [rng.choice(keys) for _ in range(20_000)]
    batches = [[rng.choice(keys) for _ in range(1000)] for _ in range(10)]
    cases: dict[str, Callable[[Any], Callable[[], Any]]] = {
        "get_feature(key, 'label') per key, µs": lambda r: (
            lambda: [r.get_feature(k, "label") for k in sample]
        ),
        "get_many(1000) per key, µs": lambda r: lambda: [r.get_many(b) for b in batches],
        "count(*) WHERE label < 10 over the view, ms": lambda r: (
            lambda: r.catalog.query(f"SELECT count(*) FROM {r.dataset} WHERE label < 10")
        ),
    }
    sizes = {0: len(sample), 1: sum(map(len, batches)), 2: 1}
    rows = []
    for i, (what, make) in enumerate(cases.items()):
        times: dict[str, list[float]] = {"shared": [], "fresh": []}
        for _ in range(rounds):
            for name, reader in (("shared", shared), ("fresh", fresh)):
                us = _per_key_us(make(reader), sizes[i])
                times[name].append(us / 1000 if i == 2 else us)
        a, b = statistics.median(times["shared"]), statistics.median(times["fresh"])
        rows.append((what, f"{a:.2f}", f"{b:.2f}", f"{a / b:.2f}"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=160_000)
    parser.add_argument("--big", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files, catalog = build(root / "small", args.records)
        subset, first = files[1:4], key_of(args.records // SHARDS)
        big = build(root / "big", args.big) if args.big else None
        times: dict[str, list[float]] = {"shared": [], "fresh": [], "copy": [], "big": []}
        for r in range(args.rounds):  # interleaved: a noisy neighbour slows each alike
            times["shared"].append(_opened(catalog, subset, f"sub{r}", first))
            times["fresh"].append(_opened(root / f"fresh{r}.sqlite", subset, "sub", first))
            if big is not None:
                times["big"].append(_opened(big[1], big[0][: SHARDS // 2], f"half{r}", key_of(0)))
        for r in range(args.rounds):  # (after: its writes would slow the next open's checkpoint)
            times["copy"].append(_copied(catalog, f"sub{r}"))
        med = {k: statistics.median(v) for k, v in times.items() if v}
        n = len(subset) * args.records // SHARDS
        print(f"\nopen a subset: 3 of {SHARDS} shards, {n:,} records, {args.rounds} rounds")
        print_table(
            ("what", "median s", "ratio to fresh"),
            [(k, f"{v:.4f}", f"{v / med['fresh']:.3f}") for k, v in med.items() if k != "big"],
        )
        with (
            Catalog(catalog) as cat,
            cat.ingest(subset, "shared") as shared,
            Catalog(root / "fresh0.sqlite") as other,
            other.dataset("sub") as fresh,
        ):
            print("\nreads on the shared subset vs a fresh index of its shards")
            keys = fresh.get_keys()
            print_table(("what", "shared", "fresh", "ratio"), _reads(shared, fresh, keys, 5))
        if big is not None:
            copied = _copied(big[1], "half0")
            print(f"\nhalf of {args.big:,} records ({args.big // 2:,}) against the {n:,} above")
            print_table(
                ("what", "s", "ratio"),
                [
                    ("open by reference", f"{med['big']:.4f}", f"{med['big'] / med['shared']:.2f}"),
                    ("copy (once)", f"{copied:.2f}", f"{copied / med['copy']:.1f}"),
                ],
            )


if __name__ == "__main__":
    main()
