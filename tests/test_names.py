"""Names the catalog turns into SQL (issue 26 item 9): dataset names are unique
whatever their case (as SQL identifiers are) and have no trailing newline; two
JSON values that flatten to one field name keep the first, with a warning; a
NUL in a field name fails its shard naming the record, a NUL in a record key is
stored exactly (SQLite; PostgreSQL refuses it: test_postgres.py)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from features import b, ex_bytes, i64
from typer.testing import CliRunner

from shardcat import CatalogError, IngestError, TFRecordWriter
from shardcat.cli import app
from shardcat.errors import ShardcatWarning
from shardcat.testing.required import need


def _shard(path: Path, keys: list[str], **extra: Any) -> list[int]:
    """A TFRecord shard of records keyed ``keys`` (labels 0, 1, ...), the features
    ``extra`` added to the last; the byte offset of each record."""
    offsets, at = [], 0
    with TFRecordWriter(path) as w:
        for i, key in enumerate(keys):
            more = extra if i == len(keys) - 1 else {}
            record = ex_bytes(key=b(key.encode()), label=i64(i), **more)
            w.write(record)
            offsets.append(at)
            at += 16 + len(record)  # length, its CRC, the record, its CRC
    return offsets


def test_dataset_names_are_unique_whatever_their_case(catalogs: Any, tmp_path: Path) -> None:
    """``TRAIN`` and ``train`` would be one SQL view: the second name is refused,
    the first dataset keeps its records and its view."""
    _shard(tmp_path / "big.tfrecord", [f"b{i}" for i in range(7)])
    _shard(tmp_path / "small.tfrecord", [f"s{i}" for i in range(5)])
    cat = catalogs(tmp_path / "c.sqlite")
    cat.ingest(str(tmp_path / "big.tfrecord"), "train")
    for name in ("TRAIN", "Train", "tRaIn"):
        with pytest.raises(CatalogError) as err:
            cat.ingest(str(tmp_path / "small.tfrecord"), name)
        assert str(err.value) == (
            f"dataset name {name!r} is taken by dataset 'train' (SQL names do not tell "
            "case apart): ingest into 'train', or choose another name"
        )
    assert [d.name for d in cat.datasets()] == ["train"]
    assert sorted(r[0] for r in cat.query("SELECT key FROM TRAIN")) == [f"b{i}" for i in range(7)]
    assert len(cat.ingest(str(tmp_path / "big.tfrecord"), "train")) == 7  # its own name: fine


def test_cli_refuses_a_name_taken_in_another_case_in_one_line(tmp_path: Path) -> None:
    _shard(tmp_path / "a.tfrecord", ["a0", "a1"])
    catalog = tmp_path / "c.sqlite"
    runner = CliRunner()
    first = runner.invoke(
        app, ["ingest", str(tmp_path / "a.tfrecord"), "-d", "train", "-c", str(catalog)]
    )
    assert first.exit_code == 0, first.output
    out = runner.invoke(
        app, ["ingest", str(tmp_path / "a.tfrecord"), "-d", "TRAIN", "-c", str(catalog)]
    )
    assert out.exit_code == 1
    assert out.output == (
        "error: dataset name 'TRAIN' is taken by dataset 'train' (SQL names do not tell "
        "case apart): ingest into 'train', or choose another name\n"
    )


@pytest.mark.parametrize("name", ["abc\n", "abc\n\n", "ab\nc", "\nabc"])
def test_a_dataset_name_with_a_newline_is_refused(catalogs: Any, tmp_path: Path, name: str) -> None:
    _shard(tmp_path / "a.tfrecord", ["a0"])
    cat = catalogs(tmp_path / "c.sqlite")
    with pytest.raises(CatalogError, match="invalid dataset name") as err:
        cat.ingest(str(tmp_path / "a.tfrecord"), name)
    assert repr(name) in str(err.value)
    assert cat.datasets() == []
    with pytest.raises(CatalogError, match="invalid attach name"):
        cat.query("SELECT 1", attach={name: tmp_path / "c.sqlite"})


def _json_tar(path: Path, docs: list[dict[str, Any]]) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for i, doc in enumerate(docs):
            data = json.dumps(doc).encode()
            member = tarfile.TarInfo(f"s{i}.json")
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))


def test_json_values_that_flatten_to_one_field_keep_the_first_with_a_warning(
    catalogs: Any, tmp_path: Path
) -> None:
    """``{"image": {"width": 5}}`` and ``"image_width": 99`` are both
    ``json_image_width``: the first in the member is kept, and the scan says so."""
    _json_tar(
        tmp_path / "j.tar",
        [
            {"image": {"width": 5}, "image_width": 99, "h": 1},
            {"image_width": 7, "image": {"width": 8}, "h": 2},
            {"image": {"width": 3}, "h": 3},
        ],
    )
    cat = catalogs(tmp_path / "c.sqlite")
    with pytest.warns(ShardcatWarning) as caught:
        cat.ingest(str(tmp_path / "j.tar"), "j")
    texts = [str(w.message) for w in caught if issubclass(w.category, ShardcatWarning)]
    assert texts == [
        f"{tmp_path / 'j.tar'}: .json values 'image.width' and 'image_width' both make the "
        "field json_image_width: each member keeps its first (the other is not a field)"
    ]
    rows = cat.query("SELECT key, json_image_width, json_h FROM j ORDER BY key")
    assert rows == [("s0", 5, 1), ("s1", 7, 2), ("s2", 3, 3)]


def test_the_warning_of_a_remote_shard_names_its_url(catalogs: Any, tmp_path: Path) -> None:
    """A remote shard is scanned from a temporary local copy: its warnings name the URL."""
    need("aiohttp", why="shardcat[remote] (aiohttp)")
    from shardcat.testing.servers import RangeServer

    (tmp_path / "www").mkdir()
    _json_tar(tmp_path / "www" / "j.tar", [{"a-b": 1, "a_b": 2}])
    server = RangeServer(str(tmp_path / "www"))
    server.start()
    try:
        with pytest.warns(ShardcatWarning) as caught:
            catalogs(tmp_path / "c.sqlite").ingest(f"{server.url}/j.tar", "j")
    finally:
        server.stop()
    assert [str(w.message) for w in caught if issubclass(w.category, ShardcatWarning)] == [
        f"{server.url}/j.tar: .json values 'a-b' and 'a_b' both make the field json_a_b: "
        "each member keeps its first (the other is not a field)"
    ]


def test_a_nul_in_a_feature_name_fails_its_shard_naming_the_record(
    catalogs: Any, tmp_path: Path
) -> None:
    """A field name becomes a SQL column name, which cannot hold NUL: the shard fails
    with an error naming it, the byte offset and key of the record, and the name
    escaped; the other shards are in."""
    _shard(tmp_path / "a.tfrecord", ["a0", "a1"])
    offsets = _shard(tmp_path / "b.tfrecord", ["b0", "b1", "b2"], **{"la\x00bel": i64(1)})
    cat = catalogs(tmp_path / "c.sqlite")
    with pytest.raises(IngestError) as err:
        cat.ingest(str(tmp_path / "*.tfrecord"), "t")
    assert str(err.value) == (
        f"b.tfrecord: at byte {offsets[2]}: record 'b2' has a field named "
        "'la\\x00bel': a NUL character cannot be in a SQL name (rename the feature, or "
        "ingest with fields=False)"
    )
    reader = cat.dataset("t")
    assert sorted(reader) == ["a0", "a1"]


def test_a_nul_in_a_record_key_is_stored_exactly(catalogs: Any, tmp_path: Path) -> None:
    _shard(tmp_path / "a.tfrecord", ["a\x000", "a1"])
    reader = catalogs(tmp_path / "c.sqlite").ingest(str(tmp_path / "a.tfrecord"), "t")
    assert sorted(reader) == ["a\x000", "a1"]
    assert reader.get_feature("a\x000", "label") == 0
    assert reader.get_record("a") is None
