"""Ingest: shard sync, positions, duplicates, corruption, keys, concurrency, crashes."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shardcat.catalog.engine as engine_mod
from shardcat import (
    Catalog,
    CatalogError,
    IngestError,
    KeyNotFoundError,
    SchemaVersionError,
    TFRecordWriter,
    make_example,
)
from shardcat.catalog.engine import DEFAULT_NAME, locate
from shardcat.catalog.versions import SCHEMA_VERSION
from shardcat.formats.registry import known_formats

# -- helpers -------------------------------------------------------------------


def write_shard(path: Path, records: list[dict[str, Any]]) -> list[tuple[int, bytes]]:
    """Write ``records`` as Examples; returns (frame offset, payload bytes) per record."""
    out = []
    with TFRecordWriter(path) as writer:
        for rec in records:
            data = make_example(rec).SerializeToString()
            out.append((writer.write(data), data))
    return out


def make_records(prefix: str, n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "key": f"{prefix}{i:04d}",
            "label": i % 7,
            "value": i,
            "src": f"{prefix}#{i}",
            "payload": bytes([0xFF, i % 256]) * 40,  # not UTF-8: never a SQL field
        }
        for i in range(start, start + n)
    ]


def write_set(directory: Path, sizes: list[int], prefix: str = "part") -> dict[str, Any]:
    """Shards ``<prefix>-0000i.tfrecord``; returns paths, records and frames per shard."""
    directory.mkdir(parents=True, exist_ok=True)
    paths, records, frames = [], [], []
    start = 0
    for i, n in enumerate(sizes):
        path = directory / f"{prefix}-{i:05d}.tfrecord"
        recs = make_records(f"s{i}_", n, start)
        frames.append(write_shard(path, recs))
        paths.append(path)
        records.append(recs)
        start += n
    return {"paths": paths, "records": records, "frames": frames}


def all_keys(data: dict[str, Any]) -> list[str]:
    return [r["key"] for recs in data["records"] for r in recs]


def view_rows(cat: Catalog, name: str) -> list[tuple[Any, ...]]:
    return list(cat.query(f'SELECT key, position, shard FROM "{name}" ORDER BY position'))


def assert_contiguous(cat: Catalog, name: str, expected_keys: list[str]) -> None:
    """The view, the reader and the records agree: positions 0..n-1, keys in order."""
    rows = view_rows(cat, name)
    assert [r[1] for r in rows] == list(range(len(expected_keys)))
    assert [r[0] for r in rows] == expected_keys
    with cat.dataset(name) as reader:
        assert len(reader) == len(expected_keys)
        assert list(reader.iter_keys()) == expected_keys
        for position, key in enumerate(expected_keys):
            assert reader.key_at(position) == key
            assert reader.to_dict(reader.get_record_at(position))["key"] == key.encode()


def shard_table(path: Path) -> dict[str, dict[str, Any]]:
    """The shards table read with plain sqlite3: stored path -> row."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        conn.row_factory = sqlite3.Row
        return {r["path"]: dict(r) for r in conn.execute("SELECT * FROM shardcat_shards")}
    finally:
        conn.close()


