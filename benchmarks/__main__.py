"""``python -m benchmarks [--quick] [--only NAME ...] [--out FILE] [--record [--note TEXT]]``.

``--record``: a full run of every benchmark whose rows are saved to
``benchmarks/results/latest.json`` and rendered into README.md and
benchmarks/README.md (:mod:`benchmarks.record`)."""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from benchmarks import record
from benchmarks.suite import BENCHMARKS, FULL, QUICK
from benchmarks.util import Row, markdown

# Benchmarks with their own scripts (and their own tables), run after the suite:
# name -> (module, arguments of a quick run).
SCRIPTS = {
    "tar": ("benchmarks.tar_bench", ["--mb", "20", "--reads", "100", "--gz-reads-tfd", "3"]),
    "storage": ("benchmarks.storage_bench", ["--quick"]),
    "mirror-floor": ("benchmarks.mirror_floor", ["--rows", "100000", "--repeats", "3"]),
    "migrate": ("benchmarks.migrate_bench", ["--quick"]),
    "ray": ("benchmarks.ray_bench", ["--quick"]),
}


def environment(env: dict[str, object]) -> str:
    versions = env["versions"]
    assert isinstance(versions, dict)
    return (
        f"{env['date']}, {env['cpus']} CPUs, load {env['load_average_at_start']}, "
        f"Python {env['python']}, SQLite {env['sqlite']}, protobuf {versions['protobuf']}, "
        f"tfd-utils {versions['tfd-utils']}, git {env['commit']}{'-dirty' * bool(env['dirty'])}"
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
    parser.add_argument(
        "--record",
        action="store_true",
        help="run the suite (full sizes, no scripts), save it as benchmarks/results/latest.json "
        "and render the READMEs' tables from it",
    )
    parser.add_argument(
        "--note",
        default="a shared 2-core machine, other engineers' test suites running beside it (noisy)",
        help="what the record says of the machine",
    )
    args = parser.parse_args(argv)
    if args.record and (args.quick or args.only):
        parser.error("--record is a full run of every benchmark: no --quick, no --only")

    cfg = QUICK if args.quick else FULL
    env_record = record.environment(args.note)
    env = environment(env_record)
    print(f"shardcat benchmarks ({'quick' if args.quick else 'full'}): {env}", flush=True)
    rows: list[Row] = []
    # a record holds the suite's rows; the scripts print tables of their own
    chosen = args.only or ([*BENCHMARKS] if args.record else [*BENCHMARKS, *SCRIPTS])
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
    if args.record:
        record.write(rows, env_record)
        record.render()
        print(f"\nwrote {record.RECORD} and the tables of README.md and benchmarks/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
