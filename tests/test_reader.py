"""The SQL-backed readers: tfd-utils parity, zero-config catalogs, the new batch and
SQL API, CRC checks, stale shards, fork/pickle safety and closing."""

from __future__ import annotations

import os
import pickle
import random
import sqlite3
import traceback
import types
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from damage import flip_keeping_mtime

import shardcat
from shardcat import (
    Catalog,
    CatalogError,
    CorruptRecordError,
    IngestError,
    KeyNotFoundError,
    ShardcatError,
    StaleShardError,
    TFRecordRandomAccess,
    TFRecordWriter,
    make_example,
)
from shardcat.pb2 import Example
from shardcat.testing.required import need

tfd_utils = need("tfd_utils", why="shardcat[bench]")

HEADER = 12  # TFRecord frame: uint64 length + uint32 length CRC before the payload


@dataclass(frozen=True)
class Rec:
    """One written record, in position order (shard path, then record order)."""

    key: str
    id: int
    label: int
    score: float
    caption: str
    image: bytes
    vec: list[float]
    ids: list[int]
    raw: bytes
    path: str
    offset: int


def write_shards(
    directory: Path,
    counts: tuple[int, ...] = (23, 17, 30),
    *,
    seed: int = 0,
    stem: str = "part",
) -> list[Rec]:
    """Shards ``<stem>-NN.tfrecord`` with unsorted unique keys and exactly
    representable float values (so SQL and Python filtering agree)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    total = sum(counts)
    keys = [f"k{v:08x}" for v in rng.sample(range(16**8), total)]
    ids = rng.sample(range(1_000, 1_000_000), total)
    recs: list[Rec] = []
    i = 0
    for s, count in enumerate(counts):
        path = str(directory / f"{stem}-{s:02d}.tfrecord")
        with TFRecordWriter(path) as writer:
            for _ in range(count):
                image = b"\xff\xd8" + rng.randbytes(rng.randrange(40, 90)) + b"\xff\xd9"
                fields = {
                    "key": keys[i],
                    "id": ids[i],
                    "label": rng.randrange(5),
                    "score": rng.randrange(9) / 8,
                    "caption": f"caption {i}",
                    "image": image,
                    "vec": [rng.randrange(-100, 100) / 4 for _ in range(3)],
                    "ids": [rng.randrange(1 << 40) for _ in range(rng.randrange(2, 5))],
                }
                example = make_example(fields)
                raw = example.SerializeToString()
                offset = writer.write(raw)
                recs.append(Rec(raw=raw, path=path, offset=offset, **fields))
                i += 1
    return recs


@pytest.fixture
def data(tmp_path: Path) -> tuple[str, list[Rec]]:
    """(glob, records) for three shards of 23 + 17 + 30 records."""
    recs = write_shards(tmp_path / "shards")
    return str(tmp_path / "shards" / "part-*.tfrecord"), recs


def canon(message: Any) -> bytes:
    """A message's bytes with map entries sorted: protobuf does not promise the
    order of map entries when re-serializing, so compare canonical forms."""
    return bytes(message.SerializeToString(deterministic=True))


def canon_raw(raw: bytes) -> bytes:
    return canon(Example.FromString(raw))


def shard_rows(catalog_path: str | Path) -> dict[str, tuple[int, float]]:
    """shard path -> (shard id, indexed_at), read without ever writing the catalog."""
    uri = Path(catalog_path).resolve().as_uri() + "?mode=ro"
    with closing(sqlite3.connect(uri, uri=True)) as conn:
        return {
            p: (i, t)
            for i, p, t in conn.execute("SELECT id, path, indexed_at FROM shardcat_shards")
        }


def append_record(path: str, scratch: Path, fields: dict[str, object]) -> bytes:
    """Append one valid TFRecord frame to ``path``; returns its payload."""
    example = make_example(fields)
    with TFRecordWriter(scratch) as writer:
        writer.write(example)
    with open(path, "ab") as f:
        f.write(scratch.read_bytes())
    return example.SerializeToString()


# -- 1. tfd-utils parity --------------------------------------------------------------------


def test_tfd_utils_parity(tmp_path: Path, data: tuple[str, list[Rec]]) -> None:
    pattern, recs = data
    with (
        tfd_utils.TFRecordRandomAccess(
            pattern,
            key_feature_name="key",
            index_file=str(tmp_path / "x.index"),
            progress_interval=5,
            max_workers=1,
            use_multiprocessing=False,
            file_pool_size=2,
            use_pread=False,
            eager_open_workers=2,
        ) as theirs,
        TFRecordRandomAccess(
            pattern,
            key_feature_name="key",
            index_file=tmp_path / "cat.sqlite",
            progress_interval=5,
            max_workers=2,
            use_multiprocessing=True,
            file_pool_size=2,
            use_pread=True,
            eager_open_workers=2,
        ) as ours,
    ):
        assert ours.index_file == str(tmp_path / "cat.sqlite")
        assert set(ours.get_keys()) == set(theirs.get_keys())
        assert ours.get_keys() == [r.key for r in recs]  # position order
        assert len(ours) == len(theirs) == len(recs) == 70
        # file_pool_size=2 < 3 shards: alternate shards so descriptors get evicted
        for r in recs[::2] + recs[1::2][::-1]:
            mine, ref = ours.get_record(r.key), theirs.get_record(r.key)
            assert canon(mine) == canon(ref) == canon_raw(r.raw)
            assert mine == Example.FromString(r.raw)
            for name in ("key", "label", "score", "caption", "image", "id"):
                assert ours.get_feature(r.key, name) == theirs.get_feature(r.key, name)
            assert ours.get_feature(r.key, "image") == r.image
            assert ours.get_feature(r.key, "key") == r.key.encode()
            assert ours.get_feature(r.key, "label") == r.label
            assert ours.get_feature(r.key, "score") == r.score
            for name in ("vec", "ids", "image", "label"):
                assert ours.get_feature_list(r.key, name) == theirs.get_feature_list(r.key, name)
            assert ours.get_feature_list(r.key, "vec") == r.vec
            assert ours.get_feature_list(r.key, "ids") == r.ids
            assert ours.get_feature(r.key, "no_such_feature") is None
            assert theirs.get_feature(r.key, "no_such_feature") is None
            assert ours.get_feature_list(r.key, "no_such_feature") is None
            assert ours.contains_key(r.key) and r.key in ours
            assert canon(ours[r.key]) == canon(theirs[r.key])
            assert ours.get_raw(r.key) == r.raw

        for missing in ("missing", "", recs[0].key.upper(), recs[0].key + " "):
            assert not ours.contains_key(missing) and missing not in ours
            assert not theirs.contains_key(missing)
            assert ours.get_record(missing) is None and theirs.get_record(missing) is None
            assert ours.get_feature(missing, "image") is None
            assert theirs.get_feature(missing, "image") is None
            assert ours.get_feature_list(missing, "image") is None
        with pytest.raises(KeyError):
            theirs["missing"]
        with pytest.raises(KeyError, match="missing") as err:
            ours["missing"]
        assert isinstance(err.value, KeyNotFoundError)
        assert isinstance(err.value, ShardcatError)

        mine_stats, ref_stats = ours.get_stats(), theirs.get_stats()
        for field in ("total_records", "total_files", "records_per_file"):
            assert mine_stats[field] == ref_stats[field]
        assert mine_stats["records_per_file"] == {
            "part-00.tfrecord": 23,
            "part-01.tfrecord": 17,
            "part-02.tfrecord": 30,
        }
        assert mine_stats["index_file"] == str(tmp_path / "cat.sqlite")
    assert not (tmp_path / "shards" / "shardcat.sqlite").exists()


def test_constructor_path_forms(
    tmp_path: Path, data: tuple[str, list[Rec]], monkeypatch: pytest.MonkeyPatch
) -> None:
    pattern, recs = data
    shard_dir = tmp_path / "shards"
    paths = sorted({r.path for r in recs})
    by_shard = {p: [r.key for r in recs if r.path == p] for p in paths}

    # Readers over different path sets of one directory are open at once and share
    # its catalog: each must still see exactly its own files.
    with (
        TFRecordRandomAccess(paths[1]) as single,
        TFRecordRandomAccess(Path(paths[1])) as single_path_obj,
        TFRecordRandomAccess([paths[2], paths[0]]) as listed,
        TFRecordRandomAccess(pattern) as globbed,
    ):
        assert single.index_file == str(shard_dir / "shardcat.sqlite")
        assert single.get_keys() == single_path_obj.get_keys() == by_shard[paths[1]]
        assert listed.get_keys() == by_shard[paths[0]] + by_shard[paths[2]]
        assert globbed.get_keys() == [r.key for r in recs]
        assert listed.tfrecord_files == [paths[0], paths[2]]
        outside = by_shard[paths[0]][0]
        assert outside not in single and single.get_record(outside) is None
        assert len(single) == 17 and len(listed) == 53 and len(globbed) == 70
        assert single.get_stats()["records_per_file"] == {"part-01.tfrecord": 17}
        # reopening one of them later does not take records away from the others
        with TFRecordRandomAccess(paths[1]) as again:
            assert again.get_keys() == by_shard[paths[1]]
        assert globbed.get_keys() == [r.key for r in recs]
        assert canon(globbed[outside]) == canon_raw(recs[0].raw)

    # A list of bare file names relative to the working directory.
    monkeypatch.chdir(shard_dir)
    names = [os.path.basename(p) for p in paths]
    with TFRecordRandomAccess(names) as relative:
        assert relative.get_keys() == [r.key for r in recs]
        assert canon(relative.get_record_at(-1)) == canon_raw(recs[-1].raw)
        assert relative.index_file == str(shard_dir / "shardcat.sqlite")

    for nothing in (str(tmp_path / "nope" / "*.tfrecord"), [str(tmp_path / "x-*.tfrecord")]):
        with pytest.raises(ValueError, match="No TFRecord files found for path"):
            TFRecordRandomAccess(nothing)
        with pytest.raises(ValueError, match="No TFRecord files found for path"):
            tfd_utils.TFRecordRandomAccess(nothing, index_file=str(tmp_path / "y.index"))


def test_shards_named_like_catalog_tables(tmp_path: Path) -> None:
    """Zero-config works for shard names that collide with the catalog's own tables."""
    for stem in ("records", "shards", "datasets"):
        recs = write_shards(tmp_path / stem, (3, 2), stem=stem)
        with TFRecordRandomAccess(str(tmp_path / stem / f"{stem}-*.tfrecord")) as reader:
            assert reader.dataset == stem  # the catalog's own tables are shardcat_*
            assert reader.get_keys() == [r.key for r in recs]
            assert reader.where("label >= 0") == [r.key for r in recs]


