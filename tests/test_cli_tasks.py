"""The library functions the ``catalog`` commands call (shardcat.facade.tasks and
shardcat.facade.records): each returns what the command prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardcat import Catalog
from shardcat.errors import CatalogError, KeyNotFoundError, NoSuchFeatureError
from shardcat.facade import records, tasks
from shardcat.facade.migrate import MigrateOptions
from shardcat.facade.options import IngestOptions
from shardcat.readers.reader import Reader
from shardcat.sample import make_sample


def test_ingest_returns_a_summary_and_creates_no_catalog_without_files(tmp_path: Path):
    db = tmp_path / "c.sqlite"
    with pytest.raises(CatalogError, match="no files match"):
        tasks.ingest(db, str(tmp_path / "*.nope"), None, IngestOptions())
    assert not db.exists()
    make_sample(tmp_path / "d", shards=2, records=10, image_bytes=8)
    seen: list[int] = []
    summary = tasks.ingest(
        db, str(tmp_path / "d"), "t", IngestOptions(workers=1), progress=lambda o, n: seen.append(n)
    )
    assert (summary.dataset, summary.records, summary.shards, summary.indexed_now) == (
        "t",
        10,
        2,
        10,
    )
    assert seen == [2, 2]
    again = tasks.ingest(db, str(tmp_path / "d"), "t", IngestOptions(workers=1))
    assert (again.records, again.indexed_now, again.duplicates_dropped) == (10, 0, 0)


def test_verify_returns_the_count(tmp_path: Path):
    make_sample(tmp_path / "d", shards=2, records=7, image_bytes=8)
    tasks.ingest(tmp_path / "c.sqlite", str(tmp_path / "d"), "t", IngestOptions(workers=1))
    with Catalog(tmp_path / "c.sqlite", readonly=True, create=False) as cat:
        result = tasks.verify(cat, "t")
    assert (result.records, result.problems) == (7, [])


def test_open_catalog_refuses_a_missing_file(tmp_path: Path):
    with pytest.raises(CatalogError, match="no catalog at"):
        Catalog(tmp_path / "none.sqlite", readonly=True, create=False)


def test_a_tar_feature_reads_one_member(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    make_sample(tmp_path / "d", shards=1, records=5, image_bytes=8, format="tar")
    tasks.ingest(tmp_path / "c.sqlite", str(tmp_path / "d"), "t", IngestOptions(workers=1))
    with Catalog(tmp_path / "c.sqlite") as cat, cat.dataset("t") as reader:
        whole = reader.get_raw("rec_000000002")
        monkeypatch.setattr(Reader, "get_record", lambda *a: pytest.fail("read the record"))
        assert records.feature_value(reader, "rec_000000002", "cls") == whole["cls"]
        monkeypatch.undo()
        with pytest.raises(NoSuchFeatureError) as missing:
            records.feature_value(reader, "rec_000000002", "nope")
        assert missing.value.available == sorted(whole)
        with pytest.raises(KeyNotFoundError):
            records.feature_value(reader, "nokey", "cls")
        with pytest.raises(CatalogError, match="index 1 out of range"):
            records.feature_value(reader, "rec_000000002", "cls", 1)


def test_extract_writes_bytes_and_returns_the_rest(tmp_path: Path):
    make_sample(tmp_path / "d", shards=1, records=3, image_bytes=64)
    tasks.ingest(tmp_path / "c.sqlite", str(tmp_path / "d"), "t", IngestOptions(workers=1))
    with Catalog(tmp_path / "c.sqlite") as cat, cat.dataset("t") as reader:
        items = records.extract(reader, "rec_000000001", tmp_path / "out")
    by_name = {item.feature: item for item in items}
    assert by_name["image"].path == tmp_path / "out" / "rec_000000001_image_0.jpg"
    assert by_name["image"].path.read_bytes() == by_name["image"].value
    assert by_name["caption"].path == tmp_path / "out" / "rec_000000001_caption_0.txt"
    assert by_name["caption"].path.read_bytes() == b"sample 1" and by_name["caption"].index == 0
    assert by_name["label"].index is None and isinstance(by_name["label"].value, list)


def test_migrate_any_without_paths_or_indexes(tmp_path: Path):
    with pytest.raises(CatalogError):
        tasks.migrate_any([])
    make_sample(tmp_path / "d", shards=1, records=2, image_bytes=8)
    outcome = tasks.migrate_any(
        [str(tmp_path / "d")], MigrateOptions(dry_run=True), catalog=tmp_path / "c.sqlite"
    )
    assert outcome.converted == [] and outcome.report is not None
    assert outcome.report.datasets == [] and not outcome.failed


def test_the_library_opens_a_catalog_as_the_commands_do(tmp_path: Path):
    """One opener: ``Catalog(path)`` makes the checks only the CLI made before."""
    with pytest.raises(CatalogError) as err:
        Catalog(tmp_path / "none.sqlite", create=False)
    assert str(err.value) == (
        f"no catalog at {tmp_path / 'none.sqlite'}: pass the catalog's path, set "
        "$SHARDCAT_CATALOG, or create one with Catalog.ingest()"
    )
    assert err.value.cli_message() == (
        f"no catalog at {tmp_path / 'none.sqlite'}: pass --catalog FILE, set "
        "$SHARDCAT_CATALOG, or create one with `catalog ingest`"
    )
    deep = tmp_path / "a" / "b.sqlite"
    with pytest.raises(CatalogError) as err:
        Catalog(deep, make_dirs=False)
    assert str(err.value) == (
        f"cannot create catalog {deep}: no directory {deep.parent} "
        "(create it, or pass make_dirs=True)"
    )
    assert err.value.cli_message().endswith("(create it, or pass --mkdir)")
    assert not deep.parent.exists()
    with pytest.raises(CatalogError, match="it is a directory"):
        Catalog(tmp_path)
    Catalog(deep).close()  # by default the library makes the directory
    assert deep.is_file()
