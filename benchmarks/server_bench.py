"""A catalog on a PostgreSQL server against the same catalog in a SQLite file (issue 13).

One run, same shards (100k x 1 KB TFRecords in 4 shards), a private PostgreSQL
server on loopback (``shardcat.testing.postgres``), contenders interleaved:

- *ingest*: a first ingest with 2 workers (COPY on the server), median of 3;
- *get_feature*: one lookup + read by key, median over 2,000 random keys;
- *get_many*: 1,000 random keys in one call, median of 15;
- *snapshot*: the server catalog written to a SQLite snapshot, then read
  (``Catalog(snapshot, immutable=True)``) — only when ``Catalog.snapshot`` exists.

Ratios are server / SQLite. Over loopback a lookup costs a network round trip
and a server process's turn; across hosts add the network's latency.

Usage: ``python -m benchmarks.server_bench`` (a few minutes).
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.data import get_dataset, key_of
from benchmarks.util import print_table, round_robin
from shardcat import Catalog
from shardcat.testing.postgres import postgres_server

RECORDS = 100_000


def _fresh_database(server: str, name: str) -> str:
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return server.rsplit("/", 1)[0] + "/" + name


def _lookups(reader: Any, keys: list[str]) -> float:
    times = []
    for key in keys:
        start = time.perf_counter()
        reader.get_feature(key, "label")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _row(name: str, file: float, server: float, scale: float, digits: int) -> tuple[str, ...]:
    return (name, f"{file * scale:.{digits}f}", f"{server * scale:.{digits}f}",
            f"{server / file:.2f}x")  # fmt: skip


def main() -> None:
    ds = get_dataset(RECORDS, shards=4, image_bytes=1024)
    for f in ds.files:  # warm the page cache
        Path(f).read_bytes()
    work = Path(tempfile.mkdtemp(prefix="server-bench-"))
    with postgres_server() as server:
        serial = iter(range(100))
        targets = {
            "sqlite": lambda: str(work / f"c{next(serial)}.sqlite"),
            "server": lambda: _fresh_database(server, f"bench{next(serial)}"),
        }
        made: dict[str, str] = {}

        def ingest(kind: str) -> None:
            where = made[kind] = targets[kind]()
            with Catalog(where) as cat:
                cat.ingest(ds.glob, "d", workers=2).close()

        times = round_robin({k: (lambda k=k: ingest(k)) for k in targets}, 3, rotate=True)
        rows = [_row("ingest (s)", times["sqlite"], times["server"], 1, 3)]
        rng = random.Random(7)
        keys = [key_of(rng.randrange(RECORDS)) for _ in range(2000)]
        batch = [key_of(rng.randrange(RECORDS)) for _ in range(1000)]
        with Catalog(made["sqlite"]) as a, Catalog(made["server"]) as b:
            with a.dataset("d") as ra, b.dataset("d") as rb:
                readers = {"sqlite": ra, "server": rb}
                for r in readers.values():
                    r.get_many(batch)  # warm connections and prepared statements
                single: dict[str, list[float]] = {k: [] for k in readers}
                for _ in range(3):
                    for kind, r in readers.items():
                        single[kind].append(_lookups(r, keys))
                one = {k: statistics.median(v) for k, v in single.items()}
                many = round_robin({k: (lambda r=r: r.get_many(batch)) for k, r in readers.items()},
                                   15)  # fmt: skip
                assert ra.get_many(batch, raw=True) == rb.get_many(batch, raw=True)
            rows.append(_row("get_feature (us)", one["sqlite"], one["server"], 1e6, 1))
            rows.append(_row("get_many 1000 (ms)", many["sqlite"], many["server"], 1e3, 2))
            if hasattr(b, "snapshot"):
                snap = work / "snap.sqlite"
                start = time.perf_counter()
                b.snapshot(["d"], snap)
                took = time.perf_counter() - start
                with Catalog(snap, immutable=True) as c, c.dataset("d") as rc:
                    rc.get_many(batch)
                    s1 = statistics.median(_lookups(rc, keys) for _ in range(3))
                    ra_one = one["sqlite"]
                rows.append(("snapshot write (s)", "-", f"{took:.3f}", "-"))
                rows.append(_row("get_feature, snapshot vs file (us)", ra_one, s1, 1e6, 1))
    print_table(("measure", "SQLite file", "PostgreSQL", "server / file"), rows)


if __name__ == "__main__":
    main()
