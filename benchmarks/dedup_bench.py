"""``Catalog.dedup`` over a large dataset: time and peak memory (issue 32, item 4).

``python -m benchmarks.dedup_bench [--records N] [--every K] [--postgres]``. Builds
(once, in ``benchmarks/data/dedup-N-K/``) N RecordIO records of 64 random bytes in 8
shards, every K-th a copy of an earlier record's bytes, and its catalog; then, each
in a fresh process, times ``Catalog.dedup`` (readonly catalog) and its peak RSS,
against the same process opening the catalog and reading one record (the RSS
floor), and against raw ``sqlite3`` reading every ``(key, crc)`` row (the floor for
reading the checks). ``--postgres``: the same dedup on a catalog of the same shards
on a private PostgreSQL server too. Prints one table.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.util import print_table
from shardcat import Catalog
from shardcat.formats.recordio import RecordIOWriter

ROOT = Path(__file__).resolve().parent / "data"
SHARDS = 8

_CHILD = """
import json, resource, sys, time
from shardcat import Catalog
what, path = sys.argv[1], sys.argv[2]
start = time.perf_counter()
with Catalog(path, readonly=True) as cat:
    if what == "dedup":
        report = cat.dedup("d")
        out = {"duplicates": report.duplicates, "candidates": report.candidates,
               "records": report.records, "collisions": report.collisions}
    else:
        with cat.dataset("d") as reader:
            reader.get_raw(reader.key_at(0))
        out = {}
out["seconds"] = time.perf_counter() - start
out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def build(records: int, every: int) -> Path:
    directory = ROOT / f"dedup-{records}-{every}"
    catalog = directory / "c.sqlite"
    if catalog.exists():
        return catalog
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    payloads: list[bytes] = []
    per = records // SHARDS
    for s in range(SHARDS):
        with RecordIOWriter(directory / f"part-{s}.rec") as w:
            for i in range(s * per, (s + 1) * per):
                copy = i % every == every - 1
                payload = payloads[rng.randrange(len(payloads))] if copy else rng.randbytes(64)
                if len(payloads) < 100_000 and not copy:
                    payloads.append(payload)
                w.write(payload, key=f"k{i:08d}")
    started = time.perf_counter()
    with Catalog(catalog) as cat:
        cat.ingest(str(directory / "part-*.rec"), "d").close()
    print(f"built {records:,} records in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return catalog


def child(what: str, catalog: Path | str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, what, str(catalog)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    catalog = build(args.records, args.every)
    import sqlite3

    conn = sqlite3.connect(f"file:{catalog}?mode=ro", uri=True)
    start = time.perf_counter()
    rows = sum(1 for _ in conn.execute("SELECT key, crc FROM shardcat_records_1"))
    raw = time.perf_counter() - start
    conn.close()
    floor = child("open", catalog)
    found = child("dedup", catalog)
    table = [
        _row("dedup", found),
        ("open + one read (RSS floor)", f"{floor['seconds']:.2f}", f"{floor['rss_mb']:.0f}"),
        (f"raw sqlite3: every (key, crc) row ({rows:,})", f"{raw:.2f}", ""),
    ]
    if args.postgres:
        pg_floor, pg_found = _on_postgres(catalog.parent)
        table.append(_row("dedup on PostgreSQL", pg_found))
        seconds, rss = f"{pg_floor['seconds']:.2f}", f"{pg_floor['rss_mb']:.0f}"
        table.append(("PostgreSQL: open + one read (RSS floor)", seconds, rss))
    print_table(("what", "seconds", "peak RSS MB"), table)


def _row(what: str, found: dict[str, float]) -> tuple[str, str, str]:
    counts = (
        f"{found['records']:,.0f} records, {found['duplicates']:,.0f} duplicates, "
        f"{found['candidates']:,.0f} candidates, {found['collisions']:,.0f} collisions"
    )
    return f"{what} ({counts})", f"{found['seconds']:.2f}", f"{found['rss_mb']:.0f}"


def _on_postgres(directory: Path) -> tuple[dict[str, float], dict[str, float]]:
    from shardcat.testing.postgres import fresh_database, postgres_server

    with postgres_server() as server, fresh_database(server) as url:
        with Catalog(url) as cat:
            cat.ingest(str(directory / "part-*.rec"), "d").close()
        return child("open", url), child("dedup", url)


if __name__ == "__main__":
    main()
