"""Migrating a tfd-utils index vs ingesting the same shards, side by side in one run.

``python -m benchmarks.migrate_bench [--records 1000000] [--shards 8] [--repeats 3]
[--workers 2] [--image-bytes 0] [--cold] [--quick]``

Data: tiny TFRecords (key + label, 44 bytes) in 8 shards, generated once by
``benchmarks.data`` into ``benchmarks/data/<records>x0b-<shards>shards/``, with
the index tfd-utils 1.3.0 builds for them (``tfd.index``, built once by
tfd-utils itself and cached there; the same data the main suite uses).

Each contender writes a fresh catalog in a temporary directory (nothing is
written beside the cached data); they run round-robin and the median is kept:

- **migrate**: ``shardcat.facade.catalog.migrate(<data dir>, catalog=...)``:
  discovery, the restricted unpickler, verification (tiling of every shard,
  64 records per shard re-read with both CRCs and the key), the commit through
  the ingest's own transaction. The dataset it makes equals ``ingest(...,
  fields=False)`` (checked once, untimed).
- **ingest, no fields**: ``Catalog(...).ingest(glob, workers=N, fields=False)``:
  the same dataset built from the data (every CRC checked, every record parsed).
- **ingest**: ``Catalog(...).ingest(glob, workers=N)``, the default with SQL
  fields: what a user runs without a legacy index.
- **pickle load**: the restricted unpickler alone on ``tfd.index``: what
  opening the legacy index costs tfd-utils on every start, and the floor of
  any migration.
- **tfd-utils build** (context): ``TFRecordRandomAccess(glob,
  index_file=<tmp>, max_workers=N)._build_index()``.

With ``--cold`` the page cache is dropped before every timed run (Linux, as
root): the first migration or ingest of shards on a machine that has not read
them yet.

Ratios are migrate / other: below 1 means the migration is faster.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.data import DATASET, Dataset, ensure_tfd_index, get_dataset, remove_catalog
from benchmarks.util import drop_page_cache, print_table, quiet, round_robin
from shardcat import Catalog
from shardcat.facade.catalog import migrate
from shardcat.migrations.legacy import load_pickle


def _contenders(ds: Dataset, tmp: Path, workers: int) -> dict[str, Callable[[], Any]]:
    def fresh(name: str) -> Path:
        path = tmp / f"{name}.sqlite"
        remove_catalog(path)
        return path

    def run_migrate() -> None:
        report = migrate(ds.directory, catalog=fresh("migrate"), dataset=DATASET, workers=workers)
        if report.totals()["imported"] != ds.shards:
            raise RuntimeError(f"migration did not import every shard: {report.totals()}")

    def run_ingest(fields: bool) -> Callable[[], None]:
        def ingest() -> None:
            with Catalog(fresh(f"ingest-{fields}")) as cat:
                cat.ingest(ds.glob, DATASET, workers=workers, fields=fields).close()

        return ingest

    def tfd_build() -> None:
        from tfd_utils import TFRecordRandomAccess

        index = tmp / "tfd.index"
        index.unlink(missing_ok=True)
        with quiet():
            reader = TFRecordRandomAccess(
                ds.glob, index_file=str(index), max_workers=workers, progress_interval=10**9
            )
            reader._build_index()
            reader.close()

    return {
        "migrate": run_migrate,
        "ingest, no fields": run_ingest(False),
        "ingest (with fields)": run_ingest(True),
        "pickle load (restricted)": lambda: load_pickle(ds.tfd_index),
        "tfd-utils index build": tfd_build,
    }


def _same_dataset(tmp: Path) -> None:
    """The migrated catalog holds what ingesting without fields made (untimed check)."""
    query = (
        'SELECT s.path, r.key, r.ordinal, r."offset", r.length FROM shardcat_records r '
        "JOIN shardcat_shards s ON s.id = r.shard_id ORDER BY s.path, r.ordinal"
    )
    rows = []
    for name in ("migrate", "ingest-False"):
        with Catalog(tmp / f"{name}.sqlite", readonly=True) as cat:
            rows.append(cat.store.reader_connection().execute(query).fetchall())
    if rows[0] != rows[1]:
        raise RuntimeError("the migrated dataset differs from the ingested one")


def run(
    records: int, shards: int, repeats: int, workers: int, image_bytes: int = 0, cold: bool = False
) -> list[tuple[str, float]]:
    ds = get_dataset(records, shards=shards, image_bytes=image_bytes)
    ensure_tfd_index(ds)
    with tempfile.TemporaryDirectory(prefix="migrate-bench-") as tmp:
        contenders = _contenders(ds, Path(tmp), workers)
        times = round_robin(contenders, repeats, drop_page_cache if cold else None)
        _same_dataset(Path(tmp))
    return list(times.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.migrate_bench", description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="ingest / tfd-utils processes")
    parser.add_argument(
        "--image-bytes", type=int, default=0, help="an image feature of this size per record"
    )
    parser.add_argument(
        "--cold", action="store_true", help="drop the page cache before every run (Linux, root)"
    )
    parser.add_argument("--quick", action="store_true", help="500k records, 2 repeats")
    args = parser.parse_args(argv)
    if args.quick:
        args.records, args.repeats = 500_000, 2
    start = time.perf_counter()
    if args.cold:
        drop_page_cache()  # fail before generating anything when it cannot
    rows = run(args.records, args.shards, args.repeats, args.workers, args.image_bytes, args.cold)
    migrate_s = dict(rows)["migrate"]
    print(
        f"{args.records:,} keys in {args.shards} shards"
        + (f", {args.image_bytes:,}-byte images" if args.image_bytes else "")
        + (", cold page cache" if args.cold else ", warm page cache")
        + f", median of {args.repeats}, "
        f"{args.workers} workers ({time.perf_counter() - start:.0f} s in all)\n"
    )
    header = ("contender", "seconds", "migrate / contender")
    table = [(name, f"{s:.2f}", f"{migrate_s / s:.2f}") for name, s in rows]
    print_table(header, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
