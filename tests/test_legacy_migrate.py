"""Legacy index import (``catalog migrate``): tfd-utils pickles of every release's
layout, MXNet/DALI and vahidk text indexes; verification, re-rooting, --remap,
stale indexes, dry runs, SQL fields, discovery; and the issue's done-means flow:
migrate once, then ``TFRecordRandomAccess(glob)`` opens without re-indexing."""

from __future__ import annotations

import gzip
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from legacy_fixtures import (
    dump,
    indexed_at,
    old_tfd_tfrecord_index,
    quiet_stdout,
    scratch,
    tfd_tar_index,
    tfd_tfrecord_index,
    tfrecord2idx,
    write_tar,
    write_tfrecords,
)

from shardcat import (
    Catalog,
    CatalogError,
    RecordIOReader,
    TarRandomAccess,
    TFRecordRandomAccess,
    TFRecordWriter,
    make_example,
)
from shardcat.errors import LegacyIndexError
from shardcat.facade.catalog import migrate
from shardcat.formats.recordio import MAGIC, RecordIOWriter
from shardcat.migrations.legacy import load_pickle

GLOB = "*.tfrecord"


def shards_by_name(report) -> dict[str, object]:
    return {Path(s.path).name: s for d in report.datasets for s in d.shards}


# -- tfd-utils TFRecord indexes ---------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "index_name"),
    [
        ("train-{s:05d}-of-{n:05d}.tfrecord", "train-00000-of-00003_unified_tot3.index"),
        ("{s:05d}_of_{last:05d}.tfrecord", "all3.index"),  # a complete shard set (1.2.0+)
    ],
)
def test_migrate_once_then_tfrecord_random_access_opens_without_reindexing(
    tmp_path: Path, names: str, index_name: str
):
    d = tmp_path / "shards"
    write_tfrecords(d, names=names)
    index = tfd_tfrecord_index(str(d / GLOB))
    assert index.name == index_name

    report = migrate(d)

    (ds,) = report.datasets
    assert ds.catalog == str(d / "shardcat.sqlite")
    assert ds.source == [str(d / GLOB)]
    assert ds.key_rule == "feature:key"
    assert [s.action for s in ds.shards] == ["imported"] * 3
    assert all(s.verified and s.checked == 40 for s in ds.shards)  # 40 records < sample of 64
    assert ds.records == 120
    assert report.totals() == {
        "imported": 3,
        "verified": 3,
        "re-indexed": 0,
        "unchanged": 0,
        "failed": 0,
    }
    catalog = d / "shardcat.sqlite"
    # indistinguishable from ingesting the same shards from scratch (without fields)
    expected = scratch(str(d / GLOB), d / "scratch.sqlite", ds.dataset, fields=False)
    assert dump(catalog, ds.dataset) == expected
    before = indexed_at(catalog)

    from tfd_utils import TFRecordRandomAccess as TfdReader

    with quiet_stdout():
        tfd = TfdReader(str(d / GLOB), index_file=str(index))
        tfd_keys = tfd.get_keys()
        tfd_records = {k: tfd[k].SerializeToString() for k in tfd_keys}
        tfd.close()
    with TFRecordRandomAccess(str(d / GLOB)) as reader:
        assert reader.dataset == ds.dataset
        assert reader.index_file == str(catalog)
        assert sorted(reader.get_keys()) == sorted(tfd_keys)
        assert {k: reader[k].SerializeToString() for k in tfd_keys} == tfd_records
        assert reader.get_feature("r1_7", "label") == 0
    assert indexed_at(catalog) == before  # opened in O(1): nothing was re-indexed

    again = migrate(d)  # a second run finds everything in place
    assert [s.action for s in again.datasets[0].shards] == ["unchanged"] * 3
    assert again.datasets[0].records == 120
    assert indexed_at(catalog) == before


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("completion_order", [False, True])
def test_indexes_of_older_tfd_releases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, protocol: int, completion_order: bool
):
    """0.1.0-1.0.0: ``<first stem>_unified.index``, paths as given (relative here),
    shards in any order, any pickle protocol a Python 3 wrote by default."""
    write_tfrecords(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    files = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "data").glob(GLOB))
    index = old_tfd_tfrecord_index(files, protocol=protocol, completion_order=completion_order)
    assert index == Path("data/train-00000-of-00003_unified.index")
    assert pickle.loads(index.read_bytes())["r0_0"]["file"] == "data/train-00000-of-00003.tfrecord"

    report = migrate("data")

    (ds,) = report.datasets
    assert [(s.action, s.resolved_by) for s in ds.shards] == [("imported", "as recorded")] * 3
    expected = scratch(
        str(tmp_path / "data" / GLOB), tmp_path / "data" / "s.sqlite", ds.dataset, fields=False
    )
    assert dump(tmp_path / "data" / "shardcat.sqlite", ds.dataset) == expected