class Progress:
    """A progress callback that remembers which shards this process indexed."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.totals: set[int] = set()
        self.outcomes: list[Any] = []

    def __call__(self, outcome: Any, total: int) -> None:
        self.outcomes.append(outcome)
        self.paths.append(outcome.path)
        self.totals.add(total)


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail instead of hanging when the block takes longer than ``seconds``."""

    def expired(*_: object) -> None:
        raise TimeoutError(f"took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# -- 1. basic ingest, stored paths, moving the directory ------------------------


def test_basic_ingest_counts_keys_offsets_and_bytes(tmp_path: Path) -> None:
    data = write_set(tmp_path / "ds", [5, 7, 4])
    db = tmp_path / "ds" / DEFAULT_NAME
    progress = Progress()
    with Catalog(db) as cat:
        with cat.ingest(str(tmp_path / "ds" / "*.tfrecord"), "train", progress=progress) as r:
            assert len(r) == 16
            assert list(r.iter_keys()) == all_keys(data)
        assert sorted(progress.paths) == [p.name for p in data["paths"]]
        assert progress.totals == {3}
        assert all(o.error is None for o in progress.outcomes)
        assert sorted(o.records for o in progress.outcomes) == [4, 5, 7]

        (info,) = cat.datasets()
        assert (info.name, info.format, info.key_rule) == ("train", "tfrecord", "feature:key")
        assert (info.shards, info.ready_shards, info.failed_shards, info.records) == (3, 3, 0, 16)
        assert info.fields == {"label": "integer", "value": "integer", "src": "text"}
        assert info.source == ["*.tfrecord"]

        assert_contiguous(cat, "train", all_keys(data))
        # Stored shard paths are relative to the catalog directory (it lies above them).
        shards = [r[2] for r in view_rows(cat, "train")]
        expected = [
            p.name for p, recs in zip(data["paths"], data["records"], strict=True) for _ in recs
        ]
        assert shards == expected

        # Byte offsets and lengths are exactly where the writer put each frame.
        got = {
            row[0]: (row[1], row[2], row[3])
            for row in cat.query(
                'SELECT r.key, s.path, r."offset", r.length FROM shardcat_records_1 r '
                "JOIN shardcat_shards s ON s.id = r.shard_id"
            )
        }
        for path, recs, frames in zip(data["paths"], data["records"], data["frames"], strict=True):
            for rec, (offset, payload) in zip(recs, frames, strict=True):
                assert got[rec["key"]] == (path.name, offset, len(payload))

        with cat.dataset("train") as reader:
            for recs, frames in zip(data["records"], data["frames"], strict=True):
                for rec, (_, payload) in zip(recs, frames, strict=True):
                    assert reader.get_raw(rec["key"]) == payload
                    assert reader.get_feature(rec["key"], "payload") == rec["payload"]
                    assert reader.get_feature(rec["key"], "value") == rec["value"]
            assert reader.get_record("nope") is None
            with pytest.raises(KeyNotFoundError, match="'nope'"):
                reader["nope"]
            many = reader.get_many(["s2_0015", "s0_0000"], raw=True)
            assert many == [data["frames"][2][3][1], data["frames"][0][0][1]]


def test_shard_paths_absolute_when_not_below_catalog(tmp_path: Path) -> None:
    data = write_set(tmp_path / "data", [3, 2])
    with Catalog(tmp_path / "elsewhere" / "cat.sqlite") as cat:
        cat.ingest([str(p) for p in data["paths"]], "train").close()
        shards = sorted({r[2] for r in view_rows(cat, "train")})
        assert shards == [str(p) for p in data["paths"]]
        assert all(os.path.isabs(s) for s in shards)
        (info,) = cat.datasets()
        assert info.source == [str(p) for p in data["paths"]]


def test_moved_directory_stays_readable_without_reindexing(tmp_path: Path) -> None:
    data = write_set(tmp_path / "ds", [4, 4, 4])
    with Catalog(tmp_path / "ds" / DEFAULT_NAME) as cat:
        cat.ingest(str(tmp_path / "ds" / "*.tfrecord"), "train").close()
    before = shard_table(tmp_path / "ds" / DEFAULT_NAME)

    os.rename(tmp_path / "ds", tmp_path / "moved")  # keeps every mtime
    assert not (tmp_path / "ds").exists()
    moved_db = tmp_path / "moved" / DEFAULT_NAME
    with Catalog(moved_db) as cat:
        with cat.dataset("train") as reader:
            assert list(reader.iter_keys()) == all_keys(data)
            for recs, frames in zip(data["records"], data["frames"], strict=True):
                for rec, (_, payload) in zip(recs, frames, strict=True):
                    assert reader.get_raw(rec["key"]) == payload
        progress = Progress()
        with cat.ingest(str(tmp_path / "moved" / "*.tfrecord"), "train", progress=progress) as r:
            assert len(r) == 12
        assert progress.paths == []  # nothing re-indexed
        assert_contiguous(cat, "train", all_keys(data))
    after = shard_table(moved_db)
    assert {p: r["indexed_at"] for p, r in after.items()} == {
        p: r["indexed_at"] for p, r in before.items()
    }


# -- 2. schema version ------------------------------------------------------------


def _meta_version(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        (value,) = conn.execute(
            "SELECT value FROM shardcat_meta WHERE name = 'schema_version'"
        ).fetchone()
        return str(value)
    finally:
        conn.close()


def _dump(db: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def test_schema_version_recorded_and_open_does_not_change_it(tmp_path: Path) -> None:
    data = write_set(tmp_path, [3])
    db = tmp_path / "cat.sqlite"
    with Catalog(db) as cat:
        cat.ingest(str(data["paths"][0]), "train").close()
    assert _meta_version(db) == str(SCHEMA_VERSION)
    dump = _dump(db)
    with Catalog(db) as cat:
        assert [d.name for d in cat.datasets()] == ["train"]
    with Catalog(db, readonly=True) as cat:
        assert cat.datasets()[0].records == 3
    assert _meta_version(db) == str(SCHEMA_VERSION)
    assert _dump(db) == dump


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "cat.sqlite"
    Catalog(db).close()
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(
            "UPDATE shardcat_meta SET value = ? WHERE name = 'schema_version'",
            (str(SCHEMA_VERSION + 1),),
        )
    conn.close()
    dump = _dump(db)
    with pytest.raises(SchemaVersionError, match="upgrade shardcat") as err:
        Catalog(db)
    assert f"version {SCHEMA_VERSION + 1}" in str(err.value)
    assert str(db) in str(err.value)
    with pytest.raises(SchemaVersionError, match="upgrade shardcat") as err:
        Catalog(db, readonly=True)
    assert str(SCHEMA_VERSION + 1) in str(err.value)
    assert isinstance(err.value, RuntimeError)
    assert _meta_version(db) == str(SCHEMA_VERSION + 1)  # left alone
    assert _dump(db) == dump


# -- 3. incremental re-ingest --------------------------------------------------------


def test_incremental_reingest(tmp_path: Path) -> None:
    data = write_set(tmp_path, [4, 5, 3])
    db = tmp_path / DEFAULT_NAME
    pattern = str(tmp_path / "*.tfrecord")
    names = [p.name for p in data["paths"]]
    with Catalog(db) as cat:
        cat.ingest(pattern, "train").close()
        first = shard_table(db)
        assert {p: r["state"] for p, r in first.items()} == dict.fromkeys(names, "ready")

        # Unchanged: nothing indexed, nothing rewritten.
        progress = Progress()
        cat.ingest(pattern, "train", progress=progress).close()
        assert progress.paths == []
        assert shard_table(db) == first

        # Added shard: only it is indexed; it lands after the others (path order).
        new = tmp_path / "part-00003.tfrecord"
        write_shard(new, make_records("s3_", 2, 100))
        progress = Progress()
        with cat.ingest(pattern, "train", progress=progress) as reader:
            assert len(reader) == 14
        assert progress.paths == [new.name]
        second = shard_table(db)
        for name in names:
            assert second[name]["indexed_at"] == first[name]["indexed_at"]
        keys = [*all_keys(data), "s3_0100", "s3_0101"]
        assert_contiguous(cat, "train", keys)

        # Changed shard: re-indexed, its old keys are gone, its new ones in place.
        changed = data["paths"][1]
        old_mtime = changed.stat().st_mtime_ns
        write_shard(changed, make_records("new_", 3, 50))
        os.utime(changed, ns=(old_mtime + 2_000_000_000, old_mtime + 2_000_000_000))
        progress = Progress()
        with cat.ingest(pattern, "train", progress=progress) as reader:
            assert len(reader) == 4 + 3 + 3 + 2
            assert reader.get_record("s1_0004") is None
            assert "s1_0004" not in reader
            assert reader.get_feature("new_0051", "value") == 51
        assert progress.paths == [changed.name]
        third = shard_table(db)
        assert third[changed.name]["indexed_at"] > second[changed.name]["indexed_at"]
        assert third[changed.name]["num_records"] == 3
        for name in (names[0], names[2], new.name):
            assert third[name]["indexed_at"] == second[name]["indexed_at"]
        keys = [
            *all_keys(data)[:4],
            "new_0050",
            "new_0051",
            "new_0052",
            *all_keys(data)[9:],
            "s3_0100",
            "s3_0101",
        ]
        assert_contiguous(cat, "train", keys)
        assert cat.query("SELECT count(*) FROM shardcat_records_1 WHERE key LIKE 's1_%'") == [(0,)]

        # Removed shard: its keys and its row are dropped.
        data["paths"][0].unlink()
        progress = Progress()
        with cat.ingest(pattern, "train", progress=progress) as reader:
            assert len(reader) == 3 + 3 + 2
            assert reader.get_record("s0_0000") is None
        assert progress.paths == []
        assert names[0] not in shard_table(db)
        keys = keys[4:]
        assert_contiguous(cat, "train", keys)
        assert cat.query("SELECT count(*) FROM shardcat_records_1 WHERE key LIKE 's0_%'") == [(0,)]
        assert cat.datasets()[0].shards == 3

        # rescan=True re-indexes everything, the result is the same.
        progress = Progress()
        cat.ingest(pattern, "train", rescan=True, progress=progress).close()
        assert sorted(progress.paths) == sorted([names[1], names[2], new.name])
        assert_contiguous(cat, "train", keys)


# -- 4. duplicate keys --------------------------------------------------------------


def test_duplicate_key_within_one_shard(tmp_path: Path) -> None:
    good = write_set(tmp_path, [3])
    bad = tmp_path / "zz-dup.tfrecord"
    frames = write_shard(
        bad,
        [
            {"key": "k0", "src": "first"},
            {"key": "k1", "src": "x"},
            {"key": "k0", "src": "second"},
        ],
    )
    with Catalog(tmp_path / DEFAULT_NAME) as cat:
        with pytest.raises(IngestError) as err:
            cat.ingest(str(tmp_path / "*.tfrecord"), "train")
        message = str(err.value)
        assert "'k0'" in message
        assert bad.name in message
        assert f"bytes {frames[0][0]} and {frames[2][0]}" in message
        assert [f.path for f in err.value.failures] == [bad.name]
        (info,) = cat.datasets()
        assert (info.ready_shards, info.failed_shards, info.records) == (1, 1, 3)
        assert_contiguous(cat, "train", all_keys(good))
        with cat.dataset("train") as reader:
            assert reader.get_raw("s0_0002") == good["frames"][0][2][1]
            assert "k1" not in reader


def test_duplicate_key_across_shards_names_both_places(tmp_path: Path) -> None:
    a = tmp_path / "a.tfrecord"
    b = tmp_path / "b.tfrecord"
    c = tmp_path / "c.tfrecord"
    fa = write_shard(a, [{"key": "a0"}, {"key": "shared"}])
    fb = write_shard(b, [{"key": "b0"}, {"key": "b1"}, {"key": "shared"}])
    write_shard(c, [{"key": "c0"}])
    with Catalog(tmp_path / DEFAULT_NAME) as cat:
        with pytest.raises(IngestError) as err:
            cat.ingest(str(tmp_path / "*.tfrecord"), "train", workers=1)
        message = str(err.value)
        assert "duplicate key 'shared'" in message
        # Whichever shard was committed first, both places are named.
        assert f"in a.tfrecord at byte {fa[1][0]}" in message
        assert f"in b.tfrecord at byte {fb[2][0]}" in message
        assert len(err.value.failures) == 1
        failed = err.value.failures[0].path
        assert failed in ("a.tfrecord", "b.tfrecord")
        (info,) = cat.datasets()
        assert (info.shards, info.ready_shards, info.failed_shards) == (3, 2, 1)
        expected = {"a.tfrecord": ["a0", "shared"], "b.tfrecord": ["b0", "b1", "shared"]}
        expected[failed] = []
        keys = expected["a.tfrecord"] + expected["b.tfrecord"] + ["c0"]
        assert_contiguous(cat, "train", keys)
        assert shard_table(tmp_path / DEFAULT_NAME)[failed]["error"] == message


def _dup_shards(tmp_path: Path) -> tuple[Path, Path]:
    a = tmp_path / "a.tfrecord"
    b = tmp_path / "b.tfrecord"
    write_shard(
        a,
        [
            {"key": "u0", "src": "a0"},
            {"key": "shared1", "src": "a1"},
            {"key": "u1", "src": "a2"},
            {"key": "dupA", "src": "a3"},
            {"key": "shared2", "src": "a4"},
            {"key": "dupA", "src": "a5"},
        ],
    )
    write_shard(
        b,
        [
            {"key": "shared1", "src": "b0"},
            {"key": "u2", "src": "b1"},
            {"key": "shared2", "src": "b2"},
            {"key": "u3", "src": "b3"},
        ],
    )
    return a, b


# (key, src) in position order for each policy
_DUP_EXPECTED = {
    "first": [
        ("u0", "a0"),
        ("shared1", "a1"),
        ("u1", "a2"),
        ("dupA", "a3"),
        ("shared2", "a4"),
        ("u2", "b1"),
        ("u3", "b3"),
    ],
    "last": [
        ("u0", "a0"),
        ("u1", "a2"),
        ("dupA", "a5"),
        ("shared1", "b0"),
        ("u2", "b1"),
        ("shared2", "b2"),
        ("u3", "b3"),
    ],
}


@pytest.mark.parametrize("policy", ["first", "last"])
@pytest.mark.parametrize("order", ["together", "b_indexed_first"])
def test_on_duplicate_first_last(tmp_path: Path, policy: str, order: str) -> None:
    a, b = _dup_shards(tmp_path)
    db = tmp_path / DEFAULT_NAME
    with Catalog(db) as cat:
        if order == "b_indexed_first":
            cat.ingest(str(b), "train", on_duplicate=policy).close()
        with cat.ingest([str(a), str(b)], "train", on_duplicate=policy, workers=1) as reader:
            expected = _DUP_EXPECTED[policy]
            assert len(reader) == 7
            for key, src in expected:
                assert reader.get_feature(key, "src") == src.encode()
            for position, (key, src) in enumerate(expected):
                record = reader.to_dict(reader.get_record_at(position))
                assert (record["key"], record["src"]) == (key.encode(), src.encode())
        assert_contiguous(cat, "train", [k for k, _ in expected])
        rows = cat.query('SELECT key, src FROM "train" ORDER BY position')
        assert rows == expected
        shards = shard_table(db)
        assert sum(s["num_records"] for s in shards.values()) == 7
        assert cat.query("SELECT count(*) FROM shardcat_records_1") == [(7,)]
        assert cat.datasets()[0].records == 7


# -- 5. corrupt shards --------------------------------------------------------------


def test_corrupt_shards_are_reported_and_others_committed(tmp_path: Path) -> None:
    data = write_set(tmp_path, [4, 5, 6, 3])
    flipped, truncated = data["paths"][1], data["paths"][2]
    flip_at = data["frames"][1][2][0]  # frame offset of record 2
    raw = bytearray(flipped.read_bytes())
    raw[flip_at + 12 + 5] ^= 0x40  # a payload byte: the data CRC no longer matches
    flipped.write_bytes(bytes(raw))
    cut_frame = data["frames"][2][4][0]
    with open(truncated, "r+b") as f:
        f.truncate(cut_frame + 20)

    db = tmp_path / DEFAULT_NAME
    with Catalog(db) as cat:
        with pytest.raises(IngestError) as err:
            cat.ingest(str(tmp_path / "*.tfrecord"), "train")
        failures = sorted(err.value.failures, key=lambda f: f.path)
        assert [f.path for f in failures] == [flipped.name, truncated.name]
        assert str(flipped) in failures[0].error
        assert f"at byte {flip_at}" in failures[0].error
        assert "data CRC mismatch" in failures[0].error
        assert str(truncated) in failures[1].error
        assert f"at byte {cut_frame}" in failures[1].error
        assert "truncated" in failures[1].error
        assert "1 more failed shards" in str(err.value)

        (info,) = cat.datasets()
        assert (info.shards, info.ready_shards, info.failed_shards, info.records) == (4, 2, 2, 7)
        good_keys = all_keys(data)[:4] + all_keys(data)[15:]
        assert_contiguous(cat, "train", good_keys)
        with cat.dataset("train") as reader:
            assert reader.get_raw("s3_0015") == data["frames"][3][0][1]
        states = shard_table(db)
        assert states[flipped.name]["state"] == "failed"
        assert "data CRC mismatch" in states[flipped.name]["error"]

        # Failing again without a fix keeps the good shards and the failures.
        with pytest.raises(IngestError) as err:
            cat.ingest(str(tmp_path / "*.tfrecord"), "train")
        assert len(err.value.failures) == 2
        assert cat.datasets()[0].ready_shards == 2

        # Fix both files: the next ingest completes.
        write_shard(flipped, data["records"][1])
        write_shard(truncated, data["records"][2])
        progress = Progress()
        with cat.ingest(str(tmp_path / "*.tfrecord"), "train", progress=progress) as reader:
            assert len(reader) == 18
            assert reader.get_raw("s1_0006") == data["frames"][1][2][1]
        assert sorted(progress.paths) == [flipped.name, truncated.name]
        (info,) = cat.datasets()
        assert (info.ready_shards, info.failed_shards, info.records) == (4, 0, 18)
        assert_contiguous(cat, "train", all_keys(data))


# -- 6. keys ----------------------------------------------------------------------


def test_int64_key_feature(tmp_path: Path) -> None:
    path = tmp_path / "ids.tfrecord"
    write_shard(path, [{"id": i, "label": i * 10} for i in range(6)])
    with Catalog(tmp_path / DEFAULT_NAME) as cat:
        with cat.ingest(str(path), "ids", key="id") as reader:
            assert list(reader.iter_keys()) == ["0", "1", "2", "3", "4", "5"]
            assert reader.get_feature("4", "label") == 40
            assert reader.get_feature(4, "label") == 40  # keys are compared as strings
            assert reader["5"].features.feature["id"].int64_list.value == [5]
        (info,) = cat.datasets()
        assert info.key_rule == "feature:id"
        assert info.key_feature == "id"
        assert info.fields == {"label": "integer"}  # the key feature is the key column
        assert cat.query('SELECT key, label FROM "ids" WHERE label >= 30 ORDER BY position') == [
            ("3", 30),
            ("4", 40),
            ("5", 50),
        ]


def test_float_key_feature(tmp_path: Path) -> None:
    path = tmp_path / "f.tfrecord"
    write_shard(path, [{"fk": 0.5 + i, "n": i} for i in range(4)])
    with Catalog(tmp_path / DEFAULT_NAME) as cat, cat.ingest(str(path), "fl", key="fk") as reader:
        assert list(reader.iter_keys()) == ["0.5", "1.5", "2.5", "3.5"]
        assert reader.get_feature("2.5", "n") == 2


def test_position_keys(tmp_path: Path) -> None:
    data = write_set(tmp_path, [4, 6])
    with Catalog(tmp_path / DEFAULT_NAME) as cat:
        with cat.ingest(str(tmp_path / "*.tfrecord"), "pos", key=None) as reader:
            assert len(reader) == 10
            assert list(reader.iter_keys()) == [str(i) for i in range(10)]
            assert reader.to_dict(reader["5"])["key"] == b"s1_0005"
            assert reader.get_raw("7") == data["frames"][1][3][1]
            assert reader.key_at(5) == "5"
            assert reader.get_record("10") is None
            assert reader.get_record("05") is None
            assert "s1_0005" not in reader
            with pytest.raises(KeyNotFoundError):
                reader["-1"]
        (info,) = cat.datasets()
        assert info.key_rule == "position"
        assert info.key_feature is None
        assert "f_key" in info.fields  # a feature named "key" is renamed in the view
        rows = cat.query('SELECT key, position, f_key FROM "pos" ORDER BY position')
        assert [r[0] for r in rows] == [str(i) for i in range(10)]
        assert [r[2] for r in rows] == all_keys(data)
        assert cat.query('SELECT count(*) FROM "pos" WHERE key <> CAST(position AS TEXT)') == [(0,)]


def test_record_without_key_feature(tmp_path: Path) -> None:
    good = write_set(tmp_path, [2])
    bad = tmp_path / "part-00009.tfrecord"
    frames = write_shard(bad, [{"key": "x0"}, {"key": "x1"}, {"label": 3}, {"key": "x3"}])
    with Catalog(tmp_path / DEFAULT_NAME) as cat:
        with pytest.raises(IngestError) as err:
            cat.ingest(str(tmp_path / "*.tfrecord"), "train")
        message = str(err.value)
        assert str(bad) in message
        assert f"at byte {frames[2][0]}" in message
        assert "no key feature 'key'" in message
        assert_contiguous(cat, "train", all_keys(good))


def test_same_dataset_with_other_key_rule_is_refused(tmp_path: Path) -> None:
    write_set(tmp_path, [3])
    pattern = str(tmp_path / "*.tfrecord")
    with Catalog(tmp_path / DEFAULT_NAME) as cat:
        cat.ingest(pattern, "train").close()
        for key in (None, "label"):
            with pytest.raises(CatalogError) as err:
                cat.ingest(pattern, "train", key=key)
            message = str(err.value)
            assert "'train'" in message
            assert "another dataset" in message
            assert "drop" in message
        (info,) = cat.datasets()
        assert (info.key_rule, info.records) == ("feature:key", 3)


# -- 7. several processes ingest the same shards -------------------------------------


def _concurrent_ingest(db: str, pattern: str, out: str, start: Any) -> None:
    start.wait(30)
    seen: list[str] = []
    with (
        Catalog(db) as cat,
        cat.ingest(pattern, "train", workers=1, progress=lambda o, t: seen.append(o.path)) as r,
    ):
        result = {"seen": seen, "len": len(r), "keys": list(r.iter_keys())}
    Path(out).write_text(json.dumps(result))


def test_processes_share_the_work(tmp_path: Path) -> None:
    data = write_set(tmp_path / "shards", [60] * 8)
    db = tmp_path / "shards" / DEFAULT_NAME
    pattern = str(tmp_path / "shards" / "*.tfrecord")
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    outs = [tmp_path / f"out{i}.json" for i in range(3)]
    procs = [
        ctx.Process(target=_concurrent_ingest, args=(str(db), pattern, str(out), start))
        for out in outs
    ]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]

    results = [json.loads(out.read_text()) for out in outs]
    seen = [set(r["seen"]) for r in results]
    assert sum(len(r["seen"]) for r in results) == 8  # every shard indexed exactly once
    assert set().union(*seen) == {p.name for p in data["paths"]}
    for i in range(3):
        for j in range(i + 1, 3):
            assert not seen[i] & seen[j]
    for r in results:
        assert r["len"] == 480
        assert r["keys"] == all_keys(data)
    states = shard_table(db)
    assert {r["state"] for r in states.values()} == {"ready"}
    assert all(r["claim_owner"] is None for r in states.values())
    with Catalog(db) as cat:
        assert_contiguous(cat, "train", all_keys(data))


# -- 8. SIGKILL in the middle of an ingest ------------------------------------------

_KILLED_CHILD = textwrap.dedent(
    """
    import sys, time
    from shardcat.formats.tfrecord import TFRecordFormat
    from shardcat import Catalog

    original = TFRecordFormat.scan

    def slow_scan(self, path, options):
        time.sleep(0.15)  # keep the shard claimed ('indexing') for a while
        yield from original(self, path, options)

    TFRecordFormat.scan = slow_scan
    with Catalog(sys.argv[1]) as cat:
        cat.ingest(sys.argv[2], "train", workers=1,
                   progress=lambda outcome, total: time.sleep(0.2)).close()
    """
)


def _poll_states(db: Path) -> dict[str, int]:
    if not db.exists():
        return {}
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return dict(conn.execute("SELECT state, count(*) FROM shardcat_shards GROUP BY state"))
        finally:
            conn.close()
    except sqlite3.OperationalError:  # schema not created yet
        return {}


def test_sigkill_leaves_whole_shards_and_next_ingest_finishes(tmp_path: Path) -> None:
    data = write_set(tmp_path / "ds", [20] * 12)
    db = tmp_path / "ds" / DEFAULT_NAME
    pattern = str(tmp_path / "ds" / "*.tfrecord")
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_CHILD, str(db), pattern])
    try:
        give_up = time.monotonic() + 60
        while True:
            states = _poll_states(db)
            if states.get("ready", 0) >= 2 and states.get("indexing", 0) == 1:
                break
            assert proc.poll() is None, f"child ended early: {proc.returncode}, {states}"
            assert time.monotonic() < give_up, f"child made no progress: {states}"
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()  # reap it: a zombie still answers kill(pid, 0)
    assert proc.returncode == -signal.SIGKILL

    with Catalog(db) as cat:
        conn = sqlite3.connect(db)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            shards = conn.execute(
                "SELECT id, path, state, num_records, claim_owner FROM shardcat_shards "
                "ORDER BY path"
            ).fetchall()
            per_shard_records = dict(
                conn.execute("SELECT shard_id, count(*) FROM shardcat_records_1 GROUP BY shard_id")
            )
        finally:
            conn.close()
        assert len(shards) == 12
        ready = [s for s in shards if s[2] == "ready"]
        assert len(ready) >= 2
        for shard_id, _path, state, num_records, owner in shards:
            if state == "ready":
                assert num_records == 20
                assert per_shard_records.get(shard_id) == 20
            else:
                assert state in ("pending", "indexing")
                assert per_shard_records.get(shard_id, 0) == 0
            if state == "indexing":
                assert f":{proc.pid}:" in owner  # the dead child's claim
        index_of = {p.name: i for i, p in enumerate(data["paths"])}
        ready_keys = [
            k for s in ready for k in all_keys({"records": [data["records"][index_of[s[1]]]]})
        ]
        assert_contiguous(cat, "train", ready_keys)
        view_counts = dict(cat.query('SELECT shard, count(*) FROM "train" GROUP BY shard'))
        assert view_counts == {s[1]: 20 for s in ready}

        progress = Progress()
        with deadline(30), cat.ingest(pattern, "train", workers=1, progress=progress) as reader:
            assert len(reader) == 240
        assert sorted(progress.paths) == [s[1] for s in shards if s[2] != "ready"]
        assert_contiguous(cat, "train", all_keys(data))
        (info,) = cat.datasets()
        assert (info.ready_shards, info.failed_shards, info.records) == (12, 0, 240)


