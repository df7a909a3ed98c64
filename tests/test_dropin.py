"""The tfd-utils drop-ins against tfd-utils' own behaviour: ``reader.index``, several
datasets over the same shards (key rules, tar groupings), tfd-utils' tar grouping over a
whole archive, duplicate keys (the last one wins), readers over a subset of an indexed
dataset's shards (no shard read again), and ``format="auto"``."""

from __future__ import annotations

import contextlib
import gzip
import io
import sqlite3
import tarfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shardcat import (
    Catalog,
    CatalogError,
    IngestError,
    TarRandomAccess,
    TFRecordRandomAccess,
    TFRecordWriter,
    make_example,
)
from shardcat.formats import tar
from shardcat.formats.base import Format
from shardcat.formats.registry import get_format
from shardcat.formats.tfrecord import TFRecordFormat
from shardcat.testing.required import need

tfd_utils = need("tfd_utils", why="shardcat[bench]")


def write_tfrecord(path: Path, records: list[dict[str, Any]]) -> list[int]:
    """Write ``records`` (feature dicts); returns each frame's offset."""
    with TFRecordWriter(path) as writer:
        return [writer.write(make_example(r)) for r in records]


def add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_700_000_000
    tf.addfile(info, io.BytesIO(data))


def write_tar(path: Path, members: list[tuple[str, bytes]], mode: str = "w") -> None:
    with tarfile.open(path, mode, format=tarfile.GNU_FORMAT) as tf:
        for name, data in members:
            add(tf, name, data)


def shard_rows(catalog: Path) -> list[tuple[str, str, float]]:
    """(dataset, shard path, indexed_at) of every shard, read without writing."""
    uri = catalog.resolve().as_uri() + "?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        return conn.execute(
            "SELECT d.name, s.path, s.indexed_at FROM shardcat_shards s JOIN shardcat_datasets d "
            "ON d.id = s.dataset_id ORDER BY d.name, s.path"
        ).fetchall()


class Scans:
    """The names of the shards scanned (read) by ingests, in this process and in the
    ingest worker processes it forks (they append to a file)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.start = 0

    def __call__(self) -> list[str]:
        """The shards scanned since the last ``reset``."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return lines[self.start :]

    def reset(self) -> None:
        self.start += len(self())


@pytest.fixture
def scans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Scans:
    counter = Scans(tmp_path / "scans.log")
    # the formats' own scan_shard: the native scanner's entry points
    for cls in (Format, TFRecordFormat, tar.TarFormat, type(get_format("recordio"))):

        def counting(fmt: Any, path: str, options: Any, original: Any = cls.scan_shard) -> Any:
            with open(counter.log, "a") as log:
                log.write(Path(path).name + "\n")
            return original(fmt, path, options)

        monkeypatch.setattr(cls, "scan_shard", counting)
    return counter


def their_tfrecord_index(paths: list[str], tmp_path: Path, **kw: Any) -> dict[str, Any]:
    with contextlib.redirect_stdout(io.StringIO()):  # tfd-utils prints its progress
        theirs = tfd_utils.TFRecordRandomAccess(
            paths, index_file=str(tmp_path / "theirs.index"), use_multiprocessing=False, **kw
        )
        return dict(theirs.index)


def their_tar(path: str, tmp_path: Path) -> Any:
    with contextlib.redirect_stdout(io.StringIO()):
        theirs = tfd_utils.TarRandomAccess(path, index_file=str(tmp_path / "theirs.tar_index"))
        _ = theirs.index
    return theirs


# -- 1. reader.index ---------------------------------------------------------------------