def test_single_file_index_of_every_release(tmp_path: Path):
    """``<stem>.index`` beside each file (tfd-utils opened on one file at a time):
    one dataset per index, named after it, that the same one-file call opens."""
    paths = write_tfrecords(tmp_path, shards=2)
    for p in paths:
        assert tfd_tfrecord_index(str(p)) == p.with_suffix(".index")
    report = migrate(tmp_path)
    assert [Path(d.legacy[0]).name for d in report.datasets] == [
        p.with_suffix(".index").name for p in paths
    ]
    assert [d.dataset for d in report.datasets] == [p.stem.replace("-", "_") for p in paths]
    assert all(d.count("imported") == 1 and len(d.legacy) == 1 for d in report.datasets)
    for d, p in zip(report.datasets, paths, strict=True):
        assert d.source == [str(p)]
        migrated = dump(tmp_path / "shardcat.sqlite", d.dataset)
        expected = scratch(str(p), tmp_path / f"{p.stem}.sqlite", d.dataset, fields=False)
        del migrated["schema"], expected["schema"]  # the catalog holds both datasets
        assert migrated == expected
    before = indexed_at(tmp_path / "shardcat.sqlite")
    for p in paths:
        with TFRecordRandomAccess(str(p)) as reader:
            assert len(reader) == 40
    assert indexed_at(tmp_path / "shardcat.sqlite") == before


def test_key_feature_is_read_off_the_records(tmp_path: Path):
    write_tfrecords(tmp_path, shards=2, key_feature="id")  # int64 keys, spelled str(int)
    tfd_tfrecord_index(str(tmp_path / GLOB), key_feature_name="id")
    (ds,) = migrate(tmp_path).datasets
    assert ds.key_rule == "feature:id"
    assert ds.count("imported") == 2
    before = indexed_at(tmp_path / "shardcat.sqlite")
    with TFRecordRandomAccess(str(tmp_path / GLOB), key_feature_name="id") as reader:
        assert reader.get_feature("100007", "label") == 0
        assert len(reader) == 80
    assert indexed_at(tmp_path / "shardcat.sqlite") == before


# -- trust but verify -----------------------------------------------------------------


def rewrite(path: Path, keys: list[str], payload: bytes = b"x") -> None:
    with TFRecordWriter(path) as w:
        for i, key in enumerate(keys):
            w.write(make_example({"key": key, "label": i % 7, "payload": payload}))