# -- 2. zero-config -------------------------------------------------------------------------


def test_zero_config_catalog_beside_shards(tmp_path: Path, data: tuple[str, list[Rec]]) -> None:
    pattern, recs = data
    catalog_path = tmp_path / "shards" / "shardcat.sqlite"
    assert not catalog_path.exists()
    with TFRecordRandomAccess(pattern) as first:
        assert first.index_file == str(catalog_path)
        keys = first.get_keys()
        raws = [first.get_raw(k) for k in keys]
    assert catalog_path.is_file()
    before = shard_rows(catalog_path)
    assert len(before) == 3 and all(t is not None for _, t in before.values())

    with TFRecordRandomAccess(pattern) as second:
        assert second.get_keys() == keys == [r.key for r in recs]
        assert [second.get_raw(k) for k in keys] == raws == [r.raw for r in recs]
        assert second.where("label = 1") == first_where(recs, 1)
    assert shard_rows(catalog_path) == before  # nothing re-indexed


def first_where(recs: list[Rec], label: int) -> list[str]:
    return [r.key for r in recs if r.label == label]


def test_index_file_places_the_catalog(tmp_path: Path, data: tuple[str, list[Rec]]) -> None:
    pattern, recs = data
    target = tmp_path / "elsewhere" / "my.sqlite"
    with TFRecordRandomAccess(pattern, index_file=target) as reader:
        assert reader.index_file == str(target)
        assert reader.get_stats()["index_file"] == str(target)
        assert reader.get_raw(recs[40].key) == recs[40].raw
    assert target.is_file()
    assert not (tmp_path / "shards" / "shardcat.sqlite").exists()
    assert set(shard_rows(target)) == {os.path.abspath(r.path) for r in recs}


