"""Which legacy index becomes which dataset, where migrate looks, and ``index_file=``
pointing at a legacy index.

- one legacy index = one dataset, openable (without re-indexing, with its own
  keys) by the reader call that made it; per-shard MXNet/DALI text indexes of
  one numbered shard set make one dataset;
- ``migrate(DATA_ROOT)`` walks the tree (``max_depth``, ``pattern``);
- a directory never stands for its legacy index files or catalogs;
- :func:`catalog_for_legacy_index`: a tfd-utils pickle given as ``index_file``
  is imported (verified) into a catalog beside it, once.
"""

from __future__ import annotations

import os
import pickle
import sqlite3
import warnings
from pathlib import Path

import pytest
from legacy_fixtures import (
    dump,
    indexed_at,
    quiet_stdout,
    scratch,
    tfd_tar_index,
    tfd_tfrecord_index,
    write_tar,
    write_tfrecords,
)
from typer.testing import CliRunner

from shardcat import (
    Catalog,
    CatalogError,
    IngestOptions,
    RecordIOReader,
    TarRandomAccess,
    TFRecordRandomAccess,
)
from shardcat.cli import app
from shardcat.errors import LegacyIndexError
from shardcat.facade.catalog import migrate
from shardcat.formats.recordio import IRHeader, RecordIOWriter, pack
from shardcat.paths import resolve_paths

GLOB = "*.tfrecord"
runner = CliRunner()

# what a TFRecord / tar reader hands catalog_for_legacy_index
AS_TFRECORD = IngestOptions(format="tfrecord")
AS_TAR = IngestOptions(format="tar")


def run(*args: object, code: int = 0):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == code, result.output + str(result.exception)
    return result


def write_split(path: Path, n: int) -> list[bytes]:
    """A ``.rec`` with its ``.idx`` keyed 0..n-1 (what ``im2rec`` and ``write_idx(i, ...)``
    in a loop write, and RecordIOWriter's default keys)."""
    payloads = [
        pack(IRHeader(0, float(i % 5), i, 0), f"{path.stem}-{i}".encode()) for i in range(n)
    ]
    with RecordIOWriter(path) as w:
        for p in payloads:
            w.write(p)
    return payloads


def tfd_keys_and_records(reader_cls: type, paths: object, index: Path) -> dict[str, object]:
    """What tfd-utils' own reader gives for the call that made ``index``."""
    with quiet_stdout():
        reader = reader_cls(paths, index_file=str(index))
        try:
            keys = reader.get_keys()
            if hasattr(reader, "tar_files"):
                return {k: reader.get_record(k) for k in keys}
            return {k: reader[k].SerializeToString() for k in keys}
        finally:
            reader.close()


# -- one legacy index = one dataset ---------------------------------------------------------


def test_mxnet_splits_side_by_side_are_datasets_of_their_own(tmp_path: Path):
    """train/val/test .rec + .idx in one directory, each .idx keyed 0..n-1: before,
    one dataset named after the directory, and two of three .rec files failed with
    duplicate key '0'."""
    sizes = {"train": 7, "val": 4, "test": 3}
    payloads = {name: write_split(tmp_path / f"{name}.rec", n) for name, n in sizes.items()}

    report = migrate(tmp_path)

    assert not report.failed
    by_name = {d.dataset: d for d in report.datasets}
    assert sorted(by_name) == ["test", "train", "val"]
    for name, n in sizes.items():
        d = by_name[name]
        assert d.key_rule == "mxnet-idx"
        assert d.source == [str(tmp_path / f"{name}.rec")]
        assert [Path(p).name for p in d.legacy] == [f"{name}.idx"]
        assert [(Path(s.path).name, s.action) for s in d.shards] == [(f"{name}.rec", "imported")]
        assert d.records == n
    catalog = tmp_path / "shardcat.sqlite"
    before = indexed_at(catalog)
    for name, n in sizes.items():
        with RecordIOReader(str(tmp_path / f"{name}.rec")) as reader:  # the call MXNet users make
            assert reader.dataset == name
            assert reader.get_keys() == [str(i) for i in range(n)]
            assert [reader[str(i)] for i in range(n)] == payloads[name]
    assert indexed_at(catalog) == before  # nothing was re-indexed


