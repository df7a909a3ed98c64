"""RecordIO keys across shards and SQL columns that do not depend on the file.

- ``.idx`` keys that collide across shards (every shard numbered 0..n-1, as
  ``RecordIOWriter``, ``im2rec`` and ``rec2idx`` number them): records are keyed
  by position, the ``.idx`` key stays in SQL column ``idx_key``, and a warning
  says so; nothing is dropped;
- ``catalog migrate`` says how many records ``on_duplicate`` dropped;
- a RecordIO dataset with IRHeaders always has ``flag``, ``label``, ``labels``,
  ``id``, ``id2``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from legacy_fixtures import indexed_at
from typer.testing import CliRunner

from shardcat import Catalog, RecordIOReader, TFRecordWriter, make_example
from shardcat.cli import app
from shardcat.errors import CorruptRecordError
from shardcat.facade.catalog import migrate
from shardcat.formats.recordio import IRHeader, RecordIOFormat, RecordIOWriter, pack

RIO = RecordIOFormat()
key_rule, scan = RIO.key_rule, RIO.scan

runner = CliRunner()
HEADER_COLUMNS = {
    "flag": "integer",
    "label": "real",
    "labels": "text",
    "id": "integer",
    "id2": "integer",
}


def write_shards(
    directory: Path, sizes: tuple[int, ...] = (4, 3, 5), *, name: str = "part-{s:05d}.rec"
) -> tuple[list[str], list[bytes]]:
    """Shards written by RecordIOWriter with its default keys: each .idx says 0..n-1."""
    directory.mkdir(parents=True, exist_ok=True)
    files, payloads = [], []
    for s, n in enumerate(sizes):
        path = directory / name.format(s=s)
        with RecordIOWriter(path) as w:
            for i in range(n):
                payload = pack(IRHeader(0, float(s), 100 * s + i, 0), f"{s}:{i}".encode())
                w.write(payload)
                payloads.append(payload)
        files.append(str(path))
    return files, payloads


# -- colliding .idx keys ----------------------------------------------------------------------


def test_colliding_idx_keys_key_by_position_and_keep_the_idx_key(tmp_path: Path):
    files, payloads = write_shards(tmp_path)
    with pytest.warns(UserWarning) as said:
        options = RIO.detect_dataset_options(files)
    (message,) = [str(w.message) for w in said]
    assert "'0'" in message and "part-00000.idx" in message and "part-00001.idx" in message
    assert "by position" in message and "idx_key" in message
    assert options == {"idx": "column", "header": True}
    assert key_rule({**options, "key": "key"}) == "position"
    with warnings.catch_warnings():  # the caller decides: nothing to detect, nothing said
        warnings.simplefilter("error")
        assert RIO.detect_dataset_options(files, {"idx": True})["idx"] is True
        assert RIO.detect_dataset_options(files, {"key": None})["idx"] is True

    catalog = tmp_path / "c.sqlite"
    with Catalog(catalog) as cat:
        with cat.ingest(str(tmp_path / "*.rec"), "imagenet", options=options, workers=1) as r:
            assert len(r) == 12  # nothing dropped
            assert r.key_rule == "position"
            assert r.get_keys() == [str(i) for i in range(12)]
            assert [r[str(i)] for i in range(12)] == payloads
        rows = cat.query("SELECT key, shard, idx_key, id FROM imagenet ORDER BY position")
        assert [(k, Path(s).name, i, n) for k, s, i, n in rows] == [
            (str(p), f"part-{s:05d}.rec", str(i), 100 * s + i)
            for p, (s, i) in enumerate([(s, i) for s, n in enumerate((4, 3, 5)) for i in range(n)])
        ]
        assert cat.info("imagenet").fields["idx_key"] == "text"
        assert cat.query("SELECT key FROM imagenet WHERE idx_key = '2' ORDER BY key") == [
            ("2",),
            ("6",),
            ("9",),
        ]
    before = indexed_at(catalog)
    with RecordIOReader(str(tmp_path / "*.rec"), index_file=catalog) as reader:
        assert reader.dataset == "imagenet"
        assert reader["5"] == payloads[5]
    assert indexed_at(catalog) == before


def test_idx_keys_that_do_not_collide_stay_the_keys(tmp_path: Path):
    for s in range(2):
        with RecordIOWriter(tmp_path / f"u-{s}.rec") as w:
            for i in range(3):
                w.write(b"x" * i, key=f"img-{s}-{i}")
    single, _ = write_shards(tmp_path / "single", (6,))  # one shard numbered 0..5
    write_shards(tmp_path / "raw", (2, 2))
    for idx in (tmp_path / "raw").glob("*.idx"):
        idx.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        unique = RIO.detect_dataset_options(sorted(map(str, tmp_path.glob("u-*.rec"))))
        assert unique["idx"] is True and key_rule({**unique, "key": "key"}) == "mxnet-idx"
        assert RIO.detect_dataset_options(single)["idx"] is True
        no_idx = RIO.detect_dataset_options(sorted(map(str, (tmp_path / "raw").glob("*.rec"))))
        assert no_idx["idx"] is False


def test_a_key_twice_in_one_idx_also_keys_by_position(tmp_path: Path):
    with RecordIOWriter(tmp_path / "a.rec") as w:
        for key in ("x", "y", "x"):
            w.write(key.encode(), key=key)
    with pytest.warns(UserWarning, match=r"'x'.*twice in a\.idx"):
        options = RIO.detect_dataset_options([str(tmp_path / "a.rec")])
    assert options["idx"] == "column"


def test_raw_payloads_keep_the_idx_key_too(tmp_path: Path):
    for s in range(2):
        with RecordIOWriter(tmp_path / f"jpg-{s}.rec") as w:
            for i in range(3):
                w.write(b"\xff\xd8\xff\xe0" + bytes([s, i]) * 20)
    files = sorted(map(str, tmp_path.glob("*.rec")))
    with pytest.warns(UserWarning, match="collide"):
        options = RIO.detect_dataset_options(files)
    assert options == {"idx": "column", "header": False}
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(files, "jpg", options=options, workers=1).close()
        assert cat.info("jpg").fields == {"idx_key": "text"}
        assert cat.query("SELECT key, idx_key FROM jpg ORDER BY position") == [
            ("0", "0"),
            ("1", "1"),
            ("2", "2"),
            ("3", "0"),
            ("4", "1"),
            ("5", "2"),
        ]


def test_scan_with_the_idx_key_as_a_column(tmp_path: Path):
    files, _ = write_shards(tmp_path, (3,))
    entries = list(scan(files[0], {"idx": "column"}))
    assert [e.key for e in entries] == [None] * 3
    assert [e.fields["idx_key"] for e in entries] == ["0", "1", "2"]
    assert entries[1].fields["id"] == 1
    assert all(
        "idx_key" not in e.fields for e in scan(files[0], {"idx": "column", "fields": False})
    )
    raw = list(scan(files[0], {"idx": "column", "header": False}))
    assert [e.fields for e in raw] == [{"idx_key": str(i)} for i in range(3)]
    idx = tmp_path / "part-00000.idx"
    idx.write_text("0\t0\nbroken\n")
    with pytest.raises(CorruptRecordError, match="expected 'key<TAB>offset'"):
        list(scan(files[0], {"idx": "column"}))
    idx.unlink()  # keyed by position: a shard without .idx has no idx_key (NULL), no error
    assert [e.fields.get("idx_key") for e in scan(files[0], {"idx": "column"})] == [None] * 3


def test_reader_over_shards_written_by_recordio_writer(tmp_path: Path):
    _, payloads = write_shards(tmp_path)
    with pytest.warns(UserWarning, match="collide"):
        reader = RecordIOReader(str(tmp_path / "*.rec"))
    with reader:
        assert len(reader) == 12
        assert [reader[str(i)] for i in range(12)] == payloads


def test_migrate_numbered_shards_with_colliding_idx_keys(tmp_path: Path):
    _, payloads = write_shards(tmp_path)
    report = migrate(tmp_path)
    assert not report.failed
    (ds,) = report.datasets
    assert (ds.dataset, ds.key_rule, ds.records) == ("part", "position", 12)
    assert [s.action for s in ds.shards] == ["imported"] * 3
    (note,) = ds.notes
    assert "collide" in note and "by position" in note and "idx_key" in note
    catalog = tmp_path / "shardcat.sqlite"
    before = indexed_at(catalog)
    with RecordIOReader(str(tmp_path / "*.rec")) as reader:
        assert reader.get_keys() == [str(i) for i in range(12)]
        assert [reader[str(i)] for i in range(12)] == payloads
    assert indexed_at(catalog) == before

    (filled,) = migrate(tmp_path, fields=True).datasets
    assert [s.action for s in filled.shards] == ["re-indexed"] * 3
    with Catalog(catalog) as cat:
        rows = cat.query("SELECT idx_key FROM part ORDER BY position")
        assert [r[0] for r in rows] == [str(i) for n in (4, 3, 5) for i in range(n)]

    result = runner.invoke(app, ["migrate", str(tmp_path), "--dry-run", "-c", str(catalog)])
    assert result.exit_code == 0, result.output
    assert "collide" in result.stderr and "idx_key" in result.stderr


# -- options that drop records say how many ------------------------------------------------------


def tfrecord_with_a_repeated_key(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "d.tfrecord"
    with TFRecordWriter(path) as w:
        for key in ("k0", "k1", "k1", "k2", "k3", "k3", "k3"):
            w.write(make_example({"key": key, "v": key.encode()}))
    return path


def test_migrate_says_how_many_records_on_duplicate_dropped(tmp_path: Path):
    from legacy_fixtures import tfd_tfrecord_index

    path = tfrecord_with_a_repeated_key(tmp_path)
    tfd_tfrecord_index(str(path))  # tfd-utils' dict silently keeps one record per key
    (ds,) = migrate(tmp_path, on_duplicate="first").datasets
    assert ds.records == 4
    assert ds.dropped == 3
    path = tfrecord_with_a_repeated_key(tmp_path / "cli")
    tfd_tfrecord_index(str(path))
    result = runner.invoke(
        app,
        ["migrate", str(path.parent), "--on-duplicate", "first", "-c", str(path.parent / "c.db")],
    )
    assert result.exit_code == 0, result.output
    assert "3 records with duplicate keys dropped (--on-duplicate first)" in result.stderr


# -- the same SQL columns in every RecordIO dataset ---------------------------------------------


def test_field_types_are_declared_by_the_format():
    assert RIO.field_types({"header": True}) == HEADER_COLUMNS
    assert RIO.field_types({}) == HEADER_COLUMNS
    assert RIO.field_types({"header": True, "idx": "column"}) == {
        **HEADER_COLUMNS,
        "idx_key": "text",
    }
    assert RIO.field_types({"header": False}) == {}
    assert RIO.field_types({"header": False, "idx": "column"}) == {"idx_key": "text"}
    assert RIO.field_types({"header": True, "fields": False}) == {}


def test_recordio_sql_columns_do_not_depend_on_the_file(tmp_path: Path):
    with RecordIOWriter(tmp_path / "scalar.rec") as w:
        for i in range(3):
            w.write(pack(IRHeader(0, float(i), i, 0), b"s"))
    with RecordIOWriter(tmp_path / "multi.rec") as w:
        for i in range(3):
            w.write(pack(IRHeader(0, [i, i + 0.5], i, 0), b"m"))
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(tmp_path / "scalar.rec", "scalar", workers=1).close()
        cat.ingest(tmp_path / "multi.rec", "multi", workers=1).close()
        assert cat.info("scalar").fields == HEADER_COLUMNS
        assert cat.info("multi").fields == HEADER_COLUMNS
        assert cat.query("SELECT label, labels FROM scalar ORDER BY position") == [
            (0.0, None),
            (1.0, None),
            (2.0, None),
        ]
        assert cat.query("SELECT label, labels FROM multi WHERE position = 1") == [
            (None, "[1.0, 1.5]")
        ]
