"""The benchmarks: one function each, returning result rows.

Every comparison runs its contenders round-robin inside one call (A, B, C,
A, B, C, ...), so a noisy neighbour slows all of them alike, and reports
medians.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import statistics
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import crc32c

import shardcat
from benchmarks.data import (
    DATASET,
    Dataset,
    Log,
    ensure_catalog,
    ensure_tfd_index,
    get_dataset,
    key_of,
    remove_catalog,
)
from benchmarks.util import (
    Row,
    percentile,
    quiet,
    rotated,
    round_robin_times,
    spread,
    tfd_reader,
    timed,
)
from shardcat import Catalog
from shardcat.pb2 import Example

BY_KEY = 'SELECT shard_id, "offset", length FROM shardcat_records WHERE dataset_id=? AND key=?'
# schema version 6 on: one records table per dataset
BY_KEY_6 = 'SELECT shard_id, "offset", length FROM "shardcat_records_{}" WHERE key=?'
COUNT_SQL = f"SELECT count(*) FROM {DATASET} WHERE label < 10"
TFRECORD_HEADER = 12  # uint64 length + uint32 length CRC
U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class Config:
    """Sizes and repeat counts (``QUICK`` scales them down)."""

    ingest_records: int = 100_000
    image_bytes: int = 1024
    ingest_repeats: int = 5
    open_records: int = 5_000_000
    open_shards: int = 8
    open_repeats: int = 5
    get_calls: int = 20_000
    get_rounds: int = 3
    many_keys: int = 1_000
    many_repeats: int = 50
    many_budget: float = 60.0  # seconds; at least 3 batches either way
    sql_records: int = 1_000_000
    sql_repeats: int = 15
    tfd_label_subset: int = 100_000


FULL = Config()
QUICK = Config(
    ingest_records=20_000,
    ingest_repeats=3,
    open_records=500_000,
    open_repeats=3,
    get_calls=5_000,
    get_rounds=2,
    many_repeats=20,
    sql_records=500_000,
    sql_repeats=7,
    tfd_label_subset=20_000,
)


def record_dataset(cfg: Config, log: Log) -> Dataset:
    """The ~1 KB-record dataset of benchmarks 1, 3 and 4 (key, label, score, image)."""
    return get_dataset(cfg.ingest_records, shards=4, image_bytes=cfg.image_bytes, log=log)


def tiny_dataset(records: int, cfg: Config, log: Log) -> Dataset:
    """Key + label records (~44 bytes), indexed once by both tools and cached."""
    ds = get_dataset(records, shards=cfg.open_shards, image_bytes=0, log=log)
    ensure_catalog(ds, log=log)
    ensure_tfd_index(ds, log=log)
    return ds


# -- 1. ingest ---------------------------------------------------------------------


def bench_ingest(cfg: Config, log: Log) -> list[Row]:
    """Index 4 shards of ~1 KB records from scratch: shardcat vs tfd-utils vs reading once."""
    ds = record_dataset(cfg, log)
    files = ds.files
    catalog = ds.directory / "ingest-bench.sqlite"
    index = ds.directory / "ingest-bench.index"
    log(f"  {ds.records:,} records, {ds.nbytes / 1e6:.0f} MB in {len(files)} shards")

    def ingest(*, fields: bool = True, native: bool = True) -> Callable[[], None]:
        def run() -> None:
            remove_catalog(catalog)  # fresh every repeat (deleting takes well under 1 ms)
            os.environ["SHARDCAT_NATIVE"] = "1" if native else "0"  # the workers inherit it
            try:
                with Catalog(catalog) as cat:
                    cat.ingest(ds.glob, dataset=DATASET, workers=2, fields=fields).close()
            finally:
                os.environ.pop("SHARDCAT_NATIVE", None)

        return run

    def tfd_build() -> None:
        index.unlink(missing_ok=True)
        with quiet():
            reader = tfd_reader(ds, index, max_workers=2)
            reader._build_index()  # scan + pickle.dump, without the lock dance below
            reader.close()

    def tfd_open() -> None:
        index.unlink(missing_ok=True)
        with quiet():
            reader = tfd_reader(ds, index, max_workers=2)
            len(reader)  # what users run: lock file, 1 s verify sleep, build, save
            reader.close()

    def cat_files() -> None:
        subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)

    buffer = bytearray(8 << 20)

    def python_read() -> None:
        for path in files:
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buffer):
                    pass

    def python_read_crc() -> None:
        view = memoryview(buffer)
        for path in files:
            with open(path, "rb", buffering=0) as f:
                while n := f.readinto(buffer):
                    crc32c.crc32c(view[:n])

    def python_parse() -> None:
        """The least a verifying, field-extracting scan does: frame, CRC, parse each record."""
        for path in files:
            with open(path, "rb") as f:
                data = memoryview(f.read())
            pos = 0
            while pos < len(data):
                (length,) = U64.unpack_from(data, pos)
                payload = data[pos + TFRECORD_HEADER : pos + TFRECORD_HEADER + length]
                crc32c.crc32c(data[pos : pos + 8])
                crc32c.crc32c(payload)
                Example.FromString(payload)
                pos += TFRECORD_HEADER + length + 4

    times = round_robin_times(
        {
            "shardcat": ingest(),
            "shardcat_py": ingest(native=False),
            "shardcat_nofields": ingest(fields=False),
            "shardcat_py_nofields": ingest(fields=False, native=False),
            "tfd_build": tfd_build,
            "tfd_open": tfd_open,
            "cat": cat_files,
            "read": python_read,
            "read_crc": python_read_crc,
            "parse": python_parse,
        },
        cfg.ingest_repeats,
    )
    t = {k: statistics.median(v) for k, v in times.items()}
    remove_catalog(catalog)
    index.unlink(missing_ok=True)
    name = f"1. ingest {ds.records // 1000}k x 1 KB, 4 shards, 2 workers"
    sc, tfd = t["shardcat"], t["tfd_build"]

    def vs(ours: str, other: str) -> dict[str, Any]:
        return spread(times[ours], times[other])

    tfd_build = "tfd-utils index build"
    return [
        Row(name, "ingest time", "s", sc, tfd_build, tfd, 1, **vs("shardcat", "tfd_build")),
        Row(name, "ingest time, no fields", "s", t["shardcat_nofields"], tfd_build, tfd, 0.5,
            **vs("shardcat_nofields", "tfd_build")),
        Row(name, "ingest time, Python scan", "s", t["shardcat_py"], tfd_build, tfd,
            **vs("shardcat_py", "tfd_build")),
        Row(name, "ingest time, Python scan, no fields", "s", t["shardcat_py_nofields"],
            tfd_build, tfd, **vs("shardcat_py_nofields", "tfd_build")),
        Row(name, "ingest time", "s", sc, "shardcat's Python scan (SHARDCAT_NATIVE=0)",
            t["shardcat_py"], **vs("shardcat", "shardcat_py")),
        Row(name, "ingest time", "s", sc, "tfd-utils open (incl. its 1 s lock sleep)",
            t["tfd_open"], **vs("shardcat", "tfd_open")),
        Row(name, "ingest time", "s", sc, "`cat` > /dev/null", t["cat"], 2,
            **vs("shardcat", "cat")),
        Row(name, "ingest time", "s", sc, "Python read, 8 MB chunks", t["read"], 2,
            **vs("shardcat", "read")),
        Row(name, "ingest time", "s", sc, "Python read + CRC32C", t["read_crc"],
            **vs("shardcat", "read_crc")),
        Row(name, "ingest time", "s", sc, "Python frame + CRC + parse, 1 process", t["parse"],
            **vs("shardcat", "parse")),
    ]  # fmt: skip


# -- 2. open + first record ----------------------------------------------------------

# Peak RSS is the kernel's high-water mark of this process's memory map
# (VmHWM). ``getrusage(RUSAGE_SELF).ru_maxrss`` is no good here: Linux carries
# it over from the forking parent across exec, so every child would report at
# least the (large) RSS of the benchmark process that started it.
_PROBE = textwrap.dedent(
    """
    import json, time
    t0 = time.perf_counter()
    {imports}
    t1 = time.perf_counter()
    {body}
    t2 = time.perf_counter()
    with open("/proc/self/status") as f:
        hwm = next(int(x.split()[1]) for x in f if x.startswith("VmHWM:")) * 1024
    print("@@" + json.dumps({{"import": t1 - t0, "open": t2 - t1, "rss": hwm}}))
    """
)

# What an open of shardcat's needs imported: ``import shardcat`` alone loads nothing
# heavy (its names are imported when first used), so the import phase also loads the
# modules the open and the first read use, as ``import tfd_utils`` does for tfd-utils:
# "open + get" is then the open, and "import + open + get" the whole start-up.
_SHARDCAT_IMPORTS = (
    "import shardcat\n"
    "from shardcat import Catalog, TFRecordRandomAccess\n"
    "import shardcat.readers.reader, shardcat.formats.tfrecord, shardcat.pb2"
)

_OPEN_BODIES = {
    "shardcat": (
        _SHARDCAT_IMPORTS,
        "r = shardcat.TFRecordRandomAccess({glob!r}, index_file={catalog!r})\n"
        "assert r.get_record({key!r}) is not None",
    ),
    "shardcat_ro": (
        _SHARDCAT_IMPORTS,
        "r = shardcat.Catalog({catalog!r}, readonly=True).dataset({dataset!r})\n"
        "assert r.get_record({key!r}) is not None",
    ),
    "tfd": (
        "import tfd_utils",
        "r = tfd_utils.TFRecordRandomAccess({glob!r}, index_file={index!r})\n"
        "assert r.get_record({key!r}) is not None",
    ),
    "shardcat_import": (_SHARDCAT_IMPORTS, "pass"),
    "tfd_import": ("import tfd_utils", "pass"),
}


def _probe(kind: str, ds: Dataset) -> dict[str, float]:
    """Run one open-and-read in a fresh interpreter; its timings and peak RSS (bytes)."""
    imports, body = _OPEN_BODIES[kind]
    values = {
        "glob": ds.glob,
        "catalog": str(ds.catalog),
        "index": str(ds.tfd_index),
        "dataset": DATASET,
        "key": key_of(0),
    }
    code = _PROBE.format(imports=imports, body=body.format(**values))
    cwd = Path(__file__).resolve().parent.parent
    for attempt in (1, 2):  # one retry: other engineers save files under our feet
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd)
        if done.returncode == 0:
            line = next(x for x in done.stdout.splitlines() if x.startswith("@@"))
            return json.loads(line[2:])
        print(f"  probe {kind!r} failed (attempt {attempt}):\n{done.stderr[-2000:]}", flush=True)
    raise RuntimeError(f"the {kind!r} probe failed twice; see its error above")


def bench_open(cfg: Config, log: Log) -> list[Row]:
    """Open an indexed dataset and read one record, in a fresh process each time."""
    ds = tiny_dataset(cfg.open_records, cfg, log)
    log(
        f"  {ds.records:,} keys; tfd-utils index {ds.tfd_index.stat().st_size / 1e6:.0f} MB, "
        f"shardcat catalog {ds.catalog.stat().st_size / 1e6:.0f} MB"
    )
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in _OPEN_BODIES}
    for _ in range(cfg.open_repeats):
        for kind in _OPEN_BODIES:
            runs[kind].append(_probe(kind, ds))

    def med(kind: str, what: str) -> float:
        if what == "total":
            return statistics.median(r["import"] + r["open"] for r in runs[kind])
        return statistics.median(r[what] for r in runs[kind])

    mb = 1e6
    base = {tool: med(f"{tool}_import", "rss") / mb for tool in ("shardcat", "tfd")}
    log(
        f"  import only: peak RSS shardcat {base['shardcat']:.0f} MB, tfd-utils "
        f"{base['tfd']:.0f} MB; import time shardcat {med('shardcat_import', 'import') * 1e3:.0f}"
        f" ms, tfd-utils {med('tfd_import', 'import') * 1e3:.0f} ms"
    )
    name = f"2. open {ds.records / 1e6:g}M keys + first record (fresh process)"
    tfd_open = med("tfd", "open") * 1e3
    tfd_total = med("tfd", "total") * 1e3
    tfd_rss = med("tfd", "rss") / mb

    def vs(kind: str, what: str, other: str = "tfd") -> dict[str, Any]:
        return spread([r[what] for r in runs[kind]], [r[what] for r in runs[other]])

    rows = []
    for kind, how in (("shardcat", "drop-in"), ("shardcat_ro", "Catalog readonly")):
        sc_open = med(kind, "open") * 1e3
        sc_total = med(kind, "total") * 1e3
        sc_rss = med(kind, "rss") / mb
        rows += [
            Row(name, f"open + get ({how})", "ms", sc_open, "tfd-utils", tfd_open, 0.01,
                **vs(kind, "open")),
            Row(name, f"import + open + get ({how})", "ms", sc_total, "tfd-utils", tfd_total,
                rounds=cfg.open_repeats),
            Row(name, f"peak RSS ({how})", "MB", sc_rss, "tfd-utils", tfd_rss, 0.05,
                **vs(kind, "rss")),
            Row(name, f"peak RSS above import-only ({how})", "MB",
                sc_rss - base["shardcat"], "tfd-utils", tfd_rss - base["tfd"],
                rounds=cfg.open_repeats),
        ]  # fmt: skip
    return rows


# -- 3. single get_feature -------------------------------------------------------------


class RawLookup:
    """The physical reference: raw sqlite3 point query + os.pread + Example.FromString."""

    def __init__(self, catalog: Path) -> None:
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
        self.fds = {
            sid: os.open(path if os.path.isabs(path) else catalog.parent / path, os.O_RDONLY)
            for sid, path in self.conn.execute(
                "SELECT id, path FROM shardcat_shards WHERE dataset_id = ?", (self.dataset_id,)
            )
        }

    def get_feature(self, key: str, name: str) -> Any:
        shard_id, offset, length = self.conn.execute(self.by_key, (*self.key_args, key)).fetchone()
        raw = os.pread(self.fds[shard_id], length, offset + TFRECORD_HEADER)
        feature = Example.FromString(raw).features.feature[name]
        return getattr(feature, feature.WhichOneof("kind")).value[0]

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.conn.close()


def _readers(ds: Dataset, log: Log) -> tuple[Any, Any, RawLookup]:
    """shardcat's drop-in reader, tfd-utils' reader (index loaded), the raw reference."""
    ensure_catalog(ds, log=log)
    ensure_tfd_index(ds, log=log)
    sc = shardcat.TFRecordRandomAccess(ds.glob, index_file=ds.catalog)
    with quiet():
        tfd = tfd_reader(ds)
        len(tfd)  # load the pickle now, not inside the first timed call
    return sc, tfd, RawLookup(ds.catalog)


def _per_call_ns(fn: Callable[[str, str], Any], keys: list[str], feature: str) -> list[int]:
    clock = time.perf_counter_ns
    out = []
    for key in keys:
        start = clock()
        fn(key, feature)
        out.append(clock() - start)
    return out


def bench_get(cfg: Config, log: Log) -> list[Row]:
    """One ``get_feature(key, "image")`` per call over random keys, median and p90."""
    ds = record_dataset(cfg, log)
    sc, tfd, raw = _readers(ds, log)
    keys = [key_of(i) for i in random.Random(1).sample(range(ds.records), cfg.get_calls)]
    image = raw.get_feature(keys[0], "image")
    assert sc.get_feature(keys[0], "image") == tfd.get_feature(keys[0], "image") == image
    # every read is checked by default (issue 26); this one trusts the bytes
    unchecked = shardcat.TFRecordRandomAccess(ds.glob, index_file=ds.catalog, verify=False)
    assert unchecked.get_feature(keys[0], "image") == image
    contenders = {
        "shardcat": sc.get_feature,
        "unchecked": unchecked.get_feature,
        "tfd": tfd.get_feature,
        "raw": raw.get_feature,
    }
    for fn in contenders.values():  # warm page cache, sqlite cache, fds, statement cache
        _per_call_ns(fn, keys, "image")
    samples: dict[str, list[int]] = {k: [] for k in contenders}
    order = list(contenders)
    for r in range(cfg.get_rounds):  # who goes first rotating (the CPU's caches)
        for name in rotated(order, r):
            samples[name] += _per_call_ns(contenders[name], keys, "image")
    for reader in (sc, unchecked, tfd, raw):
        reader.close()
    med = {k: statistics.median(v) / 1e3 for k, v in samples.items()}
    n = len(keys)
    per_round = {  # each round's median, for the spread of the ratios
        k: [statistics.median(v[i * n : (i + 1) * n]) for i in range(cfg.get_rounds)]
        for k, v in samples.items()
    }

    def vs(ours: str, other: str) -> dict[str, Any]:
        return spread(per_round[ours], per_round[other])

    p90 = {k: percentile(v, 0.9) / 1e3 for k, v in samples.items()}
    name = f"3. get_feature(key, 'image'), {cfg.get_calls:,} random keys of {ds.records // 1000}k"
    raw_name = "raw sqlite3 + pread + parse"
    return [
        Row(name, "median per call", "µs", med["shardcat"], "tfd-utils", med["tfd"], 0.8,
            **vs("shardcat", "tfd")),
        Row(name, "median per call", "µs", med["shardcat"], raw_name, med["raw"], 2,
            **vs("shardcat", "raw")),
        Row(name, "p90 per call", "µs", p90["shardcat"], "tfd-utils", p90["tfd"],
            rounds=cfg.get_rounds),
        Row(name, "p90 per call", "µs", p90["shardcat"], raw_name, p90["raw"],
            rounds=cfg.get_rounds),
        Row(name, "median, checked", "µs", med["shardcat"], "shardcat verify=False",
            med["unchecked"], 1.1, **vs("shardcat", "unchecked")),
        Row(name, "median, verify=False", "µs", med["unchecked"], "tfd-utils", med["tfd"],
            **vs("unchecked", "tfd")),
    ]  # fmt: skip


# -- 4. get_many ----------------------------------------------------------------------------


def bench_many(cfg: Config, log: Log) -> list[Row]:
    """``get_many`` of 1,000 random keys, per key, vs tfd-utils' single ``get_record``."""
    ds = record_dataset(cfg, log)
    sc, tfd, raw = _readers(ds, log)
    raw.close()
    unchecked = shardcat.TFRecordRandomAccess(ds.glob, index_file=ds.catalog, verify=False)
    rng = random.Random(2)
    batches = [
        [key_of(i) for i in rng.sample(range(ds.records), cfg.many_keys)]
        for _ in range(cfg.many_repeats + 1)
    ]
    warm = batches.pop()  # untimed: warms caches and checks both return the same records
    ours, theirs = sc.get_many(warm), [tfd.get_record(k) for k in warm]
    assert [r.SerializeToString() for r in ours] == [r.SerializeToString() for r in theirs]
    times: dict[str, list[float]] = {"many": [], "unchecked": [], "tfd": [], "single": []}
    runs: dict[str, Callable[[list[str]], Any]] = {
        "many": sc.get_many,
        "unchecked": unchecked.get_many,
        "tfd": lambda k: [tfd.get_record(x) for x in k],
        "single": lambda k: [sc.get_record(x) for x in k],
    }
    order = list(runs)
    start = time.perf_counter()
    for n, keys in enumerate(batches):
        # each batch's keys for every contender, who goes first rotating: the next one
        # finds the same catalog pages and payloads in the CPU's caches
        for name in rotated(order, n):
            times[name].append(timed(lambda k=keys, f=runs[name]: f(k)))
        if len(times["many"]) >= 3 and time.perf_counter() - start > cfg.many_budget:
            log(f"  time budget spent: stopped after {len(times['many'])} batches")
            break
    sc.close()
    unchecked.close()
    tfd.close()
    per_key = {k: statistics.median(v) / cfg.many_keys * 1e6 for k, v in times.items()}
    name = f"4. get_many({cfg.many_keys:,} random keys), per key"
    return [
        Row(name, "per key", "µs", per_key["many"], "tfd-utils get_record loop", per_key["tfd"],
            max_ratio=1, **spread(times["many"], times["tfd"])),
        Row(name, "per key", "µs", per_key["many"], "shardcat get_record loop", per_key["single"],
            **spread(times["many"], times["single"])),
        Row(name, "per key, checked", "µs", per_key["many"], "shardcat verify=False",
            per_key["unchecked"], 1.1, **spread(times["many"], times["unchecked"])),
    ]  # fmt: skip