def test_tfrecord_index_is_a_read_only_mapping_like_tfd_utils(tmp_path: Path) -> None:
    paths, offsets = [], []
    for s in range(2):
        path = tmp_path / f"part-{s}.tfrecord"
        offsets += write_tfrecord(
            path, [{"key": f"k{s}{i}", "data": b"x" * (i + 1)} for i in range(3)]
        )
        paths.append(str(path))
    k12 = len(make_example({"key": "k12", "data": b"xxx"}).SerializeToString())
    theirs = their_tfrecord_index(paths, tmp_path)
    with TFRecordRandomAccess(paths) as reader:
        index = reader.index
        assert isinstance(index, Mapping) and isinstance(index, dict)  # tfd-utils checks dict
        assert len(index) == 6 and list(index) == reader.get_keys()
        assert "k12" in index and "nope" not in index and 7 not in index
        assert (
            index["k12"] == theirs["k12"] == {"file": paths[1], "offset": offsets[5], "length": k12}
        )
        assert dict(index.items()) == theirs
        assert list(index.keys()) == list(theirs) and list(index.values()) == list(theirs.values())
        assert index.get("nope") is None and index.get("k00") == theirs["k00"]
        with pytest.raises(KeyError):
            index["nope"]
        for mutate in (
            lambda: index.__setitem__("k00", {}),
            lambda: index.__delitem__("k00"),
            lambda: index.update({"a": 1}),
            lambda: index.pop("k00"),
            lambda: index.clear(),
            lambda: index.setdefault("a", 1),
            lambda: index.popitem(),
        ):
            with pytest.raises(TypeError, match="read-only"):
                mutate()
        assert len(index) == 6 and index == theirs
        assert repr(index) == f"<index of dataset {reader.dataset!r}: 6 keys>"


def test_index_lookups_are_one_query_and_iteration_is_paged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardcat.readers import index as index_module

    path = tmp_path / "part-0.tfrecord"
    write_tfrecord(path, [{"key": f"k{i:02d}"} for i in range(10)])
    monkeypatch.setattr(index_module, "PAGE", 4)
    with TFRecordRandomAccess(str(path)) as reader:
        index = reader.index
        statements: list[str] = []
        conn = reader.catalog.reader_connection(snapshot=True)
        conn.set_trace_callback(statements.append)
        try:
            assert index["k03"]["offset"] > 0
            assert sum(s.startswith("SELECT") for s in statements) == 1
            statements.clear()
            assert "k09" in index
            assert sum(s.startswith("SELECT") for s in statements) == 1
            statements.clear()
            assert len(index) == 10
            assert not statements  # the shard list already knows
            assert [k for k, _ in index.items()] == [f"k{i:02d}" for i in range(10)]
            pages = [s for s in statements if "LIMIT" in s]
            assert len(pages) == 3  # 4 + 4 + 2 rows: never every row at once
        finally:
            conn.set_trace_callback(None)


def test_tar_index_holds_tfd_utils_member_locations(tmp_path: Path) -> None:
    path = tmp_path / "p.tar"
    write_tar(
        path,
        [("a.jpg", b"jpeg-a"), ("a.json", b"{}"), ("./b.jpg", b"jpeg-b"), ("sub/c.txt", b"c")],
    )
    offsets = {name: offset for name, offset, _ in tar.regular_members(str(path))}
    theirs = their_tar(str(path), tmp_path)
    with TarRandomAccess(str(path)) as reader:
        index = reader.index
        assert list(index) == ["a", "b", "sub/c"] == list(theirs.index)
        for key in ("a", "sub/c"):
            assert index[key] == theirs.index[key]
        # the one difference: member names as the tfd grouping normalizes them ("./b.jpg")
        assert theirs.index["b"]["jpg"]["member_name"] == "./b.jpg"
        assert index["b"] == {
            "jpg": {
                "file": str(path),
                "member_name": "b.jpg",
                "data_offset": offsets["./b.jpg"],
                "size": 6,
            }
        }
        assert index["a"]["json"] == {
            "file": str(path),
            "member_name": "a.json",
            "data_offset": offsets["a.json"],
            "size": 2,
        }
    theirs.close()


def test_index_of_a_dataset_keyed_by_position(tmp_path: Path) -> None:
    path = tmp_path / "part-0.tfrecord"
    offsets = write_tfrecord(path, [{"data": b"x" * i} for i in range(3)])
    with TFRecordRandomAccess(str(path), key_by_position=True) as reader:
        assert list(reader.index) == ["0", "1", "2"]
        length = len(make_example({"data": b"xx"}).SerializeToString())
        assert reader.index["2"] == {"file": str(path), "offset": offsets[2], "length": length}
        assert "3" not in reader.index and "01" not in reader.index


# -- 2. several datasets over the same shards ---------------------------------------------