def test_each_tfd_index_is_the_dataset_of_the_reader_call_that_made_it(tmp_path: Path):
    """tfd-utils leaves one index per glob it was opened with; a.tar and b.tar hold
    the same keys, so one dataset of both could not even exist."""
    write_tar(tmp_path / "a.tar", samples=6, tag="s")
    write_tar(tmp_path / "b.tar", samples=9, tag="s")
    tar_indexes = {n: tfd_tar_index(str(tmp_path / f"{n}.tar")) for n in "ab"}
    assert [p.name for p in tar_indexes.values()] == ["a.tar_index", "b.tar_index"]
    write_tfrecords(tmp_path, shards=3, per_shard=10, names="{s:05d}_of_{last:05d}.tfrecord")
    all3 = tfd_tfrecord_index(str(tmp_path / "*_of_*.tfrecord"))
    assert all3.name == "all3.index"
    write_tfrecords(tmp_path, shards=1, per_shard=6, names="x.tfrecord")  # keys r0_*, as 00000_of
    write_tfrecords(tmp_path, shards=1, per_shard=5, names="y.tfrecord", prefix="q")
    pair = [str(tmp_path / "x.tfrecord"), str(tmp_path / "y.tfrecord")]
    unified = tfd_tfrecord_index(pair)
    assert unified.name == "x_unified_tot2.index"
    calls = {
        "a": (TarRandomAccess, str(tmp_path / "a.tar"), tar_indexes["a"]),
        "b": (TarRandomAccess, str(tmp_path / "b.tar"), tar_indexes["b"]),
        "all3": (TFRecordRandomAccess, str(tmp_path / "*_of_*.tfrecord"), all3),
        "x": (TFRecordRandomAccess, pair, unified),
    }
    from tfd_utils import TarRandomAccess as TfdTar
    from tfd_utils import TFRecordRandomAccess as TfdTFRecord

    tfd_cls = {TarRandomAccess: TfdTar, TFRecordRandomAccess: TfdTFRecord}
    expected = {n: tfd_keys_and_records(tfd_cls[c], p, i) for n, (c, p, i) in calls.items()}

    report = migrate(tmp_path)

    assert not report.failed
    assert len(report.datasets) == 4
    by_index = {Path(d.legacy[0]).name: d for d in report.datasets}
    assert {n: len(d.legacy) for n, d in by_index.items()} == {
        "a.tar_index": 1,
        "b.tar_index": 1,
        "all3.index": 1,
        "x_unified_tot2.index": 1,
    }
    assert by_index["a.tar_index"].dataset == "a"
    assert by_index["b.tar_index"].dataset == "b"
    assert by_index["x_unified_tot2.index"].dataset == "x"
    assert all(s.action == "imported" for d in report.datasets for s in d.shards)
    assert by_index["a.tar_index"].records == 6 and by_index["b.tar_index"].records == 9
    catalog = tmp_path / "shardcat.sqlite"
    before = indexed_at(catalog)
    for name, (cls, paths, _) in calls.items():
        with cls(paths) as reader:
            assert sorted(reader.get_keys()) == sorted(expected[name]), name
            if cls is TarRandomAccess:
                assert {k: reader.get_record(k) for k in expected[name]} == expected[name]
            else:
                assert {k: reader[k].SerializeToString() for k in expected[name]} == expected[name]
    assert indexed_at(catalog) == before  # each call found its dataset: nothing re-indexed


