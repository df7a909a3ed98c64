"""What SQLite itself costs for the three issue-12 targets still missed, on raw
``sqlite3`` (no shardcat code), in tables shaped like the catalog's records table
(``WITHOUT ROWID``, primary key ``(shard_id, ordinal)``):

    python -m benchmarks.sqlite_floors count [--records 30000000] [--python PY ...]
    python -m benchmarks.sqlite_floors probe
    python -m benchmarks.sqlite_floors add [--records 10000000]

- ``count``: ``count(*) WHERE v1 < t`` through an index on ``v1`` (labels 0..99, so
  ``t = 10`` matches 10%), for ``t`` = 1, 5, 10: the time and the nanoseconds per
  matching index entry. Each ``--python`` names another interpreter whose
  ``sqlite3`` (or ``pysqlite3``, e.g. ``pysqlite3-binary``, a newer SQLite) is
  measured in the same rounds, the interpreters taking turns.
- ``probe``: a point lookup by key in a 10M-key index alone, against a lookup that
  first misses in a 125k-key second index (what a delta index for new shards would
  add to every lookup), 20k random keys, the two alternating.
- ``add``: 125k rows of a new shard into a table of ``--records`` rows with a unique
  key index, scattered keys (a hash prefix) against keys that sort after every
  stored one: the inserts, the commit and the checkpoint timed apart, with the
  64 MiB page cache shardcat's commit uses.

The tables are built once under ``benchmarks/data/`` and reused; the files are read
once before each timed part (this machine drops idle page cache).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
SHARD = 125_000
THRESHOLDS = (1, 5, 10)
RECORDS_DDL = (
    "CREATE TABLE r (shard_id INTEGER NOT NULL, ordinal BIGINT NOT NULL, {cols}, "
    "PRIMARY KEY (shard_id, ordinal)) WITHOUT ROWID"
)


def _warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(8 << 20):
            pass


def _scattered(x: int) -> str:
    return f"{(x * 2654435761) % 4294967296:08x}_{x:011d}"


def _sequential(x: int) -> str:
    return f"rec_{x:016d}"


def _build(path: Path, records: int, cols: str, rows: Any, index: str) -> Path:
    if path.exists():
        return path
    part = path.with_suffix(".part")
    part.unlink(missing_ok=True)
    import sqlite3

    conn = sqlite3.connect(part)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute(RECORDS_DDL.format(cols=cols))
    conn.executemany(f"INSERT INTO r VALUES ({', '.join('?' * (2 + cols.count(',') + 1))})", rows)
    conn.execute("PRAGMA cache_size = -262144")
    conn.execute(index)
    conn.commit()
    conn.close()
    part.rename(path)
    print(f"built {path.name}: {records:,} rows", flush=True)
    return path


# -- count -----------------------------------------------------------------------


def _count_db(records: int) -> Path:
    rnd = random.Random(1)
    rows = ((x // SHARD, x % SHARD, rnd.randrange(100)) for x in range(records))
    return _build(
        DATA / f"floor-count-{records}.sqlite",
        records,
        "v1 BIGINT",
        rows,
        "CREATE INDEX r_v1 ON r (v1)",
    )


def count_child(db: str, repeats: int) -> None:
    """One interpreter's round: medians of ``repeats`` per threshold, as JSON."""
    try:
        import pysqlite3 as sqlite3  # type: ignore[import-not-found]
    except ImportError:
        import sqlite3
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    out: dict[str, Any] = {"version": sqlite3.sqlite_version}
    for t in THRESHOLDS:
        times, n = [], 0
        for _ in range(repeats + 1):
            start = time.perf_counter()
            (n,) = conn.execute("SELECT count(*) FROM r WHERE v1 < ?", (t,)).fetchone()
            times.append(time.perf_counter() - start)
        out[str(t)] = {"n": n, "s": statistics.median(times[1:])}
    print(json.dumps(out))


def count(records: int, pythons: list[str], rounds: int, repeats: int) -> None:
    db = _count_db(records)
    contenders = [sys.executable, *pythons]
    got: dict[str, list[dict[str, Any]]] = {p: [] for p in contenders}
    for _ in range(rounds):
        for python in contenders:
            _warm(db)
            child = subprocess.run(
                [python, __file__, "count-child", str(db), str(repeats)],
                check=True,
                capture_output=True,
                text=True,
            )
            got[python].append(json.loads(child.stdout))
    print(f"count(*) WHERE v1 < t, index on v1, {records:,} rows; medians of {rounds} rounds")
    print("python | SQLite | t | matches | ms | ns per match")
    for python, runs in got.items():
        for t in THRESHOLDS:
            s = statistics.median(r[str(t)]["s"] for r in runs)
            n = runs[0][str(t)]["n"]
            name = "this" if python == sys.executable else python
            print(
                f"{name} | {runs[0]['version']} | {t} | {n:,} | {s * 1e3:.1f} | {s / n * 1e9:.1f}"
            )


# -- probe -----------------------------------------------------------------------