def test_readonly(tmp_path: Path, data: tuple[str, list[Rec]]) -> None:
    pattern, recs = data
    catalog_path = tmp_path / "shards" / "shardcat.sqlite"
    with pytest.raises(CatalogError, match="no catalog at"):
        TFRecordRandomAccess(pattern, readonly=True)
    assert not catalog_path.exists()

    with TFRecordRandomAccess(recs[0].path):  # a catalog exists, but not for the whole set
        pass
    with pytest.raises(CatalogError, match="has no dataset for") as err:
        TFRecordRandomAccess(pattern, readonly=True)
    assert "readonly=True" in str(err.value)

    with TFRecordRandomAccess(pattern):
        pass
    st = catalog_path.stat()
    content = catalog_path.read_bytes()
    side_files = {p.name: p.read_bytes() for p in catalog_path.parent.glob("shardcat.sqlite-*")}
    with TFRecordRandomAccess(pattern, readonly=True) as reader:
        assert reader.get_keys() == [r.key for r in recs]
        assert [reader.get_raw(r.key) for r in recs] == [r.raw for r in recs]
        assert reader.where("label = ?", [2]) == first_where(recs, 2)
        assert reader.catalog.readonly
        with pytest.raises(CatalogError, match="read-only"):
            reader.rebuild_index()
    after = catalog_path.stat()
    assert (after.st_mtime_ns, after.st_size) == (st.st_mtime_ns, st.st_size)
    assert catalog_path.read_bytes() == content
    wal = catalog_path.parent / "shardcat.sqlite-wal"
    # (the writer's close removed the -wal; SQLite may create an empty one to read)
    assert (wal.read_bytes() if wal.exists() else b"") == side_files.get(wal.name, b"")


# -- 3. the new API -------------------------------------------------------------------------


def test_get_many(data: tuple[str, list[Rec]]) -> None:
    pattern, recs = data
    with TFRecordRandomAccess(pattern) as reader:
        picks = [recs[i] for i in (69, 0, 23, 22, 40, 0, 69, 5, 5, 41)]  # spans all shards
        keys = [r.key for r in picks]
        got = reader.get_many(keys)
        assert [canon(g) for g in got] == [canon_raw(r.raw) for r in picks]
        assert [canon(g) for g in got] == [canon(reader.get_record(k)) for k in keys]
        assert reader.get_many(keys, raw=True) == [r.raw for r in picks]
        assert reader.get_many((k for k in keys[:3]), raw=True) == [r.raw for r in picks[:3]]
        assert reader.get_many([]) == []
        everything = reader.get_many([r.key for r in recs][::-1], raw=True)
        assert everything == [r.raw for r in recs][::-1]

        with pytest.raises(KeyNotFoundError) as err:
            reader.get_many([keys[0], "ghost-1", keys[1], "ghost-2"])
        message = str(err.value)
        assert "2 key(s) not in dataset 'part'" in message
        assert "'ghost-1'" in message and "'ghost-2'" in message
        assert keys[0] not in message
        assert isinstance(err.value, KeyError)

        many_missing = [f"ghost-{i}" for i in range(8)]
        with pytest.raises(KeyNotFoundError, match=r"8 key\(s\) not in .*and 3 more"):
            reader.get_many(many_missing)


