"""Ingest cost per record at 1M, 10M and 30M records, scattered and sequential keys
(issue 12, item 3), and a filter count with an index on the field.

Tiny records (a 20-character ``key`` and an int64 ``label`` 0..99) in shards of
125,000, the shape where the catalog, not the scan, sets the cost:

- ``scattered`` keys start with a multiplicative hash of the record number,
  so every shard's keys spread over the whole key space (content hashes,
  round-robin shards); ``sequential`` keys sort in record order;
- *first ingest*: a fresh catalog, ``workers=2``: ns per record, and the
  ratio to the same kind at the smallest size (flat cost is 1.0);
- *add one shard*: one more 125k-record shard of the same kind ingested into
  the big dataset (the key index exists then: each key is an insert into it);
- *count*: ``count(*) WHERE label < 10`` (10% of the rows) through the view,
  with an index on ``label``, median of 5;
- ``--add-cache KIB ...``: only the *add one shard*, into copies of one big
  catalog, with the commit's SQLite page cache at each size in turn
  (``sqlite.COMMIT_CACHE_KIB``; 2048 is SQLite's default), ``--rounds`` times
  interleaved: median seconds and the ratio to the first size.

The shards are written once under ``benchmarks/data/scale-<kind>-<records>``
(fast: one serialized Example patched per record, CRCs by ``crc32c``).

Run: ``python -m benchmarks.scale --sizes 1000000 10000000 30000000``, or
``python -m benchmarks.scale --sizes 10000000 --keys scattered --add-cache 2048 65536``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import tempfile
import time
from pathlib import Path

import crc32c

from benchmarks.util import print_table
from shardcat import Catalog
from shardcat.catalog import sqlite
from shardcat.formats.tfrecord import make_example

DATA = Path(__file__).resolve().parent / "data"
SHARD = 125_000
KEY_CHARS = 20
_MASK = 0xA282EAD8


def masked(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK) & 0xFFFFFFFF


def key_of(kind: str, x: int) -> bytes:
    if kind == "sequential":
        return b"rec_%016d" % x
    return b"%08x_%011d" % ((x * 2654435761) % 4294967296, x)


def write_shard(path: Path, kind: str, first: int, n: int) -> None:
    """``n`` records from record number ``first``: one template, key and label patched."""
    template = make_example({"key": b"K" * KEY_CHARS, "label": 77}).SerializeToString()
    at_key = template.index(b"K" * KEY_CHARS)
    # int64_list { value: [77] } packed: the value is the last byte of 1a 03 0a 01 4d
    at_label = template.index(b"\x1a\x03\x0a\x01\x4d") + 4
    body = bytearray(template)
    header = struct.pack("<Q", len(body))
    header += struct.pack("<I", masked(header))
    out = bytearray()
    for x in range(first, first + n):
        body[at_key : at_key + KEY_CHARS] = key_of(kind, x)
        body[at_label] = x % 100
        out += header
        out += body
        out += struct.pack("<I", masked(bytes(body)))
    tmp = path.with_suffix(".part")
    tmp.write_bytes(out)
    tmp.rename(path)


def shards(kind: str, records: int) -> Path:
    directory = DATA / f"scale-{kind}-{records}"
    directory.mkdir(parents=True, exist_ok=True)
    for s in range(records // SHARD):
        path = directory / f"shard-{s:05d}.tfrecord"
        if not path.exists():
            write_shard(path, kind, s * SHARD, SHARD)
    extra = DATA / f"scale-{kind}-extra-{records}.tfrecord"  # the one shard added later
    if not extra.exists():
        write_shard(extra, kind, records, SHARD)
    return directory


def warm(directory: Path) -> None:
    for path in sorted(directory.glob("*.tfrecord")):
        with open(path, "rb") as f:
            while f.read(8 << 20):
                pass


def measure(kind: str, records: int, workers: int) -> dict[str, float]:
    directory = shards(kind, records)
    extra = DATA / f"scale-{kind}-extra-{records}.tfrecord"
    work = Path(tempfile.mkdtemp(prefix="scale-", dir=DATA))
    try:
        catalog = work / "c.sqlite"
        warm(directory)
        with Catalog(catalog) as cat:
            start = time.perf_counter()
            cat.ingest(str(directory / "*.tfrecord"), "d", workers=workers).close()
            first = time.perf_counter() - start
            link = directory / "zz-extra.tfrecord"
            if link.exists() or link.is_symlink():
                link.unlink()
            os.symlink(extra, link)
            try:
                start = time.perf_counter()
                cat.ingest(str(directory / "*.tfrecord"), "d", workers=workers).close()
                add = time.perf_counter() - start
                cat.create_index("d", "label")
                counts = []
                for _ in range(6):
                    start = time.perf_counter()
                    (n,) = cat.query("SELECT count(*) FROM d WHERE label < 10")[0]
                    counts.append(time.perf_counter() - start)
                assert n == (records + SHARD) // 10, n
                with cat.dataset("d") as reader:  # the records are the ones written
                    for x in (0, records // 2, records + SHARD - 1):
                        assert reader.get_feature(key_of(kind, x).decode(), "label") == x % 100
            finally:
                link.unlink()
        return {
            "first": first,
            "ns": first / records * 1e9,
            "add": add,
            "count_ms": statistics.median(counts[1:]) * 1e3,
            "bytes": catalog.stat().st_size / (records + SHARD),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def add_cache(kind: str, records: int, caches: list[int], rounds: int, workers: int) -> None:
    """The *add one shard* of :func:`measure` into copies of one catalog of
    ``records``, with the commit's page cache at each of ``caches`` KiB in turn."""
    directory = shards(kind, records)
    extra = DATA / f"scale-{kind}-extra-{records}.tfrecord"
    work = Path(tempfile.mkdtemp(prefix="scale-", dir=DATA))
    link = directory / "zz-extra.tfrecord"
    times: dict[int, list[float]] = {c: [] for c in caches}
    try:
        base = work / "base.sqlite"
        with Catalog(base) as cat:
            cat.ingest(str(directory / "*.tfrecord"), "d", workers=workers).close()
            cat.checkpoint()
        if link.exists() or link.is_symlink():
            link.unlink()
        os.symlink(extra, link)
        for _ in range(rounds):
            for cache in caches:
                copy = work / "copy.sqlite"
                for leftover in work.glob("copy.sqlite*"):
                    leftover.unlink()
                shutil.copyfile(base, copy)
                warm(directory)
                with open(copy, "rb") as f:  # the catalog's pages in the page cache too
                    while f.read(8 << 20):
                        pass
                sqlite.COMMIT_CACHE_KIB = cache  # read at each commit; workers fork after
                with Catalog(copy) as cat:
                    start = time.perf_counter()
                    cat.ingest(str(directory / "*.tfrecord"), "d", workers=workers).close()
                    times[cache].append(time.perf_counter() - start)
                print(f"{kind} {records:,} cache {cache} KiB: {times[cache][-1]:.2f} s", flush=True)
    finally:
        if link.is_symlink():
            link.unlink()
        shutil.rmtree(work, ignore_errors=True)
    first = statistics.median(times[caches[0]])
    print_table(
        ("keys", "records", "commit cache KiB", "add one 125k shard s (median)", "ratio"),
        [
            (
                kind,
                f"{records:,}",
                str(c),
                f"{statistics.median(times[c]):.2f}",
                f"{statistics.median(times[c]) / first:.2f}",
            )
            for c in caches
        ],
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    p.add_argument("--keys", nargs="+", default=["scattered", "sequential"])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--add-cache", type=int, nargs="+", metavar="KIB")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if args.add_cache:
        for kind in args.keys:
            for records in args.sizes:
                add_cache(kind, records, args.add_cache, args.rounds, args.workers)
        return
    rows = []
    base: dict[str, float] = {}
    for kind in args.keys:
        for records in args.sizes:
            r = measure(kind, records, args.workers)
            base.setdefault(kind, r["ns"])
            rows.append(
                (
                    kind,
                    f"{records:,}",
                    f"{r['first']:.2f}",
                    f"{r['ns']:.0f}",
                    f"{r['ns'] / base[kind]:.2f}",
                    f"{r['add']:.2f}",
                    f"{r['count_ms']:.1f}",
                    f"{r['bytes']:.1f}",
                )
            )
            print(" | ".join(rows[-1]), flush=True)
    print()
    print_table(
        (
            "keys",
            "records",
            "first ingest s",
            "ns/record",
            "vs smallest",
            "add one 125k shard s",
            "count(*) label<10 ms",
            "catalog bytes/record",
        ),
        rows,
    )


if __name__ == "__main__":
    main()