def test_stale_legacy_index_is_detected_and_reindexed(tmp_path: Path):
    paths = write_tfrecords(tmp_path, shards=4, per_shard=20)
    index = tfd_tfrecord_index(str(tmp_path / GLOB))
    built = index.stat().st_mtime_ns
    old = built - 10**9
    # 1: rewritten after the index was written (newer mtime)
    rewrite(paths[1], [f"new{i}" for i in range(25)])
    os.utime(paths[1], ns=(built + 10**9, built + 10**9))
    # 2: same frame sizes, other keys, mtime put back (an mtime-keeping copy of other data)
    others = write_tfrecords(tmp_path / "other", shards=4, per_shard=20, prefix="z")
    assert others[2].stat().st_size == paths[2].stat().st_size
    paths[2].write_bytes(others[2].read_bytes())
    os.utime(paths[2], ns=(old, old))
    # 3: a record appended, mtime put back
    with open(paths[3], "ab") as f, open(paths[0], "rb") as first:
        f.write(first.read(100))  # not even a whole record: ingest must fail on it
    os.utime(paths[3], ns=(old, old))

    report = migrate(tmp_path)

    shards = shards_by_name(report)
    names = [p.name for p in paths]
    assert shards[names[0]].action == "imported"
    assert shards[names[1]].action == "re-indexed"
    assert "modified after the legacy index was written" in shards[names[1]].reason
    assert shards[names[2]].action == "re-indexed"
    assert "has key='z2_0', the index says 'r2_0'" in shards[names[2]].reason
    assert shards[names[3]].action == "failed"  # re-indexed from the data, which is truncated
    assert shards[names[3]].reason is not None and "truncated" in shards[names[3]].reason
    assert report.failed
    assert shards[names[1]].records == 25

    # the same as a fresh ingest of what is on disk now (without the broken shard)
    os.unlink(paths[3])
    again = migrate(tmp_path)
    ds = again.datasets[0]
    assert {Path(s.path).name: s.action for s in ds.shards} == {
        names[0]: "unchanged",
        names[1]: "unchanged",
        names[2]: "unchanged",
        names[3]: "failed",  # the legacy index still lists it
    }
    assert "shard not found" in str(ds.shards[-1].reason)
    assert [Path(m).name for m in ds.legacy] == [index.name]
    assert dump(tmp_path / "shardcat.sqlite", ds.dataset) == scratch(
        str(tmp_path / GLOB), tmp_path / "s.sqlite", ds.dataset, fields=False
    )


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        ({"r0_0": None}, "the index has no record starting at byte 0 (its next one is at byte "),
        ({"r0_17": None}, "the index has no record starting at byte "),
        ({"r0_29": None}, "the index ends at byte "),
        ({"r0_5": ("offset", 1)}, "records at byte 1 overlap the one before"),
        ({"r0_29": ("length", 0)}, "the index ends at byte "),
    ],
)
def test_index_not_tiling_the_file_is_not_trusted(tmp_path: Path, edit: dict, why: str):
    (path,) = write_tfrecords(tmp_path, shards=1, per_shard=30)
    index = tfd_tfrecord_index(str(path))
    data = pickle.loads(index.read_bytes())
    for key, change in edit.items():
        if change is None:  # tfd-utils silently drops records (duplicate keys, a bad frame)
            del data[key]
        else:
            data[key][change[0]] = change[1]
    index.write_bytes(pickle.dumps(data))
    (ds,) = migrate(tmp_path, sample=2).datasets  # caught without re-reading those records
    assert ds.shards[0].action == "re-indexed"
    assert ds.shards[0].reason is not None
    assert ds.shards[0].reason.startswith("legacy index does not match the file: " + why)
    assert ds.records == 30


def test_dry_run_writes_nothing(tmp_path: Path):
    paths = write_tfrecords(tmp_path, shards=2)
    tfd_tfrecord_index(str(tmp_path / GLOB))
    listing = sorted(os.listdir(tmp_path))
    report = migrate(tmp_path, dry_run=True)
    assert report.dry_run
    assert [s.action for s in report.datasets[0].shards] == ["import", "import"]
    assert report.totals()["imported"] == 2 and report.totals()["verified"] == 2
    assert sorted(os.listdir(tmp_path)) == listing  # no catalog was created

    migrate(tmp_path)
    catalog = tmp_path / "shardcat.sqlite"
    before = (dump(catalog, "train"), catalog.read_bytes())
    rewrite(paths[0], ["a", "b"])
    report = migrate(tmp_path, dry_run=True)
    assert [s.action for s in report.datasets[0].shards] == ["re-index", "unchanged"]
    assert (dump(catalog, "train"), catalog.read_bytes()) == before