def test_positions(data: tuple[str, list[Rec]]) -> None:
    pattern, recs = data
    n = len(recs)
    with TFRecordRandomAccess(pattern) as reader:
        for i, r in enumerate(recs):
            assert canon(reader.get_record_at(i)) == canon_raw(r.raw)
            assert reader.get_record_at(i - n, raw=True) == r.raw
            assert reader.key_at(i) == reader.key_at(i - n) == r.key
        assert reader.keys_at([n - 1, 0, 23, -1, 0]) == [recs[i].key for i in (-1, 0, 23, -1, 0)]
        assert reader.keys_at(slice(20, 26)) == [r.key for r in recs[20:26]]
        assert reader.keys_at([]) == [] and reader.keys_at([5]) == [recs[5].key]
        with pytest.raises(IndexError, match="out of range"):
            reader.keys_at([0, n])
        assert reader.get_record_at(-1, raw=True) == recs[-1].raw

        idx = [69, 0, 23, 22, 23, -1, -70, 40]
        assert reader.get_many_at(idx, raw=True) == [recs[i].raw for i in idx]
        assert [canon(g) for g in reader.get_many_at(idx)] == [canon_raw(recs[i].raw) for i in idx]
        raws = [r.raw for r in recs]
        for sl in (
            slice(3, 50, 7),
            slice(None, None, -1),
            slice(60, 10, -9),
            slice(-5, None),
            slice(20, 25),
            slice(5, 5),
            slice(-1, -71, -3),
            slice(None, None, 100),
        ):
            assert reader.get_many_at(sl, raw=True) == raws[sl], sl
        assert reader.get_many_at(range(22, 25), raw=True) == raws[22:25]

        for bad in (n, -n - 1, 10**6):
            with pytest.raises(IndexError, match=f"position {bad} out of range for {n}"):
                reader.get_record_at(bad)
            with pytest.raises(IndexError):
                reader.key_at(bad)
            with pytest.raises(IndexError):
                reader.get_many_at([0, bad])


def test_keys_where_and_raw(data: tuple[str, list[Rec]]) -> None:
    pattern, recs = data
    with TFRecordRandomAccess(pattern) as reader:
        keys = reader.iter_keys()
        assert isinstance(keys, types.GeneratorType)
        assert next(keys) == recs[0].key
        assert list(keys) == [r.key for r in recs[1:]]
        assert list(reader) == [r.key for r in recs]

        expected = [r.key for r in recs if r.label == 3 and r.score > 0.5]
        assert expected  # the data exercises the filter
        assert reader.where("label = 3 AND score > 0.5") == expected
        assert reader.where("label = ?", [3]) == first_where(recs, 3)
        assert reader.where("label = :l", {"l": 4}) == first_where(recs, 4)
        assert reader.where("score = 0.5") == [r.key for r in recs if r.score == 0.5]
        assert reader.where("caption = ?", ["caption 42"]) == [recs[42].key]
        assert reader.where("id > ?", [500_000]) == [r.key for r in recs if r.id > 500_000]
        assert reader.where("label > 99") == []
        with pytest.raises(CatalogError, match="query failed"):
            reader.where("no_such_column = 1")

        for r in recs:
            assert reader.get_raw(r.key) == r.raw
        assert reader.get_raw("ghost") is None
        assert reader.to_dict(reader[recs[7].key]) == {
            "key": recs[7].key.encode(),
            "id": recs[7].id,
            "label": recs[7].label,
            "score": recs[7].score,
            "caption": recs[7].caption.encode(),
            "image": recs[7].image,
            "vec": recs[7].vec,
            "ids": recs[7].ids,
        }


# -- 4. catalog readers, int keys, position keys --------------------------------------------


def test_catalog_dataset_and_ingest_readers(tmp_path: Path, data: tuple[str, list[Rec]]) -> None:
    pattern, recs = data
    with Catalog(tmp_path / "c.sqlite") as catalog:
        with catalog.ingest(pattern, "train") as ingested, catalog.dataset("train") as opened:
            assert not ingested.catalog.closed
            for reader in (ingested, opened):
                assert reader.dataset == "train"
                assert len(reader) == len(recs)
                assert reader.get_keys() == [r.key for r in recs]
                assert reader.get_many([r.key for r in recs], raw=True) == [r.raw for r in recs]
                assert canon(reader.get_record_at(30)) == canon_raw(recs[30].raw)
                assert reader.where("label = 0") == first_where(recs, 0)
                assert reader.get_stats()["total_records"] == 70
        assert not catalog.closed  # readers from a Catalog do not own it
        assert catalog.query('SELECT count(*) FROM "train"') == [(70,)]
        with pytest.raises(CatalogError, match=r"no dataset 'nope'.*it has: train"):
            catalog.dataset("nope")


