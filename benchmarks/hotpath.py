"""Hot-path read latency of one shardcat tree, with tfd-utils and the raw floor in the same run.

``python -m benchmarks.hotpath --data DIR [--json]`` (or ``python benchmarks/hotpath.py``).

The script imports ``shardcat`` from wherever ``sys.path`` finds it first
(``PYTHONPATH``), and nothing from the ``benchmarks`` package, so
:mod:`benchmarks.versus` can run this one file against an older tree that does
not have it. It uses only API that exists before and after the layered
restructure: ``Catalog(path).ingest(glob, "train")``, ``Catalog.dataset()``,
``TFRecordWriter``, ``make_example`` and the reader's ``get_*`` methods.

Steps: make the shards in ``DIR`` once (TFRecord, ``key`` + ``label`` + a
1 KB ``image``), and tfd-utils' index beside them once; ingest the shards into
a fresh catalog in a temporary directory (this tree's schema, never cached);
read every file once so all contenders start from a warm page cache; check
that every contender returns the same records; then time, round-robin with
the same random keys and positions for every contender:

- ``get_feature``: ``reader.get_feature(key, "image")``, per call;
- ``get_record`` / ``get_record_at``: the same records by key and by position;
- ``get_many`` / ``get_many_at``: batches of random keys / positions, per record;
- ``get_many_raw`` (payloads), ``get_dicts`` / ``get_dicts_at`` (``to_dict`` of each
  record) where the tree has them; ``decode_only``: ``Example.FromString`` of the
  batch's payloads (the floor of anything returning Examples); ``tfd_get_dicts``:
  tfd-utils' ``get_record`` plus the same conversion to dicts, per key;
- ``*_unchecked``: the same on a reader that trusts the bytes (``verify=False``;
  every read is checked against the catalog's CRC32C of the record by default,
  issue 26: the checked read's budget is 1.1x the unchecked one);
- ``tfd_get_feature`` / ``tfd_get_record``: tfd-utils 1.3.0 on the same shards;
- ``raw_key`` / ``raw_position``: the floor, a plain ``sqlite3`` point query
  (by ``dataset_id, key``, or by ``shard_id, ordinal``) + ``os.pread`` +
  ``Example.FromString`` (+ the feature's first value for ``raw_key``).

Single calls are timed one by one with ``perf_counter_ns`` (median and p90 over
all calls of all rounds); batches are timed whole and divided by their size
(median and p90 over batches). ``--json`` prints one JSON object:
``{"meta": {...}, "median_ns": {name: ns}, "p90_ns": {name: ns}}``.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import glob as globmod
import json
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

DATASET = "train"
TFRECORD_HEADER = 12  # uint64 length + uint32 CRC of the length
KEY_FORMAT = "rec_%09d"
BY_KEY = 'SELECT shard_id, "offset", length FROM shardcat_records WHERE dataset_id=? AND key=?'
# schema version 6 on: one records table per dataset
BY_KEY_6 = 'SELECT shard_id, "offset", length FROM "shardcat_records_{}" WHERE key=?'
BY_POSITION = 'SELECT "offset", length FROM shardcat_records WHERE shard_id=? AND ordinal=?'
BY_POSITION_6 = 'SELECT "offset", length FROM "shardcat_records_{}" WHERE shard_id=? AND ordinal=?'
SHARDS = (
    "SELECT id, path, first_position FROM shardcat_shards "
    "WHERE dataset_id=? ORDER BY first_position"
)
SINGLE = (
    "get_feature",
    "get_feature_unchecked",
    "get_record",
    "get_record_unchecked",
    "get_record_at",
    "tfd_get_feature",
    "tfd_get_record",
    "raw_key",
    "raw_position",
)
BATCH = ("get_many", "get_many_unchecked", "get_many_at", "get_many_at_unchecked")
# batches measured where the tree has them (issue 31, item 2), and their floors
EXTRA_BATCH = ("get_many_raw", "get_dicts", "get_dicts_at", "decode_only", "tfd_get_dicts")
DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "hotpath-20000x1024b-4shards"


def key_of(i: int) -> str:
    return KEY_FORMAT % i


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence stdout at the file-descriptor level (tfd-utils prints, also in its workers)."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- data -------------------------------------------------------------------------------


def ensure_shards(directory: Path, records: int, shards: int, image_bytes: int) -> list[str]:
    """The shards in ``directory``, written once (a ``.complete`` marker says they are whole)."""
    from shardcat import TFRecordWriter, make_example

    done = directory / ".complete"
    spec = f"{records} {shards} {image_bytes}\n"
    if done.exists() and done.read_text() == spec:
        return sorted(globmod.glob(str(directory / "*.tfrecord")))
    if done.exists() or any(directory.glob("*.tfrecord")):
        raise SystemExit(
            f"{directory} holds shards of another size ({done.read_text().strip() or '?'}"
            f" != {spec.strip()}): pass another --data or remove it"
        )
    log(f"writing {records:,} records of {image_bytes} B in {shards} shards to {directory} ...")
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    images = [rng.randbytes(image_bytes) for _ in range(16)]
    per_shard = -(-records // shards)
    for s in range(shards):
        path = directory / f"{DATASET}-{s:05d}-of-{shards:05d}.tfrecord"
        partial = path.with_suffix(".partial")
        with TFRecordWriter(partial) as writer:
            for i in range(s * per_shard, min(records, (s + 1) * per_shard)):
                example = make_example(
                    {"key": key_of(i).encode(), "label": i % 100, "image": images[i % 16]}
                )
                writer.write(example.SerializeToString())
        partial.rename(path)
    done.write_text(spec)
    return sorted(globmod.glob(str(directory / "*.tfrecord")))


def tfd_reader(pattern: str, index: Path) -> Any:
    """tfd-utils' reader with its index loaded (built and saved on the first run)."""
    from tfd_utils import TFRecordRandomAccess

    if not index.exists():
        log(f"building the tfd-utils index {index} (once) ...")
    with quiet():
        reader = TFRecordRandomAccess(pattern, index_file=str(index), progress_interval=10**9)
        len(reader)  # load (or build) the index now, not in the first timed call
    return reader