def test_another_key_feature_opens_its_own_dataset(tmp_path: Path, scans: Scans) -> None:
    path = tmp_path / "keys.tfrecord"
    write_tfrecord(path, [{"key": f"s{i}", "id": i + 1, "score": i + 0.5} for i in range(3)])
    with TFRecordRandomAccess(str(path)) as by_key:
        assert by_key.get_keys() == ["s0", "s1", "s2"] and by_key.dataset == "keys"
    with TFRecordRandomAccess(str(path), key_feature_name="id") as by_id:
        assert by_id.dataset == "keys_by_id"
        assert by_id.get_keys() == ["1", "2", "3"]
        assert by_id.get_feature("2", "key") == b"s1"
        by_id.rebuild_index()
        assert by_id.contains_key("1")
    with TFRecordRandomAccess(str(path), key_feature_name="score") as by_score:
        assert by_score.dataset == "keys_by_score" and "2.5" in by_score
    scanned = len(scans())
    for feature, name in (("key", "keys"), ("id", "keys_by_id"), ("score", "keys_by_score")):
        with TFRecordRandomAccess(str(path), key_feature_name=feature) as again:
            assert again.dataset == name
        with TFRecordRandomAccess(str(path), key_feature_name=feature, readonly=True) as ro:
            assert ro.dataset == name
    assert len(scans()) == scanned  # found again, nothing re-read
    with Catalog(tmp_path / "shardcat.sqlite") as cat:
        assert [(d.name, d.key_rule) for d in cat.datasets()] == [
            ("keys", "feature:key"),
            ("keys_by_id", "feature:id"),
            ("keys_by_score", "feature:score"),
        ]
        with pytest.raises(CatalogError, match="another dataset"):  # a name given: refused
            cat.ingest(path, "keys", key="id")
        with cat.ingest(path, key=None) as by_position:  # no name: a dataset of its own
            assert by_position.dataset == "keys_by_position" and len(by_position) == 3


def test_tar_reader_after_a_webdataset_ingest(tmp_path: Path, scans: Scans) -> None:
    path = tmp_path / "shard-0.tar"
    write_tar(path, [("s1.seg.png", b"png"), ("s1.jpg", b"jpg"), ("s2.jpg", b"jpg2")])
    from shardcat.cli import app

    result = CliRunner().invoke(
        app, ["ingest", str(path), "--grouping", "webdataset", "-c", str(tmp_path / "c.sqlite")]
    )
    assert result.exit_code == 0, result.output
    with TarRandomAccess(str(path), index_file=tmp_path / "c.sqlite") as reader:
        assert reader.dataset == "shard_tfd"
        assert sorted(reader.get_keys()) == ["s1", "s1.seg", "s2"]
        assert reader.get_record("s1.seg") == {"png": b"png"}
    with TarRandomAccess(str(path), index_file=tmp_path / "c.sqlite", grouping="webdataset") as w:
        assert w.dataset == "shard" and w.get_record("s1") == {"seg.png": b"png", "jpg": b"jpg"}
    with Catalog(tmp_path / "c.sqlite") as cat:
        assert [(d.name, d.grouping) for d in cat.datasets()] == [
            ("shard", "webdataset"),
            ("shard_tfd", "tfd"),
        ]
    assert scans() == ["shard-0.tar", "shard-0.tar"]  # once per grouping


# -- 3. tfd grouping is tfd-utils' {stem: {ext: member}} over the whole archive ---------------


def test_tfd_grouping_merges_a_stems_members_across_the_archive(tmp_path: Path) -> None:
    path = tmp_path / "wds.tar"
    members = [  # as webdataset's TarWriter writes a sample with a seg.png member
        ("s0006.cls", b"6"),
        ("s0006.jpg", b"jpeg-6"),
        ("s0006.seg.png", b"png-6"),
        ("s0006.txt", b"caption 6"),
        ("s0007.cls", b"7"),
        ("s0007.jpg", b"jpeg-7"),
    ]
    write_tar(path, members)
    offsets = {name: (offset, size) for name, offset, size in tar.regular_members(str(path))}
    entries = {e.key: e for e in get_format("tar").scan(str(path), {"grouping": "tfd"})}
    assert list(entries) == ["s0006", "s0006.seg", "s0007"]
    s6 = entries["s0006"]
    assert [m[0] for m in s6.members] == ["cls", "jpg", "txt"]
    assert s6.offset == offsets["s0006.cls"][0] - 512  # the first member's header
    assert s6.offset + s6.length == sum(offsets["s0006.txt"])  # to the end of its last member
    assert s6.fields == {"cls": 6, "txt": "caption 6"}
    # webdataset grouping stays consecutive runs, as webdataset reads them
    assert [e.key for e in get_format("tar").scan(str(path), {})] == ["s0006", "s0007"]
    theirs = their_tar(str(path), tmp_path)
    with TarRandomAccess(str(path)) as ours:
        assert sorted(ours.get_keys()) == sorted(theirs.get_keys())
        for key in theirs.get_keys():
            assert ours.get_record(key) == theirs.get_record(key)
        assert ours["s0006"] == {"cls": b"6", "jpg": b"jpeg-6", "txt": b"caption 6"}
        assert ours.get_feature("s0006.seg", "png") == b"png-6"
        assert ours.verify() == []
        assert ours.where("cls = 6") == ["s0006"]
    theirs.close()