def test_an_index_whose_shards_are_exactly_another_index_s_shards_adds_no_dataset(
    tmp_path: Path,
):
    """A tfd-utils ``<stem>.index`` and an MXNet-style offsets file for the same one
    TFRecord shard: one dataset, from the keyed index."""
    (path,) = write_tfrecords(tmp_path, shards=1, per_shard=12, names="train.tfrecord")
    tfd_tfrecord_index(str(path))
    lines, pos, data = [], 0, path.read_bytes()
    while pos < len(data):
        n = int.from_bytes(data[pos : pos + 8], "little")
        lines.append(f"{pos} {n + 16}\n")
        pos += n + 16
    (tmp_path / "train.tfrecord.idx").write_text("".join(lines))
    report = migrate(tmp_path)
    (ds,) = report.datasets
    assert ds.dataset == "train" and ds.key_rule == "feature:key"
    assert [Path(p).name for p in ds.legacy] == ["train.index"]
    skipped = {Path(p).name: reason for p, reason in report.skipped}
    assert "covered by" in skipped["train.tfrecord.idx"]


# -- the tree under DATA_ROOT ------------------------------------------------------------------


def data_root(root: Path) -> dict[str, Path]:
    """imagenet/train (tfd-utils), imagenet/val (MXNet .idx), other/deep/deeper (tar),
    and a hidden directory with an index that is never looked at."""
    train = root / "imagenet" / "train"
    write_tfrecords(train, shards=2, per_shard=8)
    tfd_tfrecord_index(str(train / GLOB))
    val = root / "imagenet" / "val"
    val.mkdir(parents=True)
    write_split(val / "val.rec", 5)
    deep = root / "other" / "deep" / "deeper"
    write_tar(deep / "c.tar", samples=4, tag="c")
    tfd_tar_index(str(deep / "c.tar"))
    hidden = root / ".snapshots"
    write_tfrecords(hidden, shards=1, per_shard=3, names="old.tfrecord")
    tfd_tfrecord_index(str(hidden / "old.tfrecord"))
    return {"train": train, "val": val, "c": deep}


def test_migrate_walks_the_tree(tmp_path: Path):
    dirs = data_root(tmp_path)

    report = migrate(tmp_path)

    assert not report.failed
    by_name = {d.dataset: d for d in report.datasets}
    assert sorted(by_name) == ["c", "train", "val"]
    for name, directory in dirs.items():
        assert by_name[name].catalog == str(directory / "shardcat.sqlite")  # where readers look
        assert all(s.action == "imported" for s in by_name[name].shards)
    assert not (tmp_path / ".snapshots" / "shardcat.sqlite").exists()
    before = {n: indexed_at(d / "shardcat.sqlite") for n, d in dirs.items()}
    with TFRecordRandomAccess(str(dirs["train"] / GLOB)) as reader:
        assert len(reader) == 16 and reader.get_feature("r1_7", "label") == 0
    with RecordIOReader(str(dirs["val"] / "val.rec")) as reader:
        assert reader.get_keys() == [str(i) for i in range(5)]
    with TarRandomAccess(str(dirs["c"] / "c.tar")) as reader:
        assert len(reader) == 4
    assert {n: indexed_at(d / "shardcat.sqlite") for n, d in dirs.items()} == before


def test_depth_and_pattern_limit_the_walk(tmp_path: Path):
    data_root(tmp_path)
    shallow = migrate(tmp_path, dry_run=True, max_depth=2)  # root/imagenet/{train,val}
    assert sorted(d.dataset for d in shallow.datasets) == ["train", "val"]
    assert [d.dataset for d in migrate(tmp_path, dry_run=True, max_depth=0).datasets] == []
    tar_only = migrate(tmp_path, dry_run=True, pattern="*.tar_index")
    assert [d.dataset for d in tar_only.datasets] == ["c"]
    two = migrate(tmp_path, dry_run=True, pattern=["*.idx", "*_tot2.index"])
    assert sorted(d.dataset for d in two.datasets) == ["train", "val"]
    with pytest.raises(CatalogError, match="max_depth"):
        migrate(tmp_path, dry_run=True, max_depth=-1)


