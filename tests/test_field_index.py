"""Indexes on a dataset's SQL fields: create, the query plan, results, drop, re-ingest,
bad names, read-only catalogs, the CLI."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shardcat import Catalog, CatalogError, TFRecordWriter, make_example
from shardcat.cli import app

SHARDS = 3
PER_SHARD = 200
COUNT = "SELECT count(*) FROM train WHERE label < 10"
QUERIES = [
    COUNT,
    "SELECT key, position, shard, label FROM train WHERE label BETWEEN 20 AND 22 ORDER BY key",
    "SELECT label, count(*) FROM train GROUP BY label ORDER BY label",
    "SELECT key FROM train WHERE label = 7 ORDER BY position",
    "SELECT max(label), min(label) FROM train WHERE label >= 90",
    "SELECT count(*) FROM train WHERE score < 0.25",
    "SELECT key FROM train WHERE caption = 'cap 3' AND label < 30 ORDER BY key",
]


def _record(i: int, salt: int = 0) -> dict[str, Any]:
    return {
        "key": f"k{i:05d}",
        "label": (i * 37 + salt) % 100,
        "score": (i % 8) / 8,  # exact in float32
        "caption": f"cap {i % 4}",
    }


def _write(path: Path, records: Iterable[dict[str, Any]]) -> None:
    with TFRecordWriter(path) as writer:
        for rec in records:
            writer.write(make_example(rec))


def _shard(directory: Path, s: int) -> Path:
    return directory / f"train-{s:05d}.tfrecord"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A catalog with dataset ``train`` (3 shards, 600 records, fields label/score/caption)."""
    for s in range(SHARDS):
        _write(_shard(tmp_path, s), (_record(i) for i in range(s * PER_SHARD, (s + 1) * PER_SHARD)))
    path = tmp_path / "shardcat.sqlite"
    with Catalog(path) as cat:
        cat.ingest(str(tmp_path / "*.tfrecord"), "train", workers=1).close()
    return path


def _plan(db: Path, sql: str) -> str:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return " | ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql))
    finally:
        conn.close()


def _indexes(db: Path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT name, tbl_name FROM sqlite_master WHERE type = 'index' "
            "AND name GLOB 'shardcat_records_*_v*' ORDER BY name"
        )
        return [(r[0], r[1]) for r in rows]
    finally:
        conn.close()


def _answers(cat: Catalog) -> list[list[tuple[Any, ...]]]:
    return [list(cat.query(sql)) for sql in QUERIES]


def test_create_index_is_idempotent_and_described(db: Path) -> None:
    with Catalog(db) as cat:
        assert cat.info("train").indexed == []
        assert cat.create_index("train", "label") is True
        assert cat.create_index("train", "label") is False
        assert cat.create_index("train", "caption") is True
        info = cat.info("train")
        # in field order, as DatasetInfo.fields
        assert info.indexed == [c for c in info.fields if c in ("label", "caption")]
        assert [d.indexed for d in cat.datasets()] == [info.indexed]
    names = _indexes(db)
    assert len(names) == 2
    assert all(
        name.startswith("shardcat_records_1_v") and table == "shardcat_records_1"
        for name, table in names
    )


def test_the_view_query_plan_uses_the_index(db: Path) -> None:
    assert "USING COVERING INDEX" not in _plan(db, COUNT)
    with Catalog(db) as cat:
        cat.create_index("train", "label")
    plan = _plan(db, COUNT)
    assert "SEARCH r USING COVERING INDEX shardcat_records_1_v" in plan
    assert "(v" in plan and "<?)" in plan  # a range of the index, not a scan of it
    assert "SCAN r" not in plan and "SEARCH s" not in plan  # nor a shard lookup per row
    plan = _plan(db, "SELECT key FROM train WHERE label = 7")
    assert "SEARCH r USING INDEX shardcat_records_1_v" in plan  # then the row for its key


def test_results_equal_the_unindexed_ones(db: Path) -> None:
    with Catalog(db) as cat:
        before = _answers(cat)
        for field in ("label", "score", "caption"):
            cat.create_index("train", field)
        after = _answers(cat)
    assert after == before
    expected = sum(1 for i in range(SHARDS * PER_SHARD) if _record(i)["label"] < 10)
    assert before[0] == [(expected,)]
    assert expected > 0


def test_drop_index(db: Path) -> None:
    with Catalog(db) as cat:
        cat.create_index("train", "label")
        assert cat.drop_index("train", "label") is True
        assert cat.drop_index("train", "label") is False
        assert cat.info("train").indexed == []
        assert cat.query(COUNT)[0][0] == sum(
            1 for i in range(SHARDS * PER_SHARD) if _record(i)["label"] < 10
        )
    assert _indexes(db) == []
    assert "USING COVERING INDEX" not in _plan(db, COUNT)