def warm(paths: Sequence[str | Path]) -> None:
    """Read every file once, so every contender reads from the page cache."""
    buffer = bytearray(8 << 20)
    for path in paths:
        if os.path.exists(path):
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buffer):
                    pass


# -- the raw floor ------------------------------------------------------------------------


class RawLookup:
    """The physical floor: a plain ``sqlite3`` point query + ``os.pread`` + ``Example`` parse."""

    def __init__(self, catalog: Path) -> None:
        from shardcat.pb2 import Example

        self.parse = Example.FromString
        self.conn = sqlite3.connect(f"{catalog.resolve().as_uri()}?mode=ro", uri=True)
        (self.dataset_id,) = self.conn.execute(
            "SELECT id FROM shardcat_datasets WHERE name = ?", (DATASET,)
        ).fetchone()
        table = f"shardcat_records_{self.dataset_id}"
        per_dataset = self.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE name = ?", (table,)
        ).fetchone()
        self.by_key = BY_KEY_6.format(self.dataset_id) if per_dataset else BY_KEY
        self.key_args: tuple[int, ...] = () if per_dataset else (self.dataset_id,)
        self.by_position = BY_POSITION_6.format(self.dataset_id) if per_dataset else BY_POSITION
        rows = self.conn.execute(SHARDS, (self.dataset_id,)).fetchall()
        self.fds = {
            sid: os.open(path if os.path.isabs(path) else catalog.parent / path, os.O_RDONLY)
            for sid, path, _ in rows
        }
        self.starts = [first for _, _, first in rows]
        self.ids = [sid for sid, _, _ in rows]

    def get_feature(self, key: str, name: str) -> Any:
        shard_id, offset, length = self.conn.execute(self.by_key, (*self.key_args, key)).fetchone()
        raw = os.pread(self.fds[shard_id], length, offset + TFRECORD_HEADER)
        feature = self.parse(raw).features.feature[name]
        return getattr(feature, feature.WhichOneof("kind")).value[0]

    def get_record_at(self, position: int) -> Any:
        i = bisect.bisect_right(self.starts, position) - 1
        shard_id = self.ids[i]
        offset, length = self.conn.execute(
            self.by_position, (shard_id, position - self.starts[i])
        ).fetchone()
        return self.parse(os.pread(self.fds[shard_id], length, offset + TFRECORD_HEADER))

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.conn.close()


# -- timing -------------------------------------------------------------------------------


