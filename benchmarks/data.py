"""Benchmark data: TFRecord shards written from pre-serialized templates, cached on disk.

Serializing a fresh ``Example`` per record costs more than everything else in
generation, so feature map entries are serialized ahead with
:func:`shardcat.make_example` (100 labels, ~1,000 scores, 16 images) and a
record is a few of them concatenated: the wire format of a protobuf map is
just its entries back to back. Only the key's digits are written per record.
"""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shardcat import Catalog, ShardcatError, TFRecordWriter, make_example

DATA_DIR = Path(__file__).resolve().parent / "data"
DATASET = "train"
Log = Callable[[str], None]
_KEY_TEMPLATE = "rec_%09d"
_KEY_PLACEHOLDER = b"rec_#########"


def key_of(i: int) -> str:
    return _KEY_TEMPLATE % i


def _entry(name: str, value: object) -> bytes:
    """One serialized ``Features.feature`` map entry (tag + length + body)."""
    return bytes(make_example({name: value}).features.SerializeToString())


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class RecordMaker:
    """Serialized ``Example`` bytes for record ``i`` (key, label and maybe score/image)."""

    def __init__(self, *, image_bytes: int = 0, seed: int = 0) -> None:
        rng = random.Random(seed)
        key_entry = _entry("key", _KEY_PLACEHOLDER)
        start = key_entry.index(_KEY_PLACEHOLDER) + len(b"rec_")
        self._key_head, self._key_tail = key_entry[:start], key_entry[start + 9 :]
        self._labels = [_entry("label", label) for label in range(100)]
        self._scores = [_entry("score", rng.random()) for _ in range(997)] if image_bytes else [b""]
        self._images = (
            [_entry("image", rng.randbytes(image_bytes)) for _ in range(16)]
            if image_bytes
            else [b""]
        )
        self._rng = rng

    def __call__(self, i: int) -> bytes:
        body = b"".join(
            (
                self._key_head,
                b"%09d" % i,
                self._key_tail,
                self._labels[self._rng.randrange(100)],
                self._scores[i % len(self._scores)],
                self._images[i % len(self._images)],
            )
        )
        return b"\x0a" + _varint(len(body)) + body


def _write_shards(directory: Path, records: int, shards: int, image_bytes: int) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    make = RecordMaker(image_bytes=image_bytes)
    per_shard = -(-records // shards)
    paths = []
    for s in range(shards):
        path = directory / f"{DATASET}-{s:05d}-of-{shards:05d}.tfrecord"
        with TFRecordWriter(path) as writer:
            for i in range(s * per_shard, min(records, (s + 1) * per_shard)):
                writer.write(make(i))
        paths.append(str(path))
    return paths


@dataclass(frozen=True)
class Dataset:
    """A generated shard set with its shardcat catalog and tfd-utils index paths."""

    directory: Path
    records: int
    shards: int
    image_bytes: int

    @property
    def glob(self) -> str:
        return str(self.directory / "*.tfrecord")

    @property
    def files(self) -> list[str]:
        return sorted(str(p) for p in self.directory.glob("*.tfrecord"))

    @property
    def catalog(self) -> Path:
        return self.directory / "catalog.sqlite"

    @property
    def tfd_index(self) -> Path:
        return self.directory / "tfd.index"

    @property
    def nbytes(self) -> int:
        return sum(os.path.getsize(f) for f in self.files)


def get_dataset(records: int, *, shards: int, image_bytes: int, log: Log = print) -> Dataset:
    """The shards for ``records`` records (generated once, then reused from DATA_DIR)."""
    name = f"{records}x{image_bytes}b-{shards}shards"
    directory = DATA_DIR / name
    done = directory / ".complete"
    if not done.exists():
        if directory.exists():
            shutil.rmtree(directory)
        log(f"  generating {records:,} records into {directory} ...")
        _write_shards(directory, records, shards, image_bytes)
        done.touch()
    return Dataset(directory, records, shards, image_bytes)


def remove_catalog(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _schema(catalog: Path) -> list[tuple[str, ...]]:
    """Every CREATE statement of a catalog (tables, indexes, the dataset's view)."""
    conn = sqlite3.connect(f"{catalog.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY type, name"
        ).fetchall()
    finally:
        conn.close()


def _reference_schema(ds: Dataset) -> list[tuple[str, ...]]:
    """The schema this shardcat creates for records like those of ``ds`` (10 of them)."""
    with tempfile.TemporaryDirectory() as tmp:
        shard = Path(tmp) / f"{DATASET}.tfrecord"
        make = RecordMaker(image_bytes=ds.image_bytes)
        with TFRecordWriter(shard) as writer:
            for i in range(10):
                writer.write(make(i))
        catalog = Path(tmp) / "reference.sqlite"
        with Catalog(catalog) as cat:
            cat.ingest(str(shard), dataset=DATASET, workers=1).close()
        return _schema(catalog)


def ensure_catalog(ds: Dataset, *, log: Log = print) -> None:
    """Ingest ``ds`` into its cached catalog unless a complete, current one is there.

    The cache is current when it holds every record and its schema (every
    CREATE statement, the dataset's view included) is what the shardcat in
    this tree creates today; other engineers change the schema as they go.
    """
    try:
        with Catalog(ds.catalog, readonly=True) as cat:
            complete = cat.info(DATASET).records == ds.records
        if complete and _schema(ds.catalog) == _reference_schema(ds):
            return
    except ShardcatError:
        pass  # missing, partial or from another schema version: rebuild
    remove_catalog(ds.catalog)
    log(f"  ingesting {ds.records:,} records into {ds.catalog} (cached for re-runs) ...")
    with Catalog(ds.catalog) as cat:
        cat.ingest(ds.glob, dataset=DATASET, workers=2).close()


def ensure_tfd_index(ds: Dataset, *, log: Log = print) -> None:
    """Build tfd-utils' pickle index for ``ds`` unless it is already there."""
    if ds.tfd_index.exists():
        return
    from benchmarks.util import quiet, tfd_reader

    log(f"  building the tfd-utils index {ds.tfd_index} (cached for re-runs) ...")
    with quiet():
        reader = tfd_reader(ds)
        len(reader)  # builds and saves the index
        reader.close()