# -- 5. SQL filter ----------------------------------------------------------------------------


def indexed_copy(ds: Dataset, log: Log) -> Path:
    """A copy of the tiny dataset's catalog, beside it, with an index on ``label``
    (``Catalog.create_index``); made once and cached like the catalog itself."""
    copy = ds.catalog.with_name("sql-indexed.sqlite")
    if not copy.exists() or copy.stat().st_mtime < ds.catalog.stat().st_mtime:
        remove_catalog(copy)
        source = sqlite3.connect(f"{ds.catalog.resolve().as_uri()}?mode=ro", uri=True)
        target = sqlite3.connect(copy)
        source.backup(target)
        source.close()
        target.close()
        with Catalog(copy) as cat:
            build = timed(lambda: cat.create_index(DATASET, "label"))
        log(f"  create_index({DATASET!r}, 'label') over {ds.records:,} records: {build:.2f} s")
    return copy


def bench_sql(cfg: Config, log: Log) -> list[Row]:
    """``count(*) WHERE label < 10``: Catalog.query (index on label or not), raw sqlite3, tfd-utils.

    The indexed variant runs on a copy of the same catalog with ``create_index``'s
    index on ``label``, interleaved with the others in one run.
    """
    ds = tiny_dataset(cfg.sql_records, cfg, log)
    indexed_path = indexed_copy(ds, log)
    cat = Catalog(ds.catalog, readonly=True)
    indexed = Catalog(indexed_path, readonly=True)
    conn = sqlite3.connect(f"{ds.catalog.resolve().as_uri()}?mode=ro", uri=True)
    expected = conn.execute(COUNT_SQL).fetchone()[0]
    assert cat.query(COUNT_SQL)[0][0] == expected
    assert indexed.query(COUNT_SQL)[0][0] == expected
    assert indexed.info(DATASET).indexed == ["label"]
    for c in (cat, indexed):  # warm both files' pages
        c.query(f"SELECT count(*), sum(label) FROM {DATASET}")
    times = round_robin_times(
        {
            "shardcat": lambda: cat.query(COUNT_SQL),
            "indexed": lambda: indexed.query(COUNT_SQL),
            "raw": lambda: conn.execute(COUNT_SQL).fetchone(),
        },
        cfg.sql_repeats,
        rotate=True,
    )
    t = {k: statistics.median(v) for k, v in times.items()}
    cat.close()
    indexed.close()
    conn.close()

    # tfd-utils has no query: load the index, then parse every record's label.
    with quiet():
        reader = tfd_reader(ds)
        load = timed(lambda: len(reader))
    subset = list(islice(reader.index, cfg.tfd_label_subset))

    def count_labels() -> int:
        return sum(1 for key in subset if reader.get_feature(key, "label") < 10)

    scan = statistics.median(timed(count_labels) for _ in range(3))
    reader.close()
    tfd_total = load + scan * ds.records / len(subset)
    log(
        f"  count = {expected:,}; tfd-utils: index load {load * 1e3:.0f} ms + "
        f"{scan * 1e3:.0f} ms for {len(subset):,} labels, x{ds.records / len(subset):g}"
    )
    name = f"5. SQL count(*) WHERE label < 10 over {ds.records / 1e6:g}M records"
    sc_ms = t["shardcat"] * 1e3
    return [
        Row(name, "query time", "ms", sc_ms, "raw sqlite3", t["raw"] * 1e3,
            **spread(times["shardcat"], times["raw"])),
        Row(name, "query time, index on label", "ms", t["indexed"] * 1e3,
            "the same query without the index", sc_ms,
            **spread(times["indexed"], times["shardcat"])),
        Row(name, "query time", "ms", sc_ms, "tfd-utils load + parse all (extrapolated)",
            tfd_total * 1e3, max_value=200, rounds=cfg.sql_repeats),
    ]  # fmt: skip


BENCHMARKS: dict[str, Callable[[Config, Log], list[Row]]] = {
    "ingest": bench_ingest,
    "open": bench_open,
    "get": bench_get,
    "many": bench_many,
    "sql": bench_sql,
}