def test_int64_key_feature(tmp_path: Path, data: tuple[str, list[Rec]]) -> None:
    pattern, recs = data
    with (
        TFRecordRandomAccess(pattern, key_feature_name="id", dataset="by_id") as ours,
        tfd_utils.TFRecordRandomAccess(
            pattern,
            key_feature_name="id",
            index_file=str(tmp_path / "id.index"),
            use_multiprocessing=False,
        ) as theirs,
    ):
        assert ours.get_keys() == [str(r.id) for r in recs]
        assert set(ours.get_keys()) == set(theirs.get_keys())
        for r in recs[::7]:
            assert ours.get_raw(str(r.id)) == r.raw
            assert ours.get_feature(str(r.id), "id") == theirs.get_feature(str(r.id), "id")
            assert ours.get_feature(str(r.id), "key") == r.key.encode()
        assert ours.get_record(r.key) is None  # string keys are not keys any more
        assert ours.where("label = 2") == [str(r.id) for r in recs if r.label == 2]
        assert ours.get_many([str(recs[50].id), str(recs[1].id)], raw=True) == [
            recs[50].raw,
            recs[1].raw,
        ]


def test_key_by_position(data: tuple[str, list[Rec]]) -> None:
    pattern, recs = data
    n = len(recs)
    with TFRecordRandomAccess(pattern, key_by_position=True, dataset="pos") as reader:
        assert reader.key_rule == "position"
        assert reader.get_keys() == [str(i) for i in range(n)]
        assert list(reader.iter_keys())[-1] == str(n - 1)
        for i in (0, 22, 23, 69):
            assert canon(reader[str(i)]) == canon_raw(recs[i].raw)
            assert reader.key_at(i) == str(i)
        assert reader.key_at(-1) == str(n - 1)
        assert reader.keys_at([69, -1, 0]) == ["69", str(n - 1), "0"]
        assert reader.keys_at(slice(-2, None)) == [str(n - 2), str(n - 1)]
        assert reader.get_many(["69", "0", "23", "0"], raw=True) == [
            recs[69].raw,
            recs[0].raw,
            recs[23].raw,
            recs[0].raw,
        ]
        for missing in (str(n), "-1", "01", "x", recs[0].key):
            assert missing not in reader and reader.get_record(missing) is None
        with pytest.raises(KeyNotFoundError, match=r"1 key\(s\) not in dataset 'pos': '70'"):
            reader.get_many(["1", "70"])
        assert reader.where("label = 3") == [str(i) for i, r in enumerate(recs) if r.label == 3]
        # the "key" feature is a plain field here (renamed away from the view's key)
        assert reader.get_feature("5", "key") == recs[5].key.encode()


# -- 5. CRC verification --------------------------------------------------------------------


def test_same_size_rewrite_with_restored_mtime_is_stale(
    tmp_path: Path, data: tuple[str, list[Rec]]
) -> None:
    """A byte changed in place, size and mtime put back: the fingerprint tells."""
    pattern, recs = data
    victim = recs[30]  # second shard, inside its first 64 KiB
    catalog_path = tmp_path / "shards" / "shardcat.sqlite"
    with TFRecordRandomAccess(pattern) as reader:
        assert reader.get_raw(victim.key) == victim.raw
    flip_keeping_mtime(victim.path, victim.offset + HEADER + victim.raw.index(victim.image) + 10)

    with Catalog(catalog_path) as catalog, catalog.dataset("part") as plain:  # no re-index
        with pytest.raises(StaleShardError) as err:
            plain.get_raw(victim.key)
        assert err.value.path == victim.path
        assert str(err.value).startswith(f"{victim.path} changed after it was indexed: its ")
        assert "content changed (fingerprint differs)" in str(err.value)
        assert plain.get_raw(recs[0].key) == recs[0].raw
        assert plain.get_raw(recs[-1].key) == recs[-1].raw
        problems = plain.verify()
        assert [(p.path, p.offset) for p in problems] == [(victim.path, 0)]
        assert "fingerprint differs" in str(problems[0])

    # Opening by glob re-indexes the changed shard; its CRC fails, the rest stays.
    with pytest.raises(IngestError) as failed:
        TFRecordRandomAccess(pattern)
    assert str(failed.value) == (
        f"{victim.path}: at byte {victim.offset}: data CRC mismatch "
        "(on_bad_record='skip' indexes the other records)"
    )
    with Catalog(catalog_path) as catalog, catalog.dataset("part") as plain:
        assert catalog.info("part").failed_shards == 1
        assert len(plain) == 70 - 17
        assert plain.get_raw(victim.key) is None  # its records describe bytes that are gone
        assert [plain.get_raw(r.key) for r in recs if r.path != victim.path] == [
            r.raw for r in recs if r.path != victim.path
        ]


