"""Instructions per call of the read hot path, for two trees: a count, not a time.

``python -m benchmarks.instructions --base f548e4c [--new TREE] [--calls 1000]``

Wall-clock ratios on this shared 2-core machine move by several percent between
runs (the control rows of :mod:`benchmarks.versus` show it). ``valgrind
--tool=callgrind`` counts the instructions a process executes instead, which is
the same from run to run for the same code and data whatever else the machine
does. Each measurement runs one fresh interpreter under callgrind that opens a
catalog built by that tree (its own schema) over the shards of
:mod:`benchmarks.hotpath`, warms up, then makes ``calls`` calls inside one
``collections.deque(map(...), maxlen=0)``: callgrind counts only while inside
``deque_init`` (``--collect-atstart=no --toggle-collect=deque_init``), so
start-up, open and warm-up are not counted, and with a fixed
``PYTHONHASHSEED`` two runs of the same tree agree to a few instructions in
millions. The count divided by the calls is the cost of one call.

Needs ``valgrind`` (Debian package ``valgrind``). Takes about 5 minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.hotpath import ensure_shards
from benchmarks.versus import ROOT, describe, git

DATA = ROOT / "benchmarks" / "data" / "hotpath-20000x1024b-4shards"
MEASURES = ("get_feature", "get_record", "get_record_at", "get_many", "get_many_at")
BATCH = 1000

# Run in each tree's interpreter: only API both trees have.
SCENARIO = """
import gc, os, random, sys
from collections import deque
from shardcat import Catalog
shards, db, what, n = sys.argv[1].split(os.pathsep), sys.argv[2], sys.argv[3], int(sys.argv[4])
if not os.path.exists(db):
    Catalog(db).ingest(shards, "train", workers=1).close()
reader = Catalog(db, readonly=True).dataset("train")
keys = reader.get_keys()
rng = random.Random(7)
sample = rng.sample(keys, 3000)
positions = [rng.randrange(len(reader)) for _ in range(3000)]
for key, pos in zip(sample[:300], positions[:300]):  # warm: caches, prepared statements
    reader.get_feature(key, "image"); reader.get_record(key); reader.get_record_at(pos)
reader.get_many(sample[:1000]); reader.get_many_at(positions[:1000])
calls = {
    "get_feature": (lambda key: reader.get_feature(key, "image"), sample),
    "get_record": (reader.get_record, sample),
    "get_record_at": (reader.get_record_at, positions),
    "get_many": (lambda i: reader.get_many(sample[i % 3 : i % 3 + 1000]), range(3000)),
    "get_many_at": (lambda i: reader.get_many_at(positions[i % 3 : i % 3 + 1000]), range(3000)),
}
gc.collect()
if what in calls:
    fn, args = calls[what]
    deque(map(fn, list(args)[:n]), maxlen=0)  # the only code callgrind counts
"""


def instructions(tree: Path, shards: list[str], db: Path, what: str, n: int) -> int:
    """Instructions of one interpreter running the scenario under callgrind."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "callgrind.out"
        env = {
            **os.environ,
            "PYTHONPATH": str(tree),
            "PYTHONPYCACHEPREFIX": scratch,
            "PYTHONHASHSEED": "0",
        }
        run = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--collect-atstart=no",
                "--toggle-collect=deque_init",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-P",
                "-c",
                SCENARIO,
                os.pathsep.join(shards),
                str(db),
                what,
                str(n),
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=scratch,
            check=False,
        )
        found = re.search(r"Collected : (\d+)", run.stderr)
        if run.returncode != 0 or found is None:
            raise SystemExit(f"callgrind run failed ({tree}, {what}):\n{run.stderr[-2000:]}")
        return int(found.group(1))


def per_call(tree: Path, shards: list[str], db: Path, calls: int) -> dict[str, float]:
    """Instructions per call (per record for the batches) of each measure."""
    instructions(tree, shards, db, "none", 0)  # builds the catalog, outside the counts
    out = {}
    for what in MEASURES:
        batches = what.startswith("get_many")
        n = max(1, calls // 200) if batches else calls
        out[what] = instructions(tree, shards, db, what, n) / (n * BATCH if batches else n)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="f548e4c", help="revision to compare against")
    p.add_argument("--new", default=str(ROOT), help="tree to measure (default: this one)")
    p.add_argument("--calls", type=int, default=1000, help="single calls per measure")
    args = p.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt install valgrind)")
    shards = ensure_shards(DATA, 20_000, 4, 1024)
    with tempfile.TemporaryDirectory() as work:
        base_tree = Path(work) / "base"
        git(ROOT, "worktree", "add", "--detach", str(base_tree), args.base)
        try:
            trees = {"before": base_tree, "after": Path(args.new).resolve()}
            counts = {
                side: per_call(tree, shards, Path(work) / f"{side}.sqlite", args.calls)
                for side, tree in trees.items()
            }
            names = {side: describe(tree) for side, tree in trees.items()}
        finally:
            git(ROOT, "worktree", "remove", "--force", str(base_tree))
    print(f"instructions per call: before = {names['before']}, after = {names['after']}\n")
    print("| measurement | before | after | after / before |")
    print("| --- | ---: | ---: | ---: |")
    for what in MEASURES:
        b, a = counts["before"][what], counts["after"][what]
        unit = " (per record)" if what.startswith("get_many") else ""
        print(f"| `{what}`{unit} | {b:,.0f} | {a:,.0f} | {a / b:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