def test_a_repeated_member_name_is_last_one_wins(tmp_path: Path) -> None:
    path = tmp_path / "appended.tar"
    write_tar(path, [("a.jpg", b"first"), ("a.txt", b"t"), ("b.jpg", b"b")])
    write_tar(path, [("a.jpg", b"second")], mode="a")  # tar -r: appended later
    with tarfile.open(path) as tf:
        assert tf.extractfile("a.jpg").read() == b"second"  # type: ignore[union-attr]
    entries = list(get_format("tar").scan(str(path), {"grouping": "tfd"}))
    assert [(e.key, [m[0] for m in e.members]) for e in entries] == [
        ("a", ["jpg", "txt"]),
        ("b", ["jpg"]),
    ]
    theirs = their_tar(str(path), tmp_path)
    with TarRandomAccess(str(path)) as ours:
        assert ours["a"] == theirs.get_record("a") == {"jpg": b"second", "txt": b"t"}
        assert ours.get_stats()["duplicates_dropped"] == 0  # one sample, not two
        assert ours.verify() == []
    theirs.close()


def test_dali_export_of_a_merged_tfd_sample(tmp_path: Path) -> None:
    from shardcat.facade import export

    path = tmp_path / "d.tar"
    write_tar(path, [("x.jpg", b"j"), ("x.seg.png", b"p"), ("x.cls", b"1")])
    offsets = {name: (offset, size) for name, offset, size in tar.regular_members(str(path))}
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(path, "d", grouping="tfd").close()
        written = export.export_index(cat, "d", tmp_path / "idx")
        (lines,) = [Path(p).read_text().splitlines() for p in written]

    def group(name: str, ext: str) -> str:
        return f"{ext} {offsets[name][0]} {offsets[name][1]} {name}"

    # wds2idx's own grouping of the same members: the first dot of the basename
    assert lines == [
        "v1.2 1",
        f"{group('x.jpg', 'jpg')} {group('x.seg.png', 'seg.png')} {group('x.cls', 'cls')}",
    ]


# -- 4. duplicate keys in the drop-ins: the last one wins, said once -----------------------


def test_duplicate_keys_last_one_wins_like_tfd_utils(tmp_path: Path) -> None:
    a, b = tmp_path / "part-0.tfrecord", tmp_path / "part-1.tfrecord"
    write_tfrecord(a, [{"key": "x", "v": 1}, {"key": "y", "v": 2}, {"key": "x", "v": 3}])
    write_tfrecord(b, [{"key": "y", "v": 4}, {"key": "z", "v": 5}])
    paths = [str(a), str(b)]
    theirs = their_tfrecord_index(paths, tmp_path)
    with pytest.warns(UserWarning, match=r"2 duplicate records .* the last one of each key"):
        reader = TFRecordRandomAccess(paths)
    with reader:
        assert reader.get_keys() == ["x", "y", "z"]
        assert {k: reader.get_feature(k, "v") for k in "xyz"} == {"x": 3, "y": 4, "z": 5}
        assert dict(reader.index.items()) == theirs
        assert reader.get_stats()["duplicates_dropped"] == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: opening it again says nothing
        with TFRecordRandomAccess(paths) as again:
            assert again.get_stats()["duplicates_dropped"] == 2 and len(again) == 3
    # the library and the CLI keep the error default
    with Catalog(tmp_path / "c.sqlite") as cat, pytest.raises(IngestError, match="duplicate key"):
        cat.ingest(paths)