def test_verify_crc(tmp_path: Path) -> None:
    """Mid-file damage with size and mtime put back is outside the fingerprint's
    first and last 64 KiB: CRC checks on read (``verify_crc``) and ``verify`` find it."""
    directory = tmp_path / "shards"
    directory.mkdir()
    path = str(directory / "big.tfrecord")
    images = [bytes([i]) * 8000 for i in range(40)]  # 320 KB: record 20 is mid-file
    with TFRecordWriter(path) as writer:
        offsets = [
            writer.write(make_example({"key": f"r{i}", "image": im})) for i, im in enumerate(images)
        ]
    with TFRecordRandomAccess(path, verify_crc=True) as reader:
        assert reader.verify() == []
        raw = reader.get_raw("r20")
    flip_keeping_mtime(path, offsets[20] + HEADER + raw.index(images[20]) + 10)
    before = shard_rows(directory / "shardcat.sqlite")

    with TFRecordRandomAccess(path) as reader:  # reads are checked by default
        for read in (
            lambda: reader.get_record("r20"),
            lambda: reader.get_raw("r20"),
            lambda: reader["r20"],
            lambda: reader.get_many(["r0", "r20"]),
            lambda: reader.get_record_at(20),
        ):
            with pytest.raises(CorruptRecordError) as err:
                read()
            assert isinstance(err.value, ValueError)
            assert (err.value.path, err.value.offset) == (path, offsets[20])
            assert str(err.value).startswith(
                f"{path}: at byte {offsets[20]}: record 'r20': the bytes read are not the "
                "record the catalog indexed (CRC32C "
            )
        for i in (0, 19, 21, 39):
            assert reader.get_feature(f"r{i}", "image") == images[i]
        problems = reader.verify()
        assert [(p.path, p.offset) for p in problems] == [(path, offsets[20])]
        assert "data CRC mismatch" in str(problems[0])
        with Catalog(reader.index_file) as catalog:
            problems = catalog.verify(reader.dataset)
            assert [(p.path, p.offset) for p in problems] == [(path, offsets[20])]
    assert shard_rows(directory / "shardcat.sqlite") == before  # not re-indexed


# -- 6. stale shards ------------------------------------------------------------------------


def test_stale_shard(tmp_path: Path, data: tuple[str, list[Rec]]) -> None:
    pattern, recs = data
    catalog_path = tmp_path / "shards" / "shardcat.sqlite"
    _, second, third = sorted({r.path for r in recs})
    in_second = next(r for r in recs if r.path == second)
    with TFRecordRandomAccess(pattern) as reader:
        assert reader.get_raw(recs[0].key) == recs[0].raw  # opens the first shard only
        extra = append_record(second, tmp_path / "one.tfrecord", {"key": "appended", "label": 3})
        assert reader.get_raw(recs[0].key) == recs[0].raw
        with pytest.raises(StaleShardError) as err:
            reader.get_record(in_second.key)
        assert isinstance(err.value, ShardcatError)
        message = str(err.value)
        assert second in message and "re-ingest" in message and "rebuild_index" in message
        assert "appended" not in reader and len(reader) == 70
        before = shard_rows(catalog_path)

        reader.rebuild_index()
        assert len(reader) == 71
        assert reader.get_raw("appended") == extra
        assert reader.get_raw(in_second.key) == in_second.raw
        assert reader.key_at(40) == "appended"  # last record of the second shard
        assert reader.get_keys() == [r.key for r in recs[:40]] + ["appended"] + [
            r.key for r in recs[40:]
        ]
        assert reader.where("label = 3") == (
            [*first_where(recs[:40], 3), "appended", *first_where(recs[40:], 3)]
        )
    after = shard_rows(catalog_path)
    assert set(after) == set(before) and all(after[p][1] > before[p][1] for p in after)

    # A reader that did not index (a catalog dataset) refuses the changed shard...
    append_record(third, tmp_path / "two.tfrecord", {"key": "appended-2", "label": 0})
    with Catalog(catalog_path) as catalog, catalog.dataset("part") as plain:
        with pytest.raises(StaleShardError, match="re-ingest"):
            plain.get_raw(recs[-1].key)
        assert plain.get_raw(recs[0].key) == recs[0].raw

    # ...and reopening by glob re-indexes just that shard.
    with TFRecordRandomAccess(pattern) as reopened:
        assert len(reopened) == 72
        assert reopened.get_raw(recs[-1].key) == recs[-1].raw
        assert reopened.key_at(-1) == "appended-2"
    again = shard_rows(catalog_path)
    rel = {os.path.basename(p): v for p, v in again.items()}
    old = {os.path.basename(p): v for p, v in after.items()}
    assert rel["part-00.tfrecord"] == old["part-00.tfrecord"]
    assert rel["part-01.tfrecord"] == old["part-01.tfrecord"]
    assert rel["part-02.tfrecord"][1] > old["part-02.tfrecord"][1]


# -- 7. fork and pickle ---------------------------------------------------------------------