# -- 9. worker processes -----------------------------------------------------------


def test_workers_give_the_same_catalog(tmp_path: Path) -> None:
    data = write_set(tmp_path / "data", [30, 10, 25, 5, 40, 1])
    pattern = str(tmp_path / "data" / "*.tfrecord")
    contents = []
    for workers in (1, 2):
        progress = Progress()
        with Catalog(tmp_path / f"w{workers}.sqlite") as cat:
            cat.ingest(pattern, "train", workers=workers, progress=progress).close()
            assert sorted(progress.paths) == sorted(f"data/{p.name}" for p in data["paths"])
            rows = cat.query(
                'SELECT v.key, v.position, v.shard, r."offset", r.length, v.label, v.value, v.src '
                'FROM "train" v JOIN shardcat_records_1 r ON r.key = v.key ORDER BY v.position'
            )
            contents.append(list(rows))
            assert_contiguous(cat, "train", all_keys(data))
    assert len(contents[0]) == 111
    assert contents[0] == contents[1]


# -- 10. bad input --------------------------------------------------------------------


def test_bad_input_is_refused(tmp_path: Path) -> None:
    write_set(tmp_path, [2])
    pattern = str(tmp_path / "*.tfrecord")
    with Catalog(tmp_path / "cat.sqlite") as cat:
        with pytest.raises(CatalogError, match="no files match"):
            cat.ingest(str(tmp_path / "missing-*.tfrecord"), "train")
        for name in ("1abc", "shardcat_shards", "a-b", "ShardCat_x", "sqlite_master", "x y"):
            with pytest.raises(CatalogError, match="invalid dataset name") as err:
                cat.ingest(pattern, name)
            assert repr(name) in str(err.value)
        with pytest.raises(CatalogError, match="unknown format 'nosuchformat'") as err:
            cat.ingest(pattern, "train", format="nosuchformat")
        assert f"known formats: {', '.join(known_formats())}" in str(err.value)
        assert "tfrecord" in known_formats()
        with pytest.raises(CatalogError, match="on_duplicate must be one of") as err:
            cat.ingest(pattern, "train", on_duplicate="bogus")
        assert "'bogus'" in str(err.value)
        assert "error, first, last" in str(err.value)
        assert cat.datasets() == []
        assert cat.query("SELECT count(*) FROM shardcat_shards") == [(0,)]


