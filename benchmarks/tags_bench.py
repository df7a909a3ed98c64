"""What a tag costs (issue 32, item 2): ``python -m benchmarks.tags_bench [--records N]``.

On generated TFRecord shards (:mod:`benchmarks.data`, 64-byte images, 16 shards)
ingested into a fresh catalog in a temporary directory: the time of
``Catalog.tag``, how much the catalog file grows with one tag (a tag reads the
dataset's rows by reference: shard rows and shares only), a re-ingest of one
changed shard with and without a tag on the dataset (with one, the re-ingest
first gives the tag its own copy of the rows, once), and reads through the tag
(``"train@v1"``, by reference) against the live dataset, round-robin with the same
random keys and positions: a checked ``get_feature`` by key, ``get_many`` of
1,000 keys and ``get_many_at`` of 1,000 positions (per record), and
``count(*) WHERE label < 10`` through each view. Ratios are tag / live.
``--json`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.data import DATASET, get_dataset, key_of
from benchmarks.util import round_robin, timed
from shardcat import Catalog


def _size(db: Path) -> int:
    return sum(os.path.getsize(f"{db}{s}") for s in ("", "-wal") if os.path.exists(f"{db}{s}"))


def run(records: int, rounds: int) -> dict[str, Any]:
    ds = get_dataset(records, shards=16, image_bytes=64)
    out: dict[str, Any] = {"records": records}
    with tempfile.TemporaryDirectory() as tmp:
        shards = Path(tmp) / "shards"
        shutil.copytree(ds.directory, shards, ignore=shutil.ignore_patterns("*.sqlite*", "*.index"))
        db = Path(tmp) / "c.sqlite"
        with Catalog(db) as cat:
            cat.ingest(str(shards / "*.tfrecord"), DATASET).close()
            cat.checkpoint()
            before = _size(db)
            out["tag_s"] = timed(lambda: cat.tag(DATASET, "v1"))
            cat.checkpoint()
            out["catalog_mb"] = before / 2**20
            out["growth_mb"] = (_size(db) - before) / 2**20
            out["reads"] = _reads(cat, records, rounds)
            out["reingest"] = _reingest(cat, sorted(shards.glob("*.tfrecord")))
    return out


def _reingest(cat: Catalog, files: list[Path]) -> dict[str, float]:
    """Seconds to re-ingest one changed shard (found by its stat, the others' unread):
    untagged (tag removed), then tagged (a fresh tag: the re-ingest copies its rows)."""
    times: dict[str, list[float]] = {"untagged": [], "tagged": []}
    glob = str(files[0].parent / "*.tfrecord")
    for n in range(3):
        for step, state in enumerate(("untagged", "tagged")):
            if state == "untagged":
                cat.untag(DATASET, "v1")
            else:
                cat.tag(DATASET, "v1")
            when = 10**18 + 2 * n + step  # one shard "changed", each time anew
            os.utime(files[n], ns=(when, when))
            times[state].append(timed(lambda: cat.ingest(glob, DATASET).close()))
    return {state: statistics.median(t) for state, t in times.items()}


def _reads(cat: Catalog, records: int, rounds: int) -> dict[str, dict[str, float]]:
    """Seconds per record (per query for ``count``): live, tag, and tag / live."""
    rng = random.Random(1)
    keys = [key_of(rng.randrange(records)) for _ in range(1000)]
    positions = [rng.randrange(records) for _ in range(1000)]
    live, tag = cat.dataset(DATASET), cat.dataset(f"{DATASET}@v1")
    cases = {
        "get_feature": lambda r: [r.get_feature(k, "image") for k in keys[:200]],
        "get_many": lambda r: r.get_many(keys),
        "get_many_at": lambda r: r.get_many_at(positions),
    }
    per = {"get_feature": 200, "get_many": 1000, "get_many_at": 1000}
    results: dict[str, dict[str, float]] = {}
    with live, tag:
        for case in cases.values():  # warm: every shard open, the pages read once
            case(live), case(tag)
        for name, case in cases.items():
            got = round_robin(
                {"live": lambda c=case: c(live), "tag": lambda c=case: c(tag)}, rounds, rotate=True
            )
            results[name] = {k: v / per[name] for k, v in got.items()}
        count = "SELECT count(*) FROM {} WHERE label < 10"
        got = round_robin(
            {
                "live": lambda: cat.query(count.format(DATASET)),
                "tag": lambda: cat.query(count.format(f'"{DATASET}@v1"')),
            },
            rounds,
            rotate=True,
        )
        results["count_where"] = got
    for row in results.values():
        row["ratio"] = row["tag"] / row["live"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    out = run(args.records, args.rounds)
    out["total_s"] = time.perf_counter() - start
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{out['records']:,} records, catalog {out['catalog_mb']:.1f} MB before the tag")
    print(f"tag: {out['tag_s']:.2f} s, catalog +{out['growth_mb']:.1f} MB")
    r = out["reingest"]
    print(f"re-ingest of one changed shard: untagged {r['untagged']:.2f} s, ", end="")
    print(f"tagged {r['tagged']:.2f} s")
    for name, row in out["reads"].items():
        print(
            f"{name}: live {row['live'] * 1e6:.2f} us, tag {row['tag'] * 1e6:.2f} us, "
            f"tag/live {row['ratio']:.2f}"
        )


if __name__ == "__main__":
    main()
