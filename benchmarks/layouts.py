"""Catalog layouts for the records table, measured with raw sqlite3 (issue 12, item 2).

Each layout holds the same rows (one dataset, shards of ``--shard`` records,
tiny records: a key, an offset, a length) and answers the reader's two lookups:
by key and by (shard, ordinal). For each layout and size this prints:

- bytes per record of the whole file;
- the cost per record of a first ingest (every shard committed in its own
  transaction, keys in the index as they come, or the key index built after
  the rows where the layout allows it);
- the cost of adding one more shard whose keys interleave the existing ones
  (``scattered``: hashed keys, as with content hashes or round-robin shards)
  or sort after them (``sequential``);
- key and position lookups (µs per lookup from Python, random keys, warm).

Layouts (``--layouts``):

- ``key``: the table keyed by (dataset, key), WITHOUT ROWID, plus a unique
  index on (shard, ordinal) — the catalog up to schema version 5;
- ``ordinal``: the table keyed by (shard, ordinal), WITHOUT ROWID, plus one
  unique index on (dataset, key);
- ``rowid``: a rowid table whose rowid is ``shard << 32 | ordinal``, plus one
  unique index on (dataset, key).

Run: ``python -m benchmarks.layouts --sizes 1000000 10000000``.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import tempfile
import time
from collections.abc import Callable

SCHEMAS = {
    "key": [
        "CREATE TABLE records (dataset_id INTEGER NOT NULL, key TEXT NOT NULL, "
        "shard_id INTEGER NOT NULL, ordinal INTEGER NOT NULL, offset INTEGER NOT NULL, "
        "length INTEGER NOT NULL, PRIMARY KEY (dataset_id, key)) WITHOUT ROWID",
        "CREATE UNIQUE INDEX records_by_shard ON records (shard_id, ordinal)",
    ],
    "ordinal": [
        "CREATE TABLE records (shard_id INTEGER NOT NULL, ordinal INTEGER NOT NULL, "
        "dataset_id INTEGER NOT NULL, key TEXT NOT NULL, offset INTEGER NOT NULL, "
        "length INTEGER NOT NULL, PRIMARY KEY (shard_id, ordinal)) WITHOUT ROWID",
        "CREATE UNIQUE INDEX records_by_key ON records (dataset_id, key)",
    ],
    "rowid": [
        "CREATE TABLE records (rid INTEGER PRIMARY KEY, dataset_id INTEGER NOT NULL, "
        "key TEXT NOT NULL, offset INTEGER NOT NULL, length INTEGER NOT NULL)",
        "CREATE UNIQUE INDEX records_by_key ON records (dataset_id, key)",
    ],
}
# the index a deferred build drops and builds after the rows (None: the table itself)
KEY_INDEX = {"key": None, "ordinal": "records_by_key", "rowid": "records_by_key"}
LOOKUPS = {
    "key": (
        "SELECT shard_id, ordinal, offset, length FROM records WHERE dataset_id = 1 AND key = ?",
        "SELECT key, offset, length FROM records WHERE shard_id = ? AND ordinal = ?",
    ),
    "ordinal": (
        "SELECT shard_id, ordinal, offset, length FROM records WHERE dataset_id = 1 AND key = ?",
        "SELECT key, offset, length FROM records WHERE shard_id = ? AND ordinal = ?",
    ),
    "rowid": (
        "SELECT rid, offset, length FROM records WHERE dataset_id = 1 AND key = ?",
        "SELECT key, offset, length FROM records WHERE rid = (? << 32) | ?",
    ),
}


def key_sql(kind: str) -> str:
    """SQL for the key of record number ``x`` (``x`` in the SELECT)."""
    if kind == "sequential":
        return "printf('rec_%012d', x)"
    # a multiplicative hash in front: keys of one shard spread over the whole key space
    return "printf('%08x_%d', (x * 2654435761) % 4294967296, x)"


def insert_shard(db: sqlite3.Connection, layout: str, shard: int, n: int, kind: str) -> None:
    first = (shard - 1) * n
    gen = (
        f"WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i < {n - 1}) "
        f"SELECT {first} + i AS x, i AS ordinal FROM c"
    )
    k = key_sql(kind)
    if layout == "rowid":
        sql = (
            f"INSERT INTO records SELECT ({shard} << 32) | ordinal, 1, {k}, x * 60, 50 FROM ({gen})"
        )
    elif layout == "ordinal":
        sql = f"INSERT INTO records SELECT {shard}, ordinal, 1, {k}, x * 60, 50 FROM ({gen})"
    else:
        # the key-ordered table takes its rows in key order (the catalog sorts nothing,
        # but SQLite's insert into a B-tree keyed by key is cheapest that way)
        sql = (
            f"INSERT INTO records SELECT 1, {k}, {shard}, ordinal, x * 60, 50 FROM ({gen}) "
            f"ORDER BY 2"
        )
    with db:
        db.execute(sql)


def timed(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def open_db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA cache_size=-65536")
    db.isolation_level = ""
    return db


def measure(path: str, layout: str, total: int, shard: int, kind: str, deferred: bool) -> dict:
    db = open_db(path)
    for stmt in SCHEMAS[layout]:
        db.execute(stmt)
    db.commit()
    index = KEY_INDEX[layout]
    if deferred and index:
        db.execute(f"DROP INDEX {index}")
    shards = total // shard
    t = time.perf_counter()
    for s in range(1, shards + 1):
        insert_shard(db, layout, s, shard, kind)
    if deferred and index:
        with db:
            db.execute(next(x for x in SCHEMAS[layout] if index in x))
    first = time.perf_counter() - t
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = os.path.getsize(path)
    add = timed(lambda: insert_shard(db, layout, shards + 1, shard, kind))
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    by_key, by_pos = LOOKUPS[layout]
    rng = random.Random(1)
    picks = [rng.randrange(total) for _ in range(20000)]
    keys = [
        db.execute(f"SELECT {key_sql(kind)} FROM (SELECT ? AS x)", (x,)).fetchone()[0]
        for x in picks
    ]
    cur = db.cursor()
    for k in keys[:2000]:  # warm
        cur.execute(by_key, (k,)).fetchone()
    t = time.perf_counter()
    for k in keys:
        cur.execute(by_key, (k,)).fetchone()
    key_us = (time.perf_counter() - t) / len(keys) * 1e6
    spots = [(x // shard + 1, x % shard) for x in picks]
    t = time.perf_counter()
    for s, o in spots:
        cur.execute(by_pos, (s, o)).fetchone()
    pos_us = (time.perf_counter() - t) / len(spots) * 1e6
    db.close()
    return {
        "bytes/record": size / total,
        "first ingest ns/record": first / total * 1e9,
        "add one shard s": add,
        "key lookup us": key_us,
        "position lookup us": pos_us,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000_000])
    p.add_argument("--shard", type=int, default=125_000)
    p.add_argument("--layouts", nargs="+", default=list(SCHEMAS))
    p.add_argument("--keys", nargs="+", default=["scattered", "sequential"])
    args = p.parse_args()
    print(
        "| layout | keys | records | key index | "
        + " | ".join(
            [
                "bytes/record",
                "first ingest ns/record",
                "add one shard s",
                "key lookup us",
                "position lookup us",
            ]
        )
        + " |"
    )
    print("|" + " --- |" * 9)
    for total in args.sizes:
        for kind in args.keys:
            for layout in args.layouts:
                for deferred in (False, True) if KEY_INDEX[layout] else (False,):
                    with tempfile.TemporaryDirectory() as tmp:
                        row = measure(
                            os.path.join(tmp, "c.sqlite"),
                            layout,
                            total,
                            args.shard,
                            kind,
                            deferred,
                        )
                    when = "after the rows" if deferred else "as rows come"
                    cells = " | ".join(f"{v:.3g}" for v in row.values())
                    print(f"| {layout} | {kind} | {total:,} | {when} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
