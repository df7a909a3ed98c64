"""``python -m benchmarks.churn [--seconds S] [--readers N] [--format tar|tfrecord]``:
readers reading while shards are rewritten and re-ingested (see
:mod:`shardcat.testing.churn`); prints the counts. ``wrong``, ``missing`` and
``other`` and ``unexplained`` must be 0."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

from shardcat.testing.churn import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.churn", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long (default 60)")
    parser.add_argument("--readers", type=int, default=4, help="reader processes (default 4)")
    parser.add_argument("--shards", type=int, default=4, help="shards (default 4)")
    parser.add_argument("--format", action="append", choices=["tar", "tfrecord"], help="repeatable")
    args = parser.parse_args(argv)
    failed = False
    for fmt in args.format or ["tar", "tfrecord"]:
        with tempfile.TemporaryDirectory(prefix="shardcat-churn-") as tmp:
            start = time.perf_counter()
            result = run(
                tmp, fmt=fmt, shards=args.shards, seconds=args.seconds, readers=args.readers
            )
            result["seconds"] = round(time.perf_counter() - start, 1)
        print(json.dumps({"format": fmt, **result}), flush=True)
        failed |= any(result[k] for k in ("wrong", "missing", "other", "unexplained"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
