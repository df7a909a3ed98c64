"""``python -m benchmarks [--quick] [--only NAME ...] [--out FILE]``."""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import sqlite3
import subprocess
import sys
import time
from importlib.metadata import version

from benchmarks.suite import BENCHMARKS, FULL, QUICK
from benchmarks.util import Row, markdown

# Benchmarks with their own scripts (and their own tables), run after the suite:
# name -> (module, arguments of a quick run).
SCRIPTS = {
    "tar": ("benchmarks.tar_bench", ["--mb", "20", "--reads", "100", "--gz-reads-tfd", "3"]),
    "storage": ("benchmarks.storage_bench", ["--quick"]),
    "mirror-floor": ("benchmarks.mirror_floor", ["--rows", "100000", "--repeats", "3"]),
    "migrate": ("benchmarks.migrate_bench", ["--quick"]),
}


def _revision() -> str:
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def environment() -> str:
    return (
        f"{datetime.date.today().isoformat()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"protobuf {version('protobuf')}, shardcat {version('shardcat')}, "
        f"tfd-utils {version('tfd-utils')}, git {_revision()}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="shardcat vs tfd-utils vs the physical limits, side by side.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, fewer repeats")
    parser.add_argument(
        "--only",
        action="append",
        choices=[*BENCHMARKS, *SCRIPTS],
        metavar="NAME",
        help=f"run only this benchmark (repeatable): {', '.join([*BENCHMARKS, *SCRIPTS])}",
    )
    parser.add_argument("--out", metavar="FILE", help="also write the results as a markdown table")
    args = parser.parse_args(argv)

    cfg = QUICK if args.quick else FULL
    env = environment()
    print(f"shardcat benchmarks ({'quick' if args.quick else 'full'}): {env}", flush=True)
    rows: list[Row] = []
    chosen = args.only or [*BENCHMARKS, *SCRIPTS]
    for name in [n for n in chosen if n in BENCHMARKS]:
        print(f"\n[{name}] {BENCHMARKS[name].__doc__.splitlines()[0]}", flush=True)
        start = time.perf_counter()
        new = BENCHMARKS[name](cfg, lambda msg: print(msg, flush=True))
        for row in new:
            print(row.show(), flush=True)
        print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)
        rows += new
    for name in [n for n in chosen if n in SCRIPTS]:
        module, quick_args = SCRIPTS[name]
        print(f"\n[{name}] python -m {module}", flush=True)
        importlib.import_module(module).main(quick_args if args.quick else [])
    if args.out:
        header = f"Results ({'quick' if args.quick else 'full'} run): {env}"
        with open(args.out, "w") as f:
            f.write(markdown(rows, header))
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
