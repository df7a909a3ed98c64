"""Raw ``sqlite3`` layouts for TensorDB's SQL mirror: what a first write of N rows costs.

    python -m benchmarks.mirror_floor              # 1M rows, 5 interleaved rounds
    python -m benchmarks.mirror_floor --rows 100000 --repeats 3
    python -m benchmarks.mirror_floor --keys       # rows with keys: key index kept or rebuilt

Each variant writes the rows of the storage benchmark's TensorDB write (``price``
float32, ``label`` int64, no keys) into a fresh WAL file (``synchronous =
NORMAL`` unless said otherwise) in one transaction, the indexes on both fields
built after the rows are in, and reports the median total and its parts
(``tolist`` of the tensors, inserts, index builds, commit). The variants run
round-robin, so a noisy neighbour slows all alike. ``partial key, 200/stmt`` is
what TensorDB does today; ``key UNIQUE, 1/stmt`` what it did before.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sqlite3
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from shardcat.catalog.sqlite import value_groups


@dataclass(frozen=True)
class Variant:
    key: str = "partial"  # "unique" (key TEXT UNIQUE), "partial" (WHERE key IS NOT NULL), "none"
    grouped: bool = True  # multi-row VALUES (catalog.sqlite.value_groups), else one row a statement
    build: tuple[str, ...] = ()  # PRAGMAs set around the index builds
    rowid: bool = True
    synchronous: str = "NORMAL"
    indexes_first: bool = False  # indexes exist before the rows go in
    keys: str = ""  # rows with keys: "sorted" (k0000000, ...) or "random" (16 hex digits)
    rebuild_key: bool = False  # drop the partial key index before the rows, build it after


VARIANTS = {
    "key UNIQUE, 1/stmt (before)": Variant(key="unique", grouped=False),
    "key UNIQUE, 200/stmt": Variant(key="unique"),
    "partial key, 1/stmt": Variant(grouped=False),
    "partial key, 200/stmt (now)": Variant(),
    "no key index, 200/stmt": Variant(key="none"),
    "partial, cache_size 256 MiB + threads 2": Variant(
        build=("cache_size = -262144", "threads = 2")
    ),
    "partial, cache_size 16 MiB": Variant(build=("cache_size = -16384",)),
    "partial, threads 2": Variant(build=("threads = 2",)),
    "partial, temp_store MEMORY": Variant(build=("temp_store = MEMORY",)),
    "partial, WITHOUT ROWID": Variant(rowid=False),
    "partial, synchronous OFF": Variant(synchronous="OFF"),
}
SLOW = {"partial, indexes before the rows": Variant(indexes_first=True)}  # --slow: ~10x
KEYED = {  # --keys (random keys into a kept index: ~10x)
    "sorted keys, key index kept": Variant(keys="sorted"),
    "sorted keys, key index rebuilt": Variant(keys="sorted", rebuild_key=True),
    "random keys, key index kept": Variant(keys="random"),
    "random keys, key index rebuilt": Variant(keys="random", rebuild_key=True),
}


def _keys(kind: str, n: int) -> list[str]:
    if kind == "sorted":
        return [f"k{i:07d}" for i in range(n)]
    return [hashlib.blake2b(str(i).encode(), digest_size=8).hexdigest() for i in range(n)]


def write(path: Path, v: Variant, price: torch.Tensor, label: torch.Tensor) -> list[float]:
    """One write; seconds of (tolist, inserts, index builds, commit)."""
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(f"{path}{suffix}"):
            os.unlink(f"{path}{suffix}")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {v.synchronous}")
    key = "key TEXT UNIQUE" if v.key == "unique" else "key TEXT"
    tail = "" if v.rowid else " WITHOUT ROWID"
    conn.execute(
        f"CREATE TABLE rows (position INTEGER PRIMARY KEY, {key}, price REAL, label INTEGER){tail}"
    )
    if v.key == "partial":
        conn.execute("CREATE UNIQUE INDEX rows_key ON rows (key) WHERE key IS NOT NULL")
    indexes = ["CREATE INDEX rows_price ON rows (price)", "CREATE INDEX rows_label ON rows (label)"]
    if v.indexes_first:
        for statement in indexes:
            conn.execute(statement)
    t0 = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    columns = [price.reshape(-1).tolist(), label.reshape(-1).tolist()]
    n = len(columns[0])
    head = "INSERT INTO rows (position, price, label) VALUES "
    if v.keys:
        columns.append(_keys(v.keys, n))
        head = "INSERT INTO rows (position, price, label, key) VALUES "
    t1 = time.perf_counter()
    if v.rebuild_key:
        conn.execute("DROP INDEX rows_key")
    if v.grouped:
        for values, groups in value_groups([range(n), *columns], n):
            conn.executemany(head + values, groups)
    else:
        conn.executemany(head + "(?, ?, ?)", zip(range(n), *columns, strict=True))
    if v.rebuild_key:
        conn.execute("CREATE UNIQUE INDEX rows_key ON rows (key) WHERE key IS NOT NULL")
    t2 = time.perf_counter()
    if not v.indexes_first:
        before = {
            p.split()[0]: conn.execute(f"PRAGMA {p.split()[0]}").fetchone()[0] for p in v.build
        }
        for pragma in v.build:
            conn.execute(f"PRAGMA {pragma}")
        for statement in indexes:
            conn.execute(statement)
        for name, value in before.items():
            conn.execute(f"PRAGMA {name} = {value}")
    t3 = time.perf_counter()
    conn.execute("COMMIT")
    t4 = time.perf_counter()
    conn.close()
    return [t4 - t0, t1 - t0, t2 - t1, t3 - t2, t4 - t3]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slow", action="store_true", help="also the indexes-first variant")
    parser.add_argument("--keys", action="store_true", help="only rows with keys")
    parser.add_argument("--dir", help="where to write (default: a temp dir)")
    args = parser.parse_args(argv)
    gen = torch.Generator().manual_seed(3)  # the storage benchmark's rows
    price = (torch.rand(args.rows, 1, generator=gen) * 200).to(torch.float32)
    label = torch.randint(0, 10, (args.rows, 1), generator=gen)
    variants = KEYED if args.keys else {**VARIANTS, **(SLOW if args.slow else {})}
    times: dict[str, list[list[float]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="mirror-floor-") as tmp:
        path = Path(tmp) / "rows.sqlite"
        write(path, Variant(), price, label)  # warm-up
        names = list(variants)
        for r in range(args.repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                times[name].append(write(path, variants[name], price, label))
    print(f"{args.rows:,} rows, medians of {args.repeats} (ms)")
    print("| variant | total | tolist | inserts | index builds | commit |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, runs in times.items():
        parts = [statistics.median(run[i] for run in runs) * 1e3 for i in range(5)]
        print(f"| {name} | " + " | ".join(f"{p:.0f}" for p in parts) + " |")


if __name__ == "__main__":
    main()