# -- 11. where the catalog lives ------------------------------------------------------


def test_locate_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv(engine_mod.ENV_VAR, raising=False)

    assert locate(None) == Path(DEFAULT_NAME)
    assert locate(None, str(shard_dir)) == shard_dir.resolve() / DEFAULT_NAME
    assert locate(tmp_path / "x.sqlite", str(shard_dir)) == tmp_path / "x.sqlite"

    monkeypatch.setenv(engine_mod.ENV_VAR, str(tmp_path / "env.sqlite"))
    assert locate(None, str(shard_dir)) == tmp_path / "env.sqlite"
    assert locate(None) == tmp_path / "env.sqlite"
    assert locate(tmp_path / "x.sqlite", str(shard_dir)) == tmp_path / "x.sqlite"  # explicit wins
    monkeypatch.delenv(engine_mod.ENV_VAR)

    # A shard directory that cannot be written: the per-user cache directory.
    shard_dir.chmod(0o555)
    try:
        if os.access(shard_dir, os.W_OK):  # root ignores the mode bits
            monkeypatch.setattr(engine_mod, "_writable_dir", lambda directory: False)
        cached = locate(None, str(shard_dir))
        assert cached.parent == cache / "shardcat"
        assert cached.name.startswith("shards-")
        assert cached.suffix == ".sqlite"
        assert locate(None, str(shard_dir)) == cached  # stable
        other = tmp_path / "other" / "shards"
        other.mkdir(parents=True)
        assert locate(None, str(other)) != cached  # named after the full path
        assert locate(tmp_path / "x.sqlite", str(shard_dir)) == tmp_path / "x.sqlite"
        monkeypatch.setenv(engine_mod.ENV_VAR, str(tmp_path / "env.sqlite"))
        assert locate(None, str(shard_dir)) == tmp_path / "env.sqlite"
        monkeypatch.delenv(engine_mod.ENV_VAR)
    finally:
        shard_dir.chmod(0o755)

    # A catalog already beside the shards is used even when the directory is read-only.
    (shard_dir / DEFAULT_NAME).touch()
    monkeypatch.setattr(engine_mod, "_writable_dir", lambda directory: False)
    assert locate(None, str(shard_dir)) == shard_dir.resolve() / DEFAULT_NAME


