"""An ingest-shaped transaction on the catalog engine, reconnecting vs keeping the connection.

``python -m benchmarks.connection_bench [--transactions N] [--rounds R]``. Each
transaction is what a claim or a commit of the ingest costs besides its own
SQL: ``BEGIN IMMEDIATE``, one small write, ``COMMIT``. ``make_engine(path)``
(``NullPool``) opens a connection and runs the pragmas every time;
``make_engine(path, keep_connection=True)`` (the ingest's engine) reuses one.
Rounds alternate between the two on the same file; prints the median us per
transaction of each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from sqlalchemy import Engine, text

from shardcat.catalog.backend import make_engine


def _us(engine: Engine, n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        with engine.begin() as conn:
            conn.execute(text("UPDATE t SET n = :n"), {"n": i})
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--transactions", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.sqlite"
        engines = {"reconnect": make_engine(path), "kept": make_engine(path, keep_connection=True)}
        with engines["reconnect"].begin() as conn:
            conn.execute(text("CREATE TABLE t (n INTEGER)"))
            conn.execute(text("INSERT INTO t VALUES (0)"))
        times: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(args.rounds):
            for name, engine in engines.items():
                times[name].append(_us(engine, args.transactions))
        for engine in engines.values():
            engine.dispose()
    old, new = (statistics.median(times[k]) for k in ("reconnect", "kept"))
    print(
        f"per transaction: reconnect {old:.0f} us, kept {new:.0f} us, "
        f"kept/reconnect {new / old:.2f}"
    )


if __name__ == "__main__":
    main()