def probe(records: int, lookups: int, rounds: int) -> None:
    import sqlite3

    main = _key_db("scattered", records, _scattered)
    delta = DATA / "floor-probe-delta.sqlite"
    if not delta.exists():
        conn = sqlite3.connect(delta)
        conn.execute(
            "CREATE TABLE d (key TEXT PRIMARY KEY, shard_id INT, ordinal INT) WITHOUT ROWID"
        )
        conn.executemany(
            "INSERT INTO d VALUES (?, ?, ?)",
            ((_scattered(x), x // SHARD, x % SHARD) for x in range(records, records + SHARD)),
        )
        conn.commit()
        conn.close()
    _warm(main)
    _warm(delta)
    conn = sqlite3.connect(f"file:{main}?mode=ro", uri=True)
    conn.execute(f"ATTACH 'file:{delta}?mode=ro' AS delta")
    rnd = random.Random(2)
    keys = [_scattered(rnd.randrange(records)) for _ in range(lookups)]
    one = "SELECT shard_id, ordinal FROM r WHERE key = ?"
    miss = "SELECT shard_id, ordinal FROM delta.d WHERE key = ?"
    conn.execute("BEGIN")  # one read transaction, as shardcat's readers keep one open

    def alone() -> None:
        for k in keys:
            conn.execute(one, (k,)).fetchone()

    def both() -> None:
        for k in keys:
            if conn.execute(miss, (k,)).fetchone() is None:
                conn.execute(one, (k,)).fetchone()

    times: dict[str, list[float]] = {"key index alone": [], "delta miss, then key index": []}
    for _ in range(rounds):
        for name, fn in (("key index alone", alone), ("delta miss, then key index", both)):
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) / lookups)
    base = statistics.median(times["key index alone"])
    print(f"point lookup by key, {records:,} keys (+ a {SHARD:,}-key delta), {lookups:,} lookups")
    print("lookup | us per lookup | ratio")
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"{name} | {t * 1e6:.2f} | {t / base:.2f}")


# -- add -------------------------------------------------------------------------


def _key_db(name: str, records: int, key: Any) -> Path:
    rows = ((x // SHARD, x % SHARD, key(x), (x % SHARD) * 60, 44) for x in range(records))
    return _build(
        DATA / f"floor-keys-{name}-{records}.sqlite",
        records,
        'key TEXT NOT NULL, "offset" BIGINT NOT NULL, length BIGINT NOT NULL',
        rows,
        "CREATE UNIQUE INDEX r_key ON r (key)",
    )


def add(records: int, rounds: int) -> None:
    import sqlite3

    kinds = {"scattered": _scattered, "sequential": _sequential}
    bases = {kind: _key_db(kind, records, key) for kind, key in kinds.items()}
    got: dict[str, list[tuple[float, float, float]]] = {kind: [] for kind in kinds}
    copy = DATA / "floor-add-copy.sqlite"
    for _ in range(rounds):
        for kind, key in kinds.items():
            for leftover in DATA.glob(copy.name + "*"):
                leftover.unlink()
            shutil.copyfile(bases[kind], copy)
            _warm(copy)
            rows = [
                (records // SHARD, x - records, key(x), (x - records) * 60, 44)
                for x in range(records, records + SHARD)
            ]
            conn = sqlite3.connect(copy, isolation_level=None)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA cache_size = -65536")
            t0 = time.perf_counter()
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO r VALUES (?, ?, ?, ?, ?)", rows)
            t1 = time.perf_counter()
            conn.execute("COMMIT")
            t2 = time.perf_counter()
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            t3 = time.perf_counter()
            conn.close()
            got[kind].append((t1 - t0, t2 - t1, t3 - t2))
    for leftover in DATA.glob(copy.name + "*"):
        leftover.unlink()
    print(f"add one {SHARD:,}-row shard into {records:,} rows with a unique key index")
    print("keys | inserts s | commit s | checkpoint s | total s | vs sequential")
    seq = statistics.median(sum(r) for r in got["sequential"])
    for kind, runs in got.items():
        parts = [statistics.median(r[i] for r in runs) for i in range(3)]
        total = statistics.median(sum(r) for r in runs)
        print(
            f"{kind} | "
            + " | ".join(f"{p:.2f}" for p in parts)
            + f" | {total:.2f} | {total / seq:.1f}"
        )


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "count-child":
        count_child(sys.argv[2], int(sys.argv[3]))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("part", choices=["count", "probe", "add"])
    p.add_argument("--records", type=int)
    p.add_argument("--python", action="append", default=[], help="another interpreter (count)")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    DATA.mkdir(parents=True, exist_ok=True)
    if args.part == "count":
        count(args.records or 30_000_000, [os.path.abspath(x) for x in args.python], args.rounds, 5)
    elif args.part == "probe":
        probe(args.records or 10_000_000, 20_000, args.rounds)
    else:
        add(args.records or 10_000_000, max(1, min(args.rounds, 3)))


if __name__ == "__main__":
    main()
