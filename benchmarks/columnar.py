"""SQL scans through ``Catalog.query``'s engines, side by side with DuckDB over a
Parquet file of the same fields and numpy (issue 31, item 4).

Tiny records (the scale benchmark's: a 20-character sequential ``key``, an int64
``label`` 0..99) ingested once per size into ``benchmarks/data/columnar-<N>/``;
the figures, interleaved round-robin (rotating), medians:

- ``count``: ``SELECT count(*) FROM d WHERE label < 10`` (10% of the rows);
- ``group``: ``SELECT label, count(*) FROM d GROUP BY label ORDER BY label``;

each through ``Catalog.query`` (the SQLite engine, no index on ``label``), through
``Catalog.query(engine="duckdb")`` (its mirror built before timing; the build is
reported), through DuckDB's own ``read_parquet`` of a Parquet file written by
pyarrow from the same columns (``key``, ``position``, ``shard``, ``label``) on one
open connection, and as numpy over the ``label`` array in memory. Every contender
must return the same answer.

Run: ``python -m benchmarks.columnar --sizes 1000000 10000000 --repeats 5``.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.scale import DATA, SHARD, shards
from benchmarks.util import print_table, round_robin_times, timed
from shardcat import Catalog

QUERIES = {
    "count": "SELECT count(*) FROM d WHERE label < 10",
    "group": "SELECT label, count(*) FROM d GROUP BY label ORDER BY label",
}


def catalog(records: int) -> Path:
    """The ingested catalog of ``records`` scale records (made once, then reused)."""
    path = DATA / f"columnar-{records}" / "c.sqlite"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with Catalog(path) as cat:
            cat.ingest(str(shards("sequential", records) / "*.tfrecord"), "d", workers=2).close()
    return path


def peer_parquet(cat: Catalog, path: Path) -> np.ndarray[Any, Any]:
    """The view's columns as one Parquet file written by pyarrow; the labels."""
    with cat.query_rows("SELECT key, position, shard, label FROM d", memory=None) as (_, rows):
        key, position, shard, label = zip(*rows, strict=True)
    labels = np.array(label, dtype=np.int64)
    table = pa.table({"key": key, "position": np.array(position), "shard": shard, "label": labels})
    pq.write_table(table, path)
    return labels


def numpy_answer(name: str, labels: np.ndarray[Any, Any]) -> list[tuple[int, ...]]:
    if name == "count":
        return [(int(np.count_nonzero(labels < 10)),)]
    counts = np.bincount(labels)
    return [(int(v), int(n)) for v, n in enumerate(counts) if n]


def measure(records: int, repeats: int) -> list[tuple[str, ...]]:
    path = catalog(records)
    out = []
    with Catalog(path, readonly=True) as cat:
        build = timed(lambda: cat.query("SELECT count(*) FROM d", engine="duckdb", memory=None))
        print(
            f'{records:,} records: first engine="duckdb" query {build:.1f} s '
            "(builds the mirror unless current)"
        )
        parquet = path.with_name("peer.parquet")
        labels = peer_parquet(cat, parquet)
        peer = duckdb.connect()
        for name, sql in QUERIES.items():
            on_file = sql.replace("FROM d", f"FROM read_parquet('{parquet}')")
            contenders = {
                "sqlite": lambda sql=sql: cat.query(sql, memory=None),
                "duckdb engine": lambda sql=sql: cat.query(sql, engine="duckdb", memory=None),
                "duckdb parquet": lambda q=on_file: peer.execute(q).fetchall(),
                "numpy": lambda name=name: numpy_answer(name, labels),
            }
            answers = {k: list(f()) for k, f in contenders.items()}
            assert all(a == answers["numpy"] for a in answers.values()), answers
            times = round_robin_times(contenders, repeats, rotate=True)
            t = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            engine, peer_times = times["duckdb engine"], times["duckdb parquet"]
            ratios = [a / b for a, b in zip(engine, peer_times, strict=True)]
            out.append(
                (
                    f"{name} @ {records / 1e6:g}M",
                    *(f"{t[k]:.1f}" for k in contenders),
                    f"{t['duckdb engine'] / t['duckdb parquet']:.2f} "
                    f"({min(ratios):.2f}-{max(ratios):.2f})",
                    f"{t['sqlite'] / t['duckdb engine']:.0f}",
                )
            )
        peer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for records in args.sizes:
        if records % SHARD:
            parser.error(f"sizes are multiples of {SHARD:,}")
        rows += measure(records, args.repeats)
    header = (
        "figure",
        "sqlite ms",
        "duckdb engine ms",
        "duckdb parquet ms",
        "numpy ms",
        "engine / parquet",
        "sqlite / engine",
    )
    print_table(header, rows)


if __name__ == "__main__":
    main()