def test_duplicate_stems_across_archives_last_one_wins(tmp_path: Path) -> None:
    write_tar(tmp_path / "a-0.tar", [("k.jpg", b"old"), ("k.txt", b"t0")])
    write_tar(tmp_path / "a-1.tar", [("k.jpg", b"new")])
    pattern = str(tmp_path / "a-*.tar")
    with pytest.warns(UserWarning, match="1 duplicate record"):
        reader = TarRandomAccess(pattern)
    with reader:
        assert reader["k"] == {"jpg": b"new"}  # tfd-utils' dict.update: the later archive's
        assert reader.get_stats()["duplicates_dropped"] == 1
    with Catalog(tmp_path / "c.sqlite") as cat, pytest.raises(IngestError, match="'k'"):
        cat.ingest(pattern, grouping="tfd")


# -- 5. a reader over a subset of an indexed dataset's shards ------------------------------


def write_train(directory: Path, shards: int = 10) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for s in range(shards):
        name = f"train-{s:05d}.tfrecord"
        keys[name] = [f"r{s}_{i}" for i in range(3)]
        write_tfrecord(
            directory / name,
            [
                {"key": k, "label": (s + i) % 4, "image": k.encode() * 3}
                for i, k in enumerate(keys[name])
            ],
        )
    return keys


def test_subset_reader_opens_without_reading_a_shard(tmp_path: Path, scans: Scans) -> None:
    keys = write_train(tmp_path)
    with TFRecordRandomAccess(str(tmp_path / "train-*.tfrecord")) as full:
        assert full.dataset == "train" and len(full) == 30
    assert len(scans()) == 10
    scans.reset()
    before = {p: t for d, p, t in shard_rows(tmp_path / "shardcat.sqlite")}
    with TFRecordRandomAccess(str(tmp_path / "train-0000[0-4].tfrecord")) as sub:
        assert scans() == []  # not one shard read again
        assert sub.dataset == "train_2"
        wanted = [k for s in range(5) for k in keys[f"train-{s:05d}.tfrecord"]]
        assert sub.get_keys() == wanted and len(sub) == 15
        assert sub.key_at(14) == "r4_2" and sub.get_record_at(3).features.feature[
            "key"
        ].bytes_list.value == [b"r1_0"]
        assert sub.get_feature("r2_1", "image") == b"r2_1" * 3
        assert sub.get_feature("r7_0", "image") is None  # not in the subset
        assert sub.where("label = 0") == [k for k in wanted if k in _label0(keys, 5)]
        assert sub.get_stats()["records_per_file"] == {
            f"train-{s:05d}.tfrecord": 3 for s in range(5)
        }
        assert sub.verify() == []
    rows = shard_rows(tmp_path / "shardcat.sqlite")
    assert [(p, t) for d, p, t in rows if d == "train_2"] == [
        (p, before[p]) for p in sorted(before)[:5]
    ]  # the rows of train, indexed_at and all
    with TFRecordRandomAccess(str(tmp_path / "train-0000[0-4].tfrecord")) as again:
        assert again.dataset == "train_2"
    assert scans() == []
    # the subset is a dataset of its own: a changed shard is re-read for it alone
    write_tfrecord(tmp_path / "train-00001.tfrecord", [{"key": "new", "label": 1}])
    with TFRecordRandomAccess(str(tmp_path / "train-0000[0-4].tfrecord")) as sub:
        assert scans() == ["train-00001.tfrecord"]
        assert "new" in sub and "r1_0" not in sub and len(sub) == 13


def _label0(keys: dict[str, list[str]], shards: int) -> set[str]:
    return {
        k
        for s in range(shards)
        for i, k in enumerate(keys[f"train-{s:05d}.tfrecord"])
        if (s + i) % 4 == 0
    }