def test_datasets_without_fields_store_no_field_values_until_fields_are_asked_for(
    tmp_path: Path,
) -> None:
    for i in range(2):
        write_shard(tmp_path / f"p{i}.tfrecord", make_records(f"p{i}_", 3))
    glob = str(tmp_path / "*.tfrecord")

    def field_columns(cat: Catalog) -> list[str]:
        info = cat.store.reader_connection().execute("PRAGMA table_info(shardcat_records_1)")
        return [r[1] for r in info if r[1].startswith("v")]

    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(glob, "d", fields=False).close()
        assert field_columns(cat) == []
        rows = cat.query("SELECT key, position, shard FROM d ORDER BY position")
        assert [r[1] for r in rows] == list(range(6))
        assert [r[0] for r in rows][:2] == ["p0_0000", "p0_0001"]
        assert rows.columns == ["key", "position", "shard"]
        assert cat.query("SELECT * FROM d").columns == ["key", "position", "shard"]
        seen: list[str] = []
        cat.ingest(glob, "d", fields=True, progress=lambda o, n: seen.append(o.path)).close()
        assert sorted(seen) == ["p0.tfrecord", "p1.tfrecord"]  # all re-read for their fields
        columns = field_columns(cat)
        assert columns
        filled = " AND ".join(f"{c} IS NOT NULL" for c in columns)
        assert cat.query(f"SELECT count(*) FROM shardcat_records_1 WHERE {filled}") == [(6,)]
        with_fields = cat.query("SELECT * FROM d ORDER BY position")
        assert len(with_fields) == 6 and len(with_fields.columns) > 3
        cat.ingest(glob, "d").close()  # keeps fields=True
        assert cat.query(f"SELECT count(*) FROM shardcat_records_1 WHERE {filled}") == [(6,)]


def test_datasets_may_take_the_names_of_the_catalog_s_old_tables(tmp_path: Path) -> None:
    """The catalog's own tables are ``shardcat_*`` (schema version 4): a dataset named
    after its directory ``.../shards/`` is called ``shards`` and queried as such. One
    old name stays taken: ``catalog_meta``, the version marker older shardcats read
    (issue 27; tests/test_migrations.py)."""
    write_set(tmp_path, [2, 3])
    pattern = str(tmp_path / "*.tfrecord")
    with Catalog(tmp_path / "cat.sqlite") as cat:
        for name in ("shards", "records", "datasets", "fields_1"):
            cat.ingest(pattern, name).close()
            assert cat.query(f"SELECT count(*) FROM {name}") == [(5,)]
        assert cat.query("SELECT count(*) FROM shardcat_datasets") == [(4,)]
        with cat.dataset("shards") as reader:
            assert len(reader) == 5 and reader.where("position < 2") == reader.get_keys()[:2]