def test_pattern_finds_indexes_by_any_name(tmp_path: Path):
    """index_file= may have been any name: --pattern finds it, the content tells its kind."""
    write_tfrecords(tmp_path / "d", shards=2, per_shard=4)
    tfd_tfrecord_index(str(tmp_path / "d" / GLOB), index_file=tmp_path / "d" / "cache.pkl")
    assert migrate(tmp_path, dry_run=True).datasets == []
    (ds,) = migrate(tmp_path, dry_run=True, pattern="*.pkl").datasets
    assert (ds.dataset, ds.records) == ("cache", 8)


def test_cli_walks_the_tree_with_depth_and_pattern(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    data_root(tmp_path)
    monkeypatch.chdir(tmp_path)  # the catalog every command uses: ./shardcat.sqlite
    result = run("migrate", tmp_path, "--depth", "2", "--pattern", "*.index", "--dry-run")
    assert "dataset train (tfrecord, feature:key)" in result.stderr
    assert "dataset val" not in result.stderr and "dataset c " not in result.stderr
    result = run("migrate", tmp_path)
    for name in ("train", "val", "c"):
        assert f"dataset {name} (" in result.stderr
    assert (
        "no legacy index files found" in run("migrate", tmp_path / "other", "--depth", "1").stdout
    )


# -- legacy index files and catalogs are never shards ---------------------------------------------


def test_a_directory_never_stands_for_its_index_files_or_catalogs(tmp_path: Path):
    shards = write_tfrecords(tmp_path, shards=2, per_shard=5)
    index = tfd_tfrecord_index(str(tmp_path / GLOB))  # train-00000-of-00002_unified_tot2.index
    tfd_tfrecord_index(str(shards[0]))  # train-00000-of-00002.index
    (tmp_path / "other.tar_index").write_bytes(pickle.dumps({}))
    (tmp_path / "train-00000-of-00002.tfrecord.idx").write_text("0 40\n")
    (tmp_path / "train-00001-of-00002.tfindex").write_text("0 40\n")
    (tmp_path / f"{index.name}.lock").write_text("123|456")  # tfd-utils' lock and temp files
    (tmp_path / f"{index.name}.tmp").write_bytes(b"\x80\x04")
    with Catalog(tmp_path / "shardcat.sqlite") as cat:
        cat.ingest(str(shards[0]), "one", workers=1).close()  # leaves -wal/-shm beside it too
        sqlite3.connect(tmp_path / "notes.sqlite3").close()
        assert resolve_paths(tmp_path) == [str(p) for p in shards]
        assert resolve_paths(str(tmp_path / "*")) == [str(p) for p in shards]
    assert resolve_paths(str(index)) == [str(index)]  # named explicitly: the caller's choice

    result = run("ingest", tmp_path, "-d", "all", "-c", tmp_path / "c.sqlite")
    assert "dataset all: 10 records in 2 shards" in result.stdout


# -- index_file= pointing at a legacy index --------------------------------------------------------


@pytest.fixture
def legacy_cache(tmp_path: Path) -> tuple[Path, Path]:
    """Shards under data/ and tfd-utils' index where a script kept it (index_file=)."""
    data = tmp_path / "data"
    write_tfrecords(data)
    (tmp_path / "cache").mkdir()
    index = tfd_tfrecord_index(str(data / GLOB), index_file=tmp_path / "cache" / "train.index")
    return data, index


def test_catalog_for_a_tfd_pickle_is_imported_beside_it_once(
    tmp_path: Path, legacy_cache: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
):
    from shardcat.facade.legacy_index import catalog_for_legacy_index

    data, index = legacy_cache
    with pytest.warns(UserWarning) as said:
        got = catalog_for_legacy_index(index, str(data / GLOB), AS_TFRECORD)
    assert got == tmp_path / "cache" / "train.index.shardcat.sqlite"
    (message,) = [str(w.message) for w in said]
    assert str(index) in message and "tfd-utils" in message and str(got) in message
    assert "3 shards imported" in message
    with Catalog(got) as cat:
        (info,) = cat.datasets()
        assert (info.name, info.records, info.ready_shards, info.fields) == ("train", 120, 3, {})
    expected = scratch(str(data / GLOB), tmp_path / "cache" / "s.sqlite", "train", fields=False)
    assert dump(got, "train") == expected
    before = indexed_at(got)

    # once imported, the legacy index is not read again (nor anything said)
    import shardcat.migrations.legacy.index as legacy_index_module

    def no_unpickling(path: object) -> None:
        raise AssertionError(f"{path} was unpickled again")

    monkeypatch.setattr(legacy_index_module, "load_pickle", no_unpickling)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert catalog_for_legacy_index(index, str(data / GLOB), AS_TFRECORD) == got
    monkeypatch.undo()
    with TFRecordRandomAccess(str(data / GLOB), index_file=got) as reader:
        assert len(reader) == 120 and reader.get_feature("r2_39", "label") == 4
    assert indexed_at(got) == before

    # tfd-utils rebuilt its index over one more shard: imported again (the others unchanged)
    more = write_tfrecords(
        data / "more", shards=1, per_shard=7, names="train-extra.tfrecord", prefix="e"
    )
    os.replace(more[0], data / "train-extra.tfrecord")
    tfd_tfrecord_index(str(data / GLOB), index_file=index)
    with pytest.warns(UserWarning, match="1 shard imported, 3 unchanged"):
        assert catalog_for_legacy_index(index, str(data / GLOB), AS_TFRECORD) == got
    with Catalog(got) as cat:
        assert cat.info("train").records == 127


def test_catalog_for_anything_else_is_the_path_itself(tmp_path: Path):
    from shardcat.facade.legacy_index import catalog_for_legacy_index

    write_tfrecords(tmp_path, shards=1, per_shard=3)
    with Catalog(tmp_path / "real.sqlite") as cat:
        cat.ingest(str(tmp_path / GLOB), "t", workers=1).close()
    (tmp_path / "garbage.index").write_bytes(b"no pickle, no catalog")
    (tmp_path / "empty.index").write_bytes(b"")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("real.sqlite", "missing.sqlite", "garbage.index", "empty.index"):
            assert catalog_for_legacy_index(tmp_path / name, str(tmp_path / GLOB), AS_TFRECORD) == (
                tmp_path / name
            )
    assert not list(tmp_path.glob("*.shardcat.sqlite"))


def test_catalog_for_a_refused_pickle_writes_nothing(tmp_path: Path):
    from shardcat.facade.legacy_index import catalog_for_legacy_index

    class Evil:
        def __reduce__(self):
            return (open, (str(tmp_path / "pwned"), "w"))

    write_tfrecords(tmp_path, shards=1, per_shard=3)
    (tmp_path / "x.index").write_bytes(pickle.dumps({"k": Evil()}))
    with pytest.raises(LegacyIndexError, match="refused to load this pickle"):
        catalog_for_legacy_index(tmp_path / "x.index", str(tmp_path / GLOB), AS_TFRECORD)
    assert not (tmp_path / "pwned").exists()
    assert not (tmp_path / "x.index.shardcat.sqlite").exists()


def test_catalog_for_a_legacy_index_read_only_and_other_formats(
    tmp_path: Path, legacy_cache: tuple[Path, Path]
):
    from shardcat.facade.legacy_index import catalog_for_legacy_index

    data, index = legacy_cache
    with pytest.raises(CatalogError, match=r"catalog migrate .*train\.index"):
        catalog_for_legacy_index(index, str(data / GLOB), AS_TFRECORD, readonly=True)
    assert not Path(f"{index}.shardcat.sqlite").exists()
    with pytest.raises(CatalogError, match=r"tfd-utils TFRecord index.*not tar"):
        catalog_for_legacy_index(index, str(data / GLOB), AS_TAR)
    with pytest.warns(UserWarning):
        got = catalog_for_legacy_index(index, str(data / GLOB), AS_TFRECORD)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert catalog_for_legacy_index(index, str(data / GLOB), AS_TFRECORD, readonly=True) == got

    write_tar(tmp_path / "tars" / "a.tar", tag="a")
    write_tar(tmp_path / "tars" / "b.tar", tag="b")
    tar_index = tfd_tar_index(str(tmp_path / "tars" / "*.tar"))
    with pytest.warns(UserWarning, match="tfd-utils tar index"):
        got = catalog_for_legacy_index(tar_index, str(tmp_path / "tars" / "*.tar"), AS_TAR)
    before = indexed_at(got)
    with TarRandomAccess(str(tmp_path / "tars" / "*.tar"), index_file=got) as reader:
        assert len(reader) == 24
    assert indexed_at(got) == before


def test_reader_given_a_tfd_pickle_as_index_file(legacy_cache: tuple[Path, Path]):
    data, index = legacy_cache
    with pytest.warns(UserWarning, match="tfd-utils"):
        reader = TFRecordRandomAccess(str(data / GLOB), index_file=str(index))
    with reader:
        assert len(reader) == 120
        assert reader.index_file == f"{index}.shardcat.sqlite"


def test_a_tar_index_imports_a_stem_s_members_as_one_sample(tmp_path: Path):
    """tfd-utils merges a stem's members across the archive (``s1.seg.png`` is key
    ``s1.seg``; ``s0.txt`` after ``s1`` still belongs to ``s0``): the import makes the
    samples a fresh ingest with tfd grouping makes, byte for byte."""
    import io
    import tarfile

    from shardcat import TarRandomAccess

    archive = tmp_path / "m.tar"
    members = [
        ("s0.jpg", b"j0"),
        ("s1.jpg", b"j1"),
        ("s1.seg.png", b"p1"),
        ("s0.txt", b"t0"),
        ("s1.cls", b"3"),
    ]
    with tarfile.open(archive, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    tfd_tar_index(str(archive))
    with Catalog(tmp_path / "c.sqlite") as cat:
        report = cat.migrate(tmp_path)
        assert [[s.action for s in d.shards] for d in report.datasets] == [["imported"]]
    with TarRandomAccess(str(archive), index_file=tmp_path / "c.sqlite") as reader:
        assert reader.get_stats()["total_records"] == 3
        assert reader.get_record("s0") == {"jpg": b"j0", "txt": b"t0"}
        assert reader.get_record("s1") == {"jpg": b"j1", "cls": b"3"}
        assert reader.get_record("s1.seg") == {"png": b"p1"}
    with TarRandomAccess(str(archive), index_file=tmp_path / "fresh.sqlite") as fresh:
        assert fresh.get_record("s0") == {"jpg": b"j0", "txt": b"t0"}


def test_reader_on_copies_of_the_shards_takes_a_tfd_index_of_the_originals(tmp_path: Path):
    """The index was made over ``old/``, the reader opened on copies in ``new/``: each
    recorded shard is the reader's file of its name (imported, verified), not left
    for a re-index; a name the reader's files do not hold is indexed from its data."""
    import shutil

    paths = write_tfrecords(tmp_path / "old", shards=3, per_shard=10)
    index = tfd_tfrecord_index(str(tmp_path / "old" / GLOB))
    (tmp_path / "new").mkdir()
    for p in paths:
        # copied keeping their mtimes (cp -p, rsync -a): newer ones are re-indexed
        shutil.copy2(p, tmp_path / "new" / p.name.replace("00002-of", "renamed-of"))
    with pytest.warns(UserWarning, match="2 shards imported, 1 re-indexed"):
        reader = TFRecordRandomAccess(str(tmp_path / "new" / GLOB), index_file=str(index))
    with reader, TFRecordRandomAccess(str(tmp_path / "old" / GLOB)) as near:
        assert sorted(reader.get_keys()) == sorted(near.get_keys())
        assert reader.get_many(["r0_3", "r2_9"], raw=True) == near.get_many(
            ["r0_3", "r2_9"], raw=True
        )