def test_subset_of_tar_shards_shares_members(tmp_path: Path, scans: Scans) -> None:
    for s in range(3):
        write_tar(
            tmp_path / f"w-{s}.tar", [(f"k{s}.jpg", bytes([s]) * 4), (f"k{s}.cls", b"%d" % s)]
        )
    with TarRandomAccess(str(tmp_path / "w-*.tar")) as full:
        assert len(full) == 3
    with TarRandomAccess([str(tmp_path / "w-0.tar"), str(tmp_path / "w-2.tar")]) as sub:
        assert len(scans()) == 3
        assert sub.get_keys() == ["k0", "k2"]
        assert sub["k2"] == {"jpg": b"\x02" * 4, "cls": b"2"}
        assert sub.where("cls = 2") == ["k2"]
        assert sub.index["k0"]["jpg"]["file"] == str(tmp_path / "w-0.tar")


def test_a_shard_that_lost_duplicates_is_read_again_for_a_subset(
    tmp_path: Path, scans: Scans
) -> None:
    a, b = tmp_path / "part-0.tfrecord", tmp_path / "part-1.tfrecord"
    write_tfrecord(a, [{"key": "x", "v": 1}, {"key": "y", "v": 2}])
    write_tfrecord(b, [{"key": "x", "v": 3}])
    with pytest.warns(UserWarning):
        TFRecordRandomAccess(str(tmp_path / "part-*.tfrecord")).close()
    scans.reset()
    with TFRecordRandomAccess(str(a)) as sub:  # part-0 lost "x" to part-1: not a copy
        assert scans() == ["part-0.tfrecord"]
        assert sub.get_feature("x", "v") == 1 and len(sub) == 2
    with TFRecordRandomAccess(str(b)) as sub:  # part-1 is whole: shared
        assert scans() == ["part-0.tfrecord"]
        assert sub.get_feature("x", "v") == 3


# -- 6. format="auto" ------------------------------------------------------------------------


def test_format_auto_detects(tmp_path: Path) -> None:
    path = tmp_path / "noext"
    write_tfrecord(path, [{"key": "a"}])
    with Catalog(tmp_path / "c.sqlite") as cat, cat.ingest(path, "d", format="auto") as reader:
        assert reader.format == "tfrecord" and reader.get_keys() == ["a"]
    from shardcat.cli import app

    result = CliRunner().invoke(
        app, ["ingest", str(path), "-d", "e", "--format", "auto", "-c", str(tmp_path / "c.sqlite")]
    )
    assert result.exit_code == 0, result.output
    assert "dataset e: 1 records" in result.output


def test_subset_shares_position_keys_and_seek_points(tmp_path: Path, scans: Scans) -> None:
    need("indexed_gzip", why="shardcat[compressed]")
    for s in range(3):
        write_tfrecord(tmp_path / f"p-{s}.tfrecord", [{"v": s * 10 + i} for i in range(2)])
        write_tar(tmp_path / f"t-{s}.tar", [(f"k{s}.txt", b"x%d" % s * 300)])
        with open(tmp_path / f"t-{s}.tar", "rb") as raw:
            data = raw.read()
        with gzip.open(tmp_path / f"t-{s}.tar.gz", "wb") as gz:
            gz.write(data)
        (tmp_path / f"t-{s}.tar").unlink()
    with TFRecordRandomAccess(str(tmp_path / "p-*.tfrecord"), key_by_position=True) as full:
        assert len(full) == 6
    with TarRandomAccess(str(tmp_path / "t-*.tar.gz")) as full:
        assert len(full) == 3
    scans.reset()
    subset = [str(tmp_path / "p-1.tfrecord"), str(tmp_path / "p-2.tfrecord")]
    with TFRecordRandomAccess(subset, key_by_position=True) as sub:
        assert [sub.get_feature(str(p), "v") for p in range(4)] == [10, 11, 20, 21]
        assert list(sub.index) == ["0", "1", "2", "3"]
    with TarRandomAccess(str(tmp_path / "t-[12].tar.gz")) as sub:
        assert sub["k2"] == {"txt": b"x2" * 300}
        assert sub.get_stats()["total_files"] == 2
    assert scans() == []
    with Catalog(tmp_path / "shardcat.sqlite") as cat:  # read by reference: the donor's
        shared = cat.query(
            "SELECT count(*) FROM shardcat_seek_indexes i JOIN shardcat_shares x ON "
            "x.donor_shard_id = i.shard_id "
            "JOIN shardcat_datasets d ON d.id = x.dataset_id WHERE d.name = 't_2'"
        )
        assert shared == [(2,)]