def test_reingest_keeps_the_index_valid(db: Path) -> None:
    directory = db.parent
    with Catalog(db) as cat:
        cat.create_index("train", "label")
        # shard 1 changes (other labels, one more record, a new field); shard 2 goes away
        rewritten = [
            {**_record(i, salt=5), "extra": i} for i in range(PER_SHARD, 2 * PER_SHARD + 1)
        ]
        _write(_shard(directory, 1), rewritten)
        _shard(directory, 2).unlink()
        cat.ingest(str(directory / "*.tfrecord"), "train", workers=1).close()
        info = cat.info("train")
        assert info.indexed == ["label"]
        assert "extra" in info.fields
        records = [_record(i) for i in range(PER_SHARD)] + rewritten
        assert cat.query(COUNT)[0][0] == sum(1 for r in records if r["label"] < 10)
        got = cat.query("SELECT key FROM train WHERE label = 7 ORDER BY key")
        assert [k for (k,) in got] == sorted(r["key"] for r in records if r["label"] == 7)
        # a column added after the index was made can have one too
        assert cat.create_index("train", "extra") is True
        assert cat.query("SELECT count(*) FROM train WHERE extra < ?", [PER_SHARD + 10]) == [(10,)]
        assert cat.info("train").indexed == ["label", "extra"]
        # a rescan rewrites every row through the index
        cat.ingest(str(directory / "*.tfrecord"), "train", workers=1, rescan=True).close()
        assert cat.query(COUNT)[0][0] == sum(1 for r in records if r["label"] < 10)
    assert "USING COVERING INDEX" in _plan(db, COUNT)
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()


def test_drop_dataset_takes_its_indexes(db: Path) -> None:
    with Catalog(db) as cat:
        cat.create_index("train", "label")
        cat.drop("train")
        assert _indexes(db) == []
        cat.ingest(str(db.parent / "*.tfrecord"), "train", workers=1).close()
        assert cat.info("train").indexed == []
        assert cat.create_index("train", "label") is True


def test_field_names_as_in_the_view(tmp_path: Path) -> None:
    """Fields are named as the view's columns (``f_shard`` for a feature ``shard``), the
    feature's name works too, and SQL's case-insensitivity is kept."""
    _write(tmp_path / "a.tfrecord", ({"key": f"k{i}", "shard": i % 3} for i in range(30)))
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(str(tmp_path / "a.tfrecord"), "a").close()
        assert cat.info("a").fields == {"f_shard": "integer"}
        assert cat.create_index("a", "f_shard") is True
        assert cat.create_index("a", "shard") is False  # the same field by its feature name
        assert cat.create_index("a", "F_SHARD") is False
        assert cat.info("a").indexed == ["f_shard"]
        assert cat.query("SELECT count(*) FROM a WHERE f_shard = 1") == [(10,)]


def test_bad_names(db: Path, tmp_path: Path) -> None:
    with Catalog(db) as cat:
        with pytest.raises(CatalogError, match=r"no dataset 'nope' .*\(it has: train\)"):
            cat.create_index("nope", "label")
        with pytest.raises(
            CatalogError, match=r"no SQL field 'lable' \(its fields: (label|score|caption)"
        ) as caught:
            cat.create_index("train", "lable")
        assert all(name in str(caught.value) for name in ("label", "score", "caption"))
        with pytest.raises(CatalogError, match="no SQL field 'key'"):
            cat.create_index("train", "key")  # a view column, but not a field
        with pytest.raises(CatalogError, match="no SQL field 'lable'"):
            cat.drop_index("train", "lable")
        cat.ingest(str(db.parent / "*.tfrecord"), "bare", fields=False, workers=1).close()
        with pytest.raises(CatalogError, match="it has no SQL fields"):
            cat.create_index("bare", "label")
    assert _indexes(db) == []


def test_read_only_catalogs_refuse(db: Path) -> None:
    before = db.read_bytes()
    for mode in ({"readonly": True}, {"immutable": True}):
        with Catalog(db, **mode) as cat:
            with pytest.raises(CatalogError, match=r"indexes of 'train': .* opened read-only"):
                cat.create_index("train", "label")
            with pytest.raises(CatalogError, match="opened read-only"):
                cat.drop_index("train", "label")
    assert db.read_bytes() == before
    assert _indexes(db) == []


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE INDEX shardcat_mine ON shardcat_records_1 (v1)",
        'CREATE INDEX "x" ON shardcat_records_1 (length)',
        "DROP INDEX shardcat_records_1_v1",
        "DROP INDEX shardcat_records_1_key",
        "REINDEX",
    ],
)
def test_query_cannot_change_indexes(db: Path, sql: str) -> None:
    with Catalog(db) as cat:
        cat.create_index("train", "label")
        names = _indexes(db)
        with pytest.raises(CatalogError):
            cat.query(sql)
    assert _indexes(db) == names


def test_cli_round_trip(db: Path) -> None:
    runner = CliRunner()

    def run(*args: str, code: int = 0) -> str:
        result = runner.invoke(app, [*args, "-c", str(db)])
        assert result.exit_code == code, result.output + str(result.exception)
        return result.output

    assert "train.label: indexed" in run("index", "train", "label")
    assert "already indexed" in run("index", "train", "label")
    listed = json.loads(run("datasets", "--json"))
    assert [d["indexed"] for d in listed] == [["label"]]
    assert "label" in run("datasets").split("indexed")[-1]
    assert "SEARCH r USING COVERING INDEX" in _plan(db, COUNT)
    assert "index dropped" in run("index", "train", "label", "--drop")
    assert "no index" in run("index", "train", "label", "--drop")
    assert json.loads(run("datasets", "--json"))[0]["indexed"] == []
    out = run("index", "train", "lable", code=1)
    assert "no SQL field 'lable'" in out and "label" in out
    assert "no dataset 'nope'" in run("index", "nope", "label", code=1)
    help_text = runner.invoke(app, ["index", "--help"]).output
    assert "--drop" in help_text and "range of the index" in help_text