def test_sql_fields_are_filled_on_request(tmp_path: Path):
    write_tfrecords(tmp_path, shards=2)
    index = tfd_tfrecord_index(str(tmp_path / GLOB))
    catalog = tmp_path / "shardcat.sqlite"
    (ds,) = migrate(tmp_path).datasets
    assert not ds.fields
    assert ds.fill_fields == (
        f"catalog migrate {index} --dataset train --catalog {catalog} --fields"
    )
    with Catalog(catalog) as cat:
        assert cat.info("train").fields == {}

    (ds,) = migrate(index, dataset="train", catalog=catalog, fields=True).datasets
    assert [s.action for s in ds.shards] == ["re-indexed", "re-indexed"]
    assert all("--fields" in str(s.reason) for s in ds.shards)
    assert ds.fill_fields is None
    assert dump(catalog, "train") == scratch(str(tmp_path / GLOB), tmp_path / "s.sqlite", "train")
    with Catalog(catalog) as cat:
        assert cat.query("SELECT count(*) FROM train WHERE label = 3") == [(12,)]

    (ds,) = migrate(tmp_path).datasets  # later runs keep the fields
    assert ds.fields and [s.action for s in ds.shards] == ["unchanged", "unchanged"]


def test_moved_dataset_is_rerooted(tmp_path: Path):
    write_tfrecords(tmp_path / "old")
    tfd_tfrecord_index(str(tmp_path / "old" / GLOB))  # absolute paths under old/
    shutil.move(tmp_path / "old", tmp_path / "new")  # keeps mtimes
    report = migrate(tmp_path / "new")
    (ds,) = report.datasets
    assert [(s.action, s.resolved_by) for s in ds.shards] == [
        ("imported", "re-rooted beside the index")
    ] * 3
    assert all(s.path.startswith(str(tmp_path / "new")) for s in ds.shards)
    with TFRecordRandomAccess(str(tmp_path / "new" / GLOB)) as reader:
        assert len(reader) == 120 and reader.get_feature("r2_39", "label") == 4


def test_copy_beside_the_index_wins_over_the_recorded_original(tmp_path: Path):
    write_tfrecords(tmp_path / "a")
    tfd_tfrecord_index(str(tmp_path / "a" / GLOB))
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # copy2 keeps mtimes
    (ds,) = migrate(tmp_path / "b").datasets
    assert all(s.path.startswith(str(tmp_path / "b")) for s in ds.shards)
    assert ds.count("imported") == 3


def test_remap(tmp_path: Path):
    data = tmp_path / "data"
    write_tfrecords(data)
    (tmp_path / "indexes").mkdir()
    index = tfd_tfrecord_index(str(data / GLOB), index_file=tmp_path / "indexes" / "train.index")
    moved = tmp_path / "mnt" / "volume"
    moved.parent.mkdir()
    shutil.move(data, moved)
    catalog = tmp_path / "cat.sqlite"

    lost = migrate(index, catalog=catalog, dry_run=True)
    assert lost.failed
    assert [s.action for s in lost.datasets[0].shards] == ["failed"] * 3
    assert "not found" in str(lost.datasets[0].shards[0].reason)

    report = migrate(index, catalog=catalog, remap=[f"{data}={moved}"])
    (ds,) = report.datasets
    assert [s.action for s in ds.shards] == ["imported"] * 3
    assert all(s.resolved_by == f"remapped {data}={moved}" for s in ds.shards)
    assert ds.source == [str(moved / GLOB)]
    with Catalog(catalog) as cat, cat.dataset("train") as reader:
        assert len(reader) == 120


def test_missing_shard_is_reported(tmp_path: Path):
    paths = write_tfrecords(tmp_path, shards=3)
    tfd_tfrecord_index(str(tmp_path / GLOB))
    paths[1].unlink()
    report = migrate(tmp_path)
    actions = {Path(s.path).name: s.action for s in report.datasets[0].shards}
    assert actions == {
        paths[0].name: "imported",
        paths[1].name: "failed",
        paths[2].name: "imported",
    }
    assert report.datasets[0].records == 80
    assert report.failed


# -- untrusted pickles --------------------------------------------------------------------