def per_call_ns(fn: Callable[[Any], Any], args: Sequence[Any]) -> list[int]:
    clock = time.perf_counter_ns
    out = []
    for a in args:
        start = clock()
        fn(a)
        out.append(clock() - start)
    return out


def per_record_ns(fn: Callable[[Any], Any], batch: Sequence[Any]) -> float:
    start = time.perf_counter_ns()
    fn(batch)
    return (time.perf_counter_ns() - start) / len(batch)


def same(a: Any, b: Any) -> bool:
    return bool(a.SerializeToString(deterministic=True) == b.SerializeToString(deterministic=True))


def check(reader: Any, tfd: Any, raw: RawLookup, positions: list[int], batch: list[int]) -> None:
    """Every contender returns the same records (untimed; a wrong answer has no latency)."""
    for p in positions[:50]:
        k = key_of(p)
        by_key, by_pos, theirs = reader.get_record(k), reader.get_record_at(p), tfd.get_record(k)
        if not (
            same(by_key, by_pos) and same(by_key, theirs) and same(by_key, raw.get_record_at(p))
        ):
            raise SystemExit(f"contenders disagree on record {p} ({k})")
        image = reader.get_feature(k, "image")
        if not image == tfd.get_feature(k, "image") == raw.get_feature(k, "image"):
            raise SystemExit(f"contenders disagree on the image of {k}")
    many, many_at = reader.get_many([key_of(p) for p in batch]), reader.get_many_at(batch)
    if len(many) != len(batch) or not all(map(same, many, many_at)):
        raise SystemExit("get_many and get_many_at disagree")
    if not all(same(r, tfd.get_record(key_of(p))) for r, p in zip(many, batch, strict=True)):
        raise SystemExit("get_many disagrees with tfd-utils")


def tfd_dict(record: Any) -> dict[str, Any]:
    """A decoded Example as ``{feature: value}`` (``Reader.to_dict``), as a tfd-utils
    user converts one."""
    out = {}
    for name, feature in record.features.feature.items():
        kind = feature.WhichOneof("kind")
        values = list(getattr(feature, kind).value) if kind else []
        out[name] = values[0] if len(values) == 1 else values
    return out


def unchecked_reader(cat: Any) -> Any:
    """The dataset's reader trusting the bytes (trees before issue 26 never checked)."""
    try:
        return cat.dataset(DATASET, verify=False)
    except TypeError:
        return cat.dataset(DATASET)