def _child_reads(reader: TFRecordRandomAccess, recs: list[Rec]) -> object:
    keys = [recs[(i * 17) % 70].key for i in range(50)]
    positions = [(i * 13) % 70 - 35 for i in range(50)]
    by_key = [reader.get_raw(k) for k in keys]
    by_position = [reader.get_record_at(i, raw=True) for i in positions]
    many = reader.get_many(keys[::-3], raw=True)
    return keys, by_key, positions, by_position, many, reader.where("label = 4")


def test_fork_child_reads(data: tuple[str, list[Rec]]) -> None:
    pattern, recs = data
    with TFRecordRandomAccess(pattern) as reader:
        assert reader.get_raw(recs[0].key) == recs[0].raw  # connection and fd now open
        connection = reader.catalog.reader_connection()
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                os.close(rfd)
                try:
                    payload = ("ok", _child_reads(reader, recs))
                    code = 0
                except BaseException:
                    payload = ("error", traceback.format_exc())
                with os.fdopen(wfd, "wb") as pipe:
                    pipe.write(pickle.dumps(payload))
            finally:
                os._exit(code)
        os.close(wfd)
        with os.fdopen(rfd, "rb") as pipe:
            received = pipe.read()
        _, status = os.waitpid(pid, 0)
        status_kind, result = pickle.loads(received)
        assert status_kind == "ok", result
        assert os.waitstatus_to_exitcode(status) == 0

        keys, by_key, positions, by_position, many, where = result
        assert len(by_key) == len(by_position) == 50
        assert len(set(keys)) == 50  # spans every shard
        assert result == _child_reads(reader, recs)  # the same reads in the parent
        raw_of = {r.key: r.raw for r in recs}
        assert by_key == [raw_of[k] for k in keys]
        assert by_position == [recs[i].raw for i in positions]
        assert many == [raw_of[k] for k in keys[::-3]]
        assert where == first_where(recs, 4)
        # the parent's connection and descriptors still work after the child is gone
        assert reader.catalog.reader_connection() is connection
        assert [reader.get_raw(r.key) for r in recs] == [r.raw for r in recs]


def test_pickle_reader(data: tuple[str, list[Rec]]) -> None:
    pattern, recs = data
    with TFRecordRandomAccess(pattern, verify_crc=True) as reader:
        assert reader.get_raw(recs[3].key) == recs[3].raw
        with pickle.loads(pickle.dumps(reader)) as copy:
            assert type(copy) is type(reader)
            assert copy.catalog is not reader.catalog
            assert copy.verify_crc is True
            assert copy.dataset == reader.dataset
            assert copy.get_keys() == [r.key for r in recs]
            assert [copy.get_raw(r.key) for r in recs] == [r.raw for r in recs]
            assert canon(copy.get_record_at(-1)) == canon_raw(recs[-1].raw)
            assert copy.where("label = 1") == first_where(recs, 1)
            assert copy.index_file == reader.index_file
            assert copy.tfrecord_files == reader.tfrecord_files
            assert copy.key_feature_name == "key"
        assert copy.closed and copy.catalog.closed
        assert not reader.closed
        assert reader.get_raw(recs[4].key) == recs[4].raw


# -- 8. closing -----------------------------------------------------------------------------


def test_close(data: tuple[str, list[Rec]]) -> None:
    pattern, recs = data
    key = recs[0].key
    with TFRecordRandomAccess(pattern) as reader:
        assert reader.get_raw(key) == recs[0].raw
        assert not reader.closed
    assert reader.closed and reader.catalog.closed
    reader.close()  # idempotent
    reader.close()
    for call in (
        lambda: reader.get_record(key),
        lambda: reader.get_raw(key),
        lambda: reader[key],
        lambda: key in reader,
        lambda: reader.contains_key(key),
        lambda: reader.get_feature(key, "image"),
        lambda: reader.get_many([key]),
        lambda: reader.get_record_at(0),
        lambda: reader.get_many_at(slice(0, 3)),
        lambda: reader.key_at(1),
        lambda: reader.get_keys(),
        lambda: reader.where("label = 1"),
        lambda: reader.verify(),
    ):
        with pytest.raises(CatalogError, match="is closed"):
            call()

    explicit = TFRecordRandomAccess(pattern)
    explicit.close()
    explicit.close()
    assert explicit.closed and explicit.catalog.closed

    # A reader that does not own its catalog leaves it open.
    with Catalog(explicit.index_file) as catalog:
        with catalog.dataset("part") as borrowed:
            assert borrowed.get_raw(key) == recs[0].raw
        assert borrowed.closed and not catalog.closed
        with catalog.dataset("part") as again:
            assert again.get_raw(key) == recs[0].raw
    assert catalog.closed
    assert shardcat.__version__


def test_empty_feature_reads_as_none_like_tfd_utils(tmp_path):
    from shardcat import TFRecordRandomAccess as Shardcat

    path = tmp_path / "e.tfrecord"
    with TFRecordWriter(path) as w:
        w.write(make_example({"key": "a", "empty": [], "one": [5]}))
    with Shardcat(str(path)) as reader:
        assert reader.get_feature_list("a", "empty") is None
        assert reader.get_feature("a", "empty") is None
        assert reader.get_feature_list("a", "one") == [5]