class MakesAFile:
    """A pickle of this calls ``open(path, "w")`` when loaded unrestricted."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickle_that_calls_code_is_refused_without_side_effects(tmp_path: Path):
    write_tfrecords(tmp_path, shards=1)
    marker = tmp_path / "pwned"
    evil = {"r0_0": {"file": MakesAFile(str(marker)), "offset": 0, "length": 1}}
    (tmp_path / "train.index").write_bytes(pickle.dumps(evil))
    with pytest.raises(
        LegacyIndexError, match=r"refused to load this pickle: it asks for io\.open"
    ):
        migrate(tmp_path)
    assert not marker.exists()
    assert not (tmp_path / "shardcat.sqlite").exists()  # nothing was written
    # the same bytes loaded the usual way would have created the file: the test is real
    pickle.loads((tmp_path / "train.index").read_bytes())
    assert marker.exists()


def test_restricted_loader_admits_only_plain_data(tmp_path: Path):
    plain = {"a": [1, 2.5, "x", b"y", (3, None, True)], "b": {"c": -1}}
    path = tmp_path / "plain.pkl"
    path.write_bytes(pickle.dumps(plain, protocol=5))
    assert load_pickle(path) == plain

    from collections import OrderedDict

    path.write_bytes(pickle.dumps(OrderedDict(a=1)))  # harmless, but a class: refused
    with pytest.raises(LegacyIndexError, match=r"collections\.OrderedDict"):
        load_pickle(path)

    class WithPersistentIds(pickle.Pickler):
        def persistent_id(self, obj):
            return "id-1" if obj == "secret" else None

    with open(path, "wb") as f:
        WithPersistentIds(f).dump({"k": "secret"})
    with pytest.raises(LegacyIndexError, match="persistent id"):
        load_pickle(path)


def test_corrupt_and_truncated_pickles_name_the_file(tmp_path: Path):
    write_tfrecords(tmp_path, shards=2)
    index = tfd_tfrecord_index(str(tmp_path / GLOB))
    data = index.read_bytes()
    index.write_bytes(data[: len(data) // 2])
    with pytest.raises(LegacyIndexError, match="corrupt or truncated pickle") as info:
        migrate(tmp_path)
    assert info.value.path == str(index) and str(index) in str(info.value)
    index.write_bytes(b"\x80\x04\x95garbage that is no pickle")
    with pytest.raises(LegacyIndexError, match=str(index.name)):
        migrate(tmp_path)
    index.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(LegacyIndexError, match="not a tfd-utils index: the pickle holds a list"):
        migrate(tmp_path)
    index.write_bytes(pickle.dumps({"k": {"file": "x", "offset": -1, "length": 2}}))
    with pytest.raises(LegacyIndexError, match="not a tfd-utils index: entry 'k'"):
        migrate(tmp_path)


@pytest.mark.parametrize(
    ("key", "info", "message"),
    [
        ("k", {"file": "x", "offset": -1, "length": 2}, "entry 'k' lacks a file/offset/length"),
        ("k", {"file": "x", "offset": 0, "length": -2}, "entry 'k' lacks a file/offset/length"),
        ("k", {"file": "x", "offset": 1.0, "length": 2}, "entry 'k' lacks a file/offset/length"),
        ("k", {"file": "x", "offset": True, "length": 2}, "entry 'k' lacks a file/offset/length"),
        ("k", {"file": b"x", "offset": 0, "length": 2}, "entry 'k' lacks a file/offset/length"),
        ("k", {"file": "x", "offset": 0, "size": 2}, "entry 'k' lacks a file/offset/length"),
        ("k", {"file": "x", "offset": 0}, "entry 'k' is not a key with a file/offset/length dict"),
        ("k", [1, 2, 3], "entry 'k' is not a key with a file/offset/length dict"),
        (7, {"file": "x", "offset": 0, "length": 2}, "entry 7 lacks a file/offset/length"),
    ],
)
def test_malformed_tfd_entries_are_named(tmp_path: Path, key: Any, info: Any, message: str):
    good = {"file": str(tmp_path / "a.tfrecord"), "offset": 0, "length": 1}
    index = tmp_path / "a.index"
    index.write_bytes(pickle.dumps({"a": good, key: info, "z": good}))
    with pytest.raises(LegacyIndexError, match=re.escape(f"not a tfd-utils index: {message}")):
        migrate(index)


# -- tar, RecordIO, offset indexes ------------------------------------------------------------


def test_tfd_tar_index(tmp_path: Path):
    write_tar(tmp_path / "a.tar", tag="a")
    write_tar(tmp_path / "b.tar", tag="b")
    index = tfd_tar_index(str(tmp_path / "*.tar"))
    assert index.name == "a_unified.tar_index"

    (ds,) = migrate(tmp_path).datasets
    assert ds.key_rule == "member-stem:tfd"
    assert [s.action for s in ds.shards] == ["imported", "imported"]
    assert ds.records == 24
    catalog = tmp_path / "shardcat.sqlite"
    expected = scratch(
        str(tmp_path / "*.tar"), tmp_path / "s.sqlite", ds.dataset, grouping="tfd", fields=False
    )
    assert dump(catalog, ds.dataset) == expected
    before = indexed_at(catalog)

    from tfd_utils import TarRandomAccess as TfdTar

    with quiet_stdout():
        tfd = TfdTar(str(tmp_path / "*.tar"), index_file=str(index))
        records = {k: tfd.get_record(k) for k in tfd.get_keys()}
        tfd.close()
    assert f"{'deep/' * 25}a3" in records
    with TarRandomAccess(str(tmp_path / "*.tar")) as reader:
        assert {k: reader.get_record(k) for k in reader.get_keys()} == records
    assert indexed_at(catalog) == before


def test_tar_member_missing_from_the_index_is_caught(tmp_path: Path):
    write_tar(tmp_path / "a.tar", tag="a")
    index = tfd_tar_index(str(tmp_path / "a.tar"))
    assert index.name == "a.tar_index"
    data = pickle.loads(index.read_bytes())
    del data["train/a008"]["cls"]
    index.write_bytes(pickle.dumps(data))
    (ds,) = migrate(tmp_path, sample=1).datasets
    assert ds.shards[0].action == "re-indexed"
    assert "member 'train/a008.cls'" in str(ds.shards[0].reason)


def test_compressed_tar_is_reindexed(tmp_path: Path):
    write_tar(tmp_path / "x.tar")
    (tmp_path / "x.tar.gz").write_bytes(gzip.compress((tmp_path / "x.tar").read_bytes()))
    (tmp_path / "x.tar").unlink()
    assert tfd_tar_index(str(tmp_path / "x.tar.gz")).name == "x.tar.tar_index"
    (ds,) = migrate(tmp_path).datasets
    assert ds.shards[0].action == "re-indexed"
    assert "compressed" in str(ds.shards[0].reason)
    assert dump(tmp_path / "shardcat.sqlite", ds.dataset) == scratch(
        str(tmp_path / "*.gz"), tmp_path / "s.sqlite", ds.dataset, grouping="tfd", fields=False
    )


def test_mxnet_idx_beside_rec(tmp_path: Path):
    magic = MAGIC.to_bytes(4, "little")
    for s in range(2):
        with RecordIOWriter(tmp_path / f"part-{s}.rec") as w:
            for i in range(25):
                payload = bytes([i]) * (i % 9) + (magic * (i % 3)) + b"end"
                w.write(payload, key=f"img-{s}-{i}")
    (ds,) = migrate(tmp_path).datasets
    assert ds.key_rule == "mxnet-idx"
    assert [s.action for s in ds.shards] == ["imported", "imported"]
    catalog = tmp_path / "shardcat.sqlite"
    assert dump(catalog, ds.dataset) == scratch(
        str(tmp_path / "*.rec"), tmp_path / "s.sqlite", ds.dataset, fields=False
    )
    before = indexed_at(catalog)
    with RecordIOReader(str(tmp_path / "*.rec")) as reader:
        assert reader["img-1-5"] == bytes([5]) * 5 + magic * 2 + b"end"
    assert indexed_at(catalog) == before


@pytest.mark.parametrize(
    "name", ["{stem}.idx", "{name}.idx", "{stem}.tfindex", "{name}.tfindex", "{stem}.index"]
)
def test_tfrecord2idx_offset_indexes(tmp_path: Path, name: str):
    """DALI's and vahidk/tfrecord's tfrecord2idx: ``<offset> <size>`` lines; the
    records are keyed by position, as those tools read them."""
    paths = write_tfrecords(tmp_path, shards=2)
    for p in paths:
        tfrecord2idx(p, tmp_path / name.format(stem=p.stem, name=p.name))
    (ds,) = migrate(tmp_path).datasets
    assert ds.key_rule == "position"
    assert [s.action for s in ds.shards] == ["imported", "imported"]
    catalog = tmp_path / "shardcat.sqlite"
    assert dump(catalog, ds.dataset) == scratch(
        str(tmp_path / GLOB), tmp_path / "s.sqlite", ds.dataset, key=None, fields=False
    )
    before = indexed_at(catalog)
    with TFRecordRandomAccess(str(tmp_path / GLOB), key_by_position=True) as reader:
        assert reader.get_feature("41", "label") == 1  # shard 1, record 1
    assert indexed_at(catalog) == before


# -- discovery --------------------------------------------------------------------------------


def test_discovery(tmp_path: Path):
    write_tfrecords(tmp_path, shards=2, names="train-{s:05d}.tfrecord")
    write_tfrecords(tmp_path, shards=2, names="val-{s:05d}.tfrecord", prefix="v")
    files = sorted(str(p) for p in tmp_path.glob("train-*.tfrecord"))
    old = old_tfd_tfrecord_index(files)  # 1.0.0's name, superseded by the newer index
    os.utime(old, ns=(1, 1))
    tfd_tfrecord_index(files)
    tfd_tfrecord_index(str(tmp_path / "val-*.tfrecord"))
    (tmp_path / "notes.index").write_text("some other tool's index\n")
    (tmp_path / "shards.idx").write_text("v1.2 3\njpg 512 10 a.jpg\n")
    (tmp_path / "train-00000_unified_tot2.index.lock").write_text("123|456")

    report = migrate(tmp_path, dry_run=True)

    by_name = {d.dataset: d for d in report.datasets}
    assert sorted(by_name) == ["train", "val"]
    assert by_name["train"].source == [str(tmp_path / "train-*.tfrecord")]
    assert [Path(p).name for p in by_name["train"].legacy] == ["train-00000_unified_tot2.index"]
    skipped = {Path(p).name: reason for p, reason in report.skipped}
    assert set(skipped) == {old.name, "notes.index", "shards.idx"}
    assert "covered by" in skipped[old.name]
    assert "not a legacy index" in skipped["notes.index"]
    assert "DALI wds2idx" in skipped["shards.idx"]

    only_val = migrate(str(tmp_path / "val-*.tfrecord"), dry_run=True)  # shards given: their index
    assert [d.dataset for d in only_val.datasets] == ["val"]
    assert only_val.datasets[0].source == [str(tmp_path / "val-*.tfrecord")]

    with pytest.raises(CatalogError, match="not a legacy index shardcat knows"):
        migrate(tmp_path / "notes.index")
    with pytest.raises(CatalogError, match="--dataset names one dataset"):
        migrate(tmp_path, dataset="x", dry_run=True)
    with pytest.raises(CatalogError, match="no files match"):
        migrate(tmp_path / "nothing-*.index")


def test_custom_index_name_and_a_shard_starting_with_0x80(tmp_path: Path):
    """``index_file=`` may be any name; a TFRecord whose first record is 128 bytes
    long starts with 0x80 like a pickle, and is still taken for a shard."""
    pad = next(
        n
        for n in range(90, 130)
        if len(make_example({"key": "k0", "pad": b"x" * n}).SerializeToString()) == 128
    )
    shard = tmp_path / "odd.tfrecord"
    with TFRecordWriter(shard) as w:
        for i in range(5):
            w.write(make_example({"key": f"k{i}", "pad": b"x" * pad}))
    assert shard.read_bytes()[:2] == b"\x80\x00"
    index = tfd_tfrecord_index(str(shard), index_file=tmp_path / "cache.pkl")
    with Catalog(tmp_path / "c.sqlite") as cat:
        report = cat.migrate([shard, index], sample=0)
        (ds,) = report.datasets
        assert [(s.action, s.checked) for s in ds.shards] == [("imported", 5)]
        assert ds.source == [str(tmp_path / GLOB)]
        with cat.dataset(ds.dataset) as reader:
            assert reader.get_feature("k3", "pad") == b"x" * pad


@pytest.mark.parametrize(
    ("member", "field", "value", "problem"),
    [
        ("train/a000", "size", 299, "the header at byte"),  # sampled: first member
        ("train/a011", "member_name", "train/a011.png", "does not match its member name"),
        ("train/a006", "data_offset", 4096, "overlaps the member before"),
    ],
)
def test_tar_index_that_does_not_match_the_archive(
    tmp_path: Path, member: str, field: str, value: object, problem: str
):
    write_tar(tmp_path / "a.tar", tag="a")
    index = tfd_tar_index(str(tmp_path / "a.tar"))
    data = pickle.loads(index.read_bytes())
    data[member]["jpg"][field] = value
    index.write_bytes(pickle.dumps(data))
    (ds,) = migrate(tmp_path, sample=2).datasets
    assert ds.shards[0].action == "re-indexed"
    assert problem in str(ds.shards[0].reason)
    assert dump(tmp_path / "shardcat.sqlite", ds.dataset) == scratch(
        str(tmp_path / "a.tar"), tmp_path / "s.sqlite", ds.dataset, grouping="tfd", fields=False
    )


def test_mxnet_idx_missing_a_line(tmp_path: Path):
    with RecordIOWriter(tmp_path / "a.rec") as w:
        for i in range(10):
            w.write(bytes([i]) * 10, key=f"k{i}")
    idx = tmp_path / "a.idx"
    idx.write_text("".join(idx.read_text().splitlines(keepends=True)[:-1]))  # no line for k9
    os.utime(idx, ns=(2 * 10**18, 2 * 10**18))  # written after the .rec
    (ds,) = migrate(tmp_path, sample=1).datasets  # the last record is always re-read
    (shard,) = ds.shards
    assert shard.action == "failed"  # the ingest refuses a .rec with records the .idx lacks
    assert "legacy index does not match the file: record spans" in str(shard.reason)
    assert "re-indexing failed too" in str(shard.reason) and "has no line in a.idx" in str(
        shard.reason
    )


def test_an_empty_shard_no_index_lists_joins_the_dataset(tmp_path: Path):
    write_tfrecords(tmp_path, shards=3, per_shard=10)
    empty = tmp_path / "train-00002-of-00003.tfrecord"
    empty.write_bytes(b"")  # tfd-utils indexes it, but no entry names it
    tfd_tfrecord_index(str(tmp_path / GLOB))
    steps: list[tuple[str, int, int]] = []
    (ds,) = migrate(
        tmp_path, progress=lambda step, total: steps.append((step.name, step.done, total))
    ).datasets
    # the shard no index lists counts in the totals the progress bar shows
    assert [s for s in steps if s[0] == "verify"] == [("verify", i, 3) for i in (1, 2, 3)]
    assert [s for s in steps if s[0] == "commit"][-1] == ("commit", 3, 3)
    assert ds.source == [str(tmp_path / GLOB)]
    assert {Path(s.path).name: (s.action, s.reason) for s in ds.shards}[empty.name] == (
        "re-indexed",
        "not in any legacy index",
    )
    assert ds.count("imported") == 2
    before = indexed_at(tmp_path / "shardcat.sqlite")
    with TFRecordRandomAccess(str(tmp_path / GLOB)) as reader:
        assert len(reader) == 20
    assert indexed_at(tmp_path / "shardcat.sqlite") == before