def measure(
    reader: Any, unchecked: Any, tfd: Any, raw: RawLookup, args: argparse.Namespace, records: int
) -> dict[str, dict[str, float]]:
    """Median and p90 (ns) per measurement, contenders run round-robin."""
    rng = random.Random(args.seed)
    positions = rng.sample(range(records), args.calls)
    keys = [key_of(p) for p in positions]
    batches = [rng.sample(range(records), args.batch) for _ in range(args.batches)]
    key_batches = [[key_of(p) for p in b] for b in batches]
    check(reader, tfd, raw, positions, batches[0])

    single: dict[str, tuple[Callable[[Any], Any], list[Any]]] = {
        "get_feature": (lambda k: reader.get_feature(k, "image"), keys),
        "get_feature_unchecked": (lambda k: unchecked.get_feature(k, "image"), keys),
        "get_record": (reader.get_record, keys),
        "get_record_unchecked": (unchecked.get_record, keys),
        "get_record_at": (reader.get_record_at, positions),
        "tfd_get_feature": (lambda k: tfd.get_feature(k, "image"), keys),
        "tfd_get_record": (tfd.get_record, keys),
        "raw_key": (lambda k: raw.get_feature(k, "image"), keys),
        "raw_position": (raw.get_record_at, positions),
    }
    batch: dict[str, tuple[Callable[[Any], Any], list[list[Any]]]] = {
        "get_many": (reader.get_many, key_batches),
        "get_many_unchecked": (unchecked.get_many, key_batches),
        "get_many_at": (reader.get_many_at, batches),
        "get_many_at_unchecked": (unchecked.get_many_at, batches),
    }
    if hasattr(reader, "get_dicts"):  # trees with the batched training path
        from shardcat.pb2 import Example

        parse = Example.FromString
        payloads = [reader.get_many(b, raw=True) for b in key_batches]
        batch.update(
            {
                "get_many_raw": (lambda b: reader.get_many(b, raw=True), key_batches),
                "get_dicts": (reader.get_dicts, key_batches),
                "get_dicts_at": (reader.get_dicts_at, batches),
                "decode_only": (lambda p: [parse(r) for r in p], payloads),
                "tfd_get_dicts": (lambda b: [tfd_dict(tfd.get_record(k)) for k in b], key_batches),
            }
        )
    samples: dict[str, list[float]] = {name: [] for name in [*single, *batch]}
    names = list(single)
    for r in range(args.rounds + 1):  # round 0 warms caches, statements, descriptors
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn, inputs = single[name]
            got = per_call_ns(fn, inputs)
            if r:
                samples[name] += got
        for i in range(len(batches)):
            order = list(batch) if (r + i) % 2 else list(batch)[::-1]
            for name in order:
                fn, per_batch = batch[name]
                got_batch = per_record_ns(fn, per_batch[i])
                if r:
                    samples[name].append(got_batch)
    return {
        "median_ns": {k: statistics.median(v) for k, v in samples.items()},
        "p90_ns": {k: percentile(v, 0.9) for k, v in samples.items()},
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import shardcat
    from shardcat import Catalog

    data = Path(args.data).resolve()
    files = ensure_shards(data, args.records, args.shards, args.image_bytes)
    pattern = str(data / "*.tfrecord")
    tfd = tfd_reader(pattern, data / "tfd.index")
    if args.prepare:
        tfd.close()
        return {}
    with tempfile.TemporaryDirectory(prefix="shardcat-hotpath-") as tmp:
        path = Path(tmp) / "catalog.sqlite"
        start = time.perf_counter()
        cat = Catalog(path)
        cat.ingest(pattern, DATASET, workers=args.workers).close()
        ingest_s = time.perf_counter() - start
        reader = cat.dataset(DATASET)
        unchecked = unchecked_reader(cat)
        raw = RawLookup(path)
        try:
            if len(reader) != args.records:
                raise SystemExit(f"catalog holds {len(reader)} records, not {args.records}")
            warm([*files, path, f"{path}-wal", data / "tfd.index"])
            result: dict[str, Any] = dict(measure(reader, unchecked, tfd, raw, args, args.records))
        finally:
            raw.close()
            reader.close()
            unchecked.close()
            cat.close()
            tfd.close()
    result["meta"] = {
        "shardcat_file": str(Path(shardcat.__file__).resolve().parent),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "records": args.records,
        "shards": args.shards,
        "image_bytes": args.image_bytes,
        "calls": args.calls,
        "rounds": args.rounds,
        "batch": args.batch,
        "batches": args.batches,
        "ingest_s": ingest_s,
    }
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.hotpath",
        description="Hot-path read latency of the shardcat on sys.path, with tfd-utils and "
        "the raw sqlite3 + pread + parse floor in the same run.",
    )
    p.add_argument("--data", default=str(DEFAULT_DATA), help="shard directory (made once)")
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--image-bytes", type=int, default=1024)
    p.add_argument("--calls", type=int, default=5_000, help="random records per single-call pass")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
    p.add_argument("--batch", type=int, default=1_000, help="records per get_many batch")
    p.add_argument("--batches", type=int, default=20, help="batches per round")
    p.add_argument("--workers", type=int, default=2, help="ingest workers")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--prepare", action="store_true", help="only make the shards and tfd index")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.calls > args.records or args.batch > args.records:
        raise SystemExit("--calls and --batch must not exceed --records")
    result = run(args)
    if args.prepare:
        return 0
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    meta = result["meta"]
    print(f"shardcat from {meta['shardcat_file']}, {meta['records']:,} records")
    print(f"{'measurement':<22} {'median µs':>10} {'p90 µs':>10}")
    for name in [*SINGLE, *BATCH, *(n for n in EXTRA_BATCH if n in result["median_ns"])]:
        med, p90 = result["median_ns"][name] / 1e3, result["p90_ns"][name] / 1e3
        print(f"{name:<22} {med:>10.2f} {p90:>10.2f}")
    median = result["median_ns"]
    for name in ("get_feature", "get_record", "get_many", "get_many_at"):
        ratio = median[name] / median[f"{name}_unchecked"]
        print(f"checked / unchecked {name}: {ratio:.3f}x (budget 1.1x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