def test_reader_raises_when_its_shard_was_reindexed_meanwhile(tmp_path):
    from shardcat import Catalog, StaleShardError

    path = tmp_path / "s.tfrecord"
    with TFRecordWriter(path) as w:
        for i in range(4):
            w.write(make_example({"key": f"k{i}"}))
    with Catalog(tmp_path / "c.sqlite") as cat, cat.ingest(path, "d") as old:
        with TFRecordWriter(path) as w:
            w.write(make_example({"key": "other"}))
        cat.ingest(path, "d").close()
        with pytest.raises(StaleShardError, match="changed since this reader opened"):
            old.get_record_at(2)
        # keys follow the new version
        assert old.get_raw("other") == make_example({"key": "other"}).SerializeToString()
        old.refresh()
        assert old.key_at(0) == "other" and len(old) == 1


def test_ingest_without_a_name_never_takes_over_another_path_set(tmp_path):
    from shardcat import Catalog

    for name in ("part-0", "part-1"):
        with TFRecordWriter(tmp_path / f"{name}.tfrecord") as w:
            w.write(make_example({"key": name}))
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(tmp_path / "part-0.tfrecord").close()
        cat.ingest(tmp_path / "part-1.tfrecord").close()
        cat.ingest(tmp_path / "part-0.tfrecord").close()  # found again by its source
        assert [(d.name, d.records) for d in cat.datasets()] == [("part", 1), ("part_2", 1)]


def test_batch_queries_look_keys_up_instead_of_scanning(tmp_path):
    """get_many must loop over the batch: a plan that scans records is O(dataset) per batch."""
    from shardcat import Catalog
    from shardcat.catalog import lookup as reader_module

    path = tmp_path / "s.tfrecord"
    with TFRecordWriter(path) as w:
        w.write(make_example({"key": "k"}))
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(path, "d").close()
        conn = cat.store.reader_connection()
        batch = cat.store.backend.dialect.batch_items
        every, one_range = (reader_module.statements(1, r, p, batch) for r, p in ((0, 0), (1, 1)))
        for sql, params in [
            (every.many_by_key, ("[]",)),
            (every.many_at, ("[]",)),
            (one_range.many_by_key, ("[]",)),
            (one_range.many_at, ("[]",)),
            (every.members_at, ("[]",)),
        ]:
            plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
            assert plan[0].startswith("SCAN j"), plan
            steps = [step for step in plan[1:] if not step.startswith("USE TEMP B-TREE")]
            assert steps and all(step.startswith("SEARCH") for step in steps), plan


def test_lookups_use_a_short_snapshot_and_queries_see_the_latest_commit(tmp_path, monkeypatch):
    import time

    from shardcat import Catalog
    from shardcat.catalog import store as catalog_module

    monkeypatch.setattr(catalog_module, "SNAPSHOT_SECONDS", 0.2)
    for name in ("a", "b"):
        with TFRecordWriter(tmp_path / f"{name}.tfrecord") as w:
            w.write(make_example({"key": f"{name}0"}))
    with Catalog(tmp_path / "c.sqlite") as cat, Catalog(tmp_path / "c.sqlite") as other:
        cat.ingest(tmp_path / "a.tfrecord", "d").close()
        with cat.dataset("d") as reader:
            assert reader.contains_key("a0")
            assert cat.store.reader_connection().in_transaction is False  # only lookups hold one
            reader.contains_key("a0")
            assert cat.store.reader_connection(snapshot=True).in_transaction is True
            other.ingest(str(tmp_path / "*.tfrecord"), "d").close()  # another connection
            assert cat.query("SELECT count(*) FROM d") == [(2,)]  # queries: latest commit
            time.sleep(0.25)
            assert reader.contains_key("b0")  # lookups: at most SNAPSHOT_SECONDS later


def test_another_spelling_of_the_glob_finds_the_same_dataset(tmp_path):
    from shardcat import Catalog, TFRecordRandomAccess

    for i in range(2):
        with TFRecordWriter(tmp_path / f"part-{i}.tfrecord") as w:
            w.write(make_example({"key": f"k{i}"}))
    catalog = tmp_path / "c.sqlite"
    with Catalog(catalog) as cat:
        cat.ingest(str(tmp_path / "*.tfrecord"), "train").close()
        indexed = cat.query("SELECT id, indexed_at FROM shardcat_shards ORDER BY id")
    same = [str(tmp_path / "part-1.tfrecord"), str(tmp_path / "part-0.tfrecord")]
    with TFRecordRandomAccess(same, index_file=catalog) as reader:
        assert reader.dataset == "train"
        assert reader.get_keys() == ["k0", "k1"]
    with TFRecordRandomAccess(str(tmp_path / "part-0.tfrecord"), index_file=catalog) as sub:
        assert sub.dataset != "train"  # a subset is another dataset, never a re-sync of train
    with Catalog(catalog) as cat:
        rows = cat.query(
            "SELECT id, indexed_at FROM shardcat_shards WHERE dataset_id = 1 ORDER BY id"
        )
        assert rows == indexed  # nothing re-indexed
        assert cat.info("train").records == 2
