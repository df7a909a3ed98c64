"""Read-only SQL over the catalog: results, the dataset view, refusals, query plans."""

from __future__ import annotations

import hashlib
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from shardcat import Catalog, CatalogError, TFRecordWriter, make_example

SHARDS = 3
PER_SHARD = 40


def _records() -> list[dict[str, Any]]:
    out = []
    for i in range(SHARDS * PER_SHARD):
        out.append(
            {
                "key": f"k{i:05d}",
                "label": (i * 7 + i // 5) % 10,
                "score": (i % 8) / 8,  # exact in float32
                "caption": f"cap {i % 4}",
                "image": b"\xff\xd8" + bytes([i % 256]) * 300,
            }
        )
    return out


@pytest.fixture
def built(tmp_path: Path) -> dict[str, Any]:
    """A catalog with dataset ``train`` (3 shards, 120 records) beside its shards."""
    records = _records()
    for s in range(SHARDS):
        with TFRecordWriter(tmp_path / f"train-{s:05d}.tfrecord") as writer:
            for rec in records[s * PER_SHARD : (s + 1) * PER_SHARD]:
                writer.write(make_example(rec))
    db = tmp_path / "shardcat.sqlite"
    with Catalog(db) as cat:
        cat.ingest(str(tmp_path / "*.tfrecord"), "train").close()
    return {"db": db, "records": records, "dir": tmp_path}


def snapshot(db: Path) -> dict[str, Any]:
    """Everything a write could change, read with plain sqlite3."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        digest = hashlib.sha256()
        for row in conn.execute(
            'SELECT key, shard_id, ordinal, "offset", length FROM shardcat_records_1 ORDER BY key'
        ):
            digest.update(repr(row).encode())
        return {
            "records": digest.hexdigest(),
            "counts": [
                conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in (
                    "shardcat_records_1",
                    "shardcat_shards",
                    "shardcat_datasets",
                    "shardcat_fields",
                    "train",
                )
            ],
            "shards": conn.execute("SELECT * FROM shardcat_shards ORDER BY id").fetchall(),
            "meta": conn.execute("SELECT * FROM shardcat_meta ORDER BY name").fetchall(),
            "objects": conn.execute(
                "SELECT type, name, sql FROM sqlite_master ORDER BY type, name"
            ).fetchall(),
            "query_only": conn.execute("PRAGMA query_only").fetchone(),
        }
    finally:
        conn.close()


# -- results --------------------------------------------------------------------


def test_query_returns_tuples_and_columns(built: dict[str, Any]) -> None:
    records = built["records"]
    with Catalog(built["db"]) as cat:
        rows = cat.query(
            'SELECT key, position, label, score, caption FROM "train" '
            "WHERE position < ? ORDER BY position",
            [3],
        )
        assert rows.columns == ["key", "position", "label", "score", "caption"]
        assert isinstance(rows, list)
        assert all(type(r) is tuple for r in rows)
        assert rows == [
            (r["key"], i, r["label"], r["score"], r["caption"]) for i, r in enumerate(records[:3])
        ]
        named = cat.query(
            'SELECT key FROM "train" WHERE label = :label AND caption = :cap ORDER BY position',
            {"label": 3, "cap": "cap 1"},
        )
        assert named.columns == ["key"]
        assert [r[0] for r in named] == [
            r["key"] for r in records if r["label"] == 3 and r["caption"] == "cap 1"
        ]
        empty = cat.query('SELECT key FROM "train" WHERE label > ?', (99,))
        assert empty == []
        assert empty.columns == ["key"]
        # The shard column holds the stored (relative) path.
        assert cat.query('SELECT DISTINCT shard FROM "train" ORDER BY shard') == [
            (f"train-{s:05d}.tfrecord",) for s in range(SHARDS)
        ]


def test_group_by_and_count_match_python(built: dict[str, Any]) -> None:
    records = built["records"]
    with Catalog(built["db"]) as cat:
        rows = cat.query('SELECT label, count(*) FROM "train" GROUP BY label ORDER BY label')
        assert rows.columns == ["label", "count(*)"]
        assert dict(rows) == dict(Counter(r["label"] for r in records))
        assert len(rows) == 10
        assert cat.query('SELECT count(*) FROM "train" WHERE label < 3') == [
            (sum(r["label"] < 3 for r in records),)
        ]
        assert cat.query('SELECT count(*) FROM "train" WHERE label < ?', [3]) == [
            (sum(r["label"] < 3 for r in records),)
        ]
        assert cat.query('SELECT count(*), sum(score) FROM "train" WHERE score >= 0.5') == [
            (
                sum(r["score"] >= 0.5 for r in records),
                sum(r["score"] for r in records if r["score"] >= 0.5),
            )
        ]
        by_shard = cat.query(
            "SELECT shard, min(position), max(position), count(*) "
            'FROM "train" GROUP BY shard ORDER BY shard'
        )
        assert by_shard == [
            (f"train-{s:05d}.tfrecord", s * PER_SHARD, (s + 1) * PER_SHARD - 1, PER_SHARD)
            for s in range(SHARDS)
        ]


def test_where_matches_python_filtering(built: dict[str, Any]) -> None:
    records = built["records"]
    with Catalog(built["db"]) as cat, cat.dataset("train") as reader:
        assert reader.where("label = ?", [3]) == [r["key"] for r in records if r["label"] == 3]
        assert reader.where("label < 3 AND score > ?", [0.5]) == [
            r["key"] for r in records if r["label"] < 3 and r["score"] > 0.5
        ]
        assert reader.where("caption = 'cap 2' AND position >= 60") == [
            r["key"] for i, r in enumerate(records) if r["caption"] == "cap 2" and i >= 60
        ]
        assert reader.where("label = 42") == []
        some = reader.where("label = ?", [7])
        assert [reader.get_feature(k, "label") for k in some] == [7] * len(some)


# -- refusals -------------------------------------------------------------------

_REFUSED = [
    "INSERT INTO shardcat_datasets (name, format, key_rule, options, source, created_at) "
    "VALUES ('x', 'tfrecord', 'position', '{}', '[]', 0)",
    "UPDATE shardcat_records_1 SET length = 0",
    "DELETE FROM shardcat_records_1",
    "DROP TABLE shardcat_records_1",
    "DROP VIEW train",
    "CREATE TABLE t (x)",
    "CREATE TEMP TABLE t (x)",
    "CREATE INDEX i ON records (length)",
    "ALTER TABLE shardcat_records_1 ADD COLUMN x",
    "ATTACH DATABASE '{dir}/attached.db' AS other",
    "PRAGMA query_only = 0",
    "PRAGMA journal_mode = DELETE",
    "VACUUM",
    "VACUUM INTO '{dir}/copy.db'",
    "REINDEX",
    "ANALYZE",
    "BEGIN IMMEDIATE",
    "SELECT 1; DELETE FROM shardcat_records_1",
    "SELECT load_extension('libnothing')",
    "WITH gone AS (DELETE FROM shardcat_records_1 RETURNING key) SELECT * FROM gone",
    "DELETE FROM shardcat_records_1 RETURNING key",
]


@pytest.mark.parametrize("sql", _REFUSED)
def test_writes_and_settings_are_refused(built: dict[str, Any], sql: str) -> None:
    before = snapshot(built["db"])
    sql = sql.replace("{dir}", str(built["dir"]))
    with Catalog(built["db"]) as cat:
        with pytest.raises(CatalogError, match="query failed"):
            cat.query(sql)
        # The connection keeps working and still refuses.
        assert cat.query('SELECT count(*) FROM "train"') == [(SHARDS * PER_SHARD,)]
        with pytest.raises(CatalogError):
            cat.query("DELETE FROM shardcat_records_1")
        with cat.dataset("train") as reader:
            assert reader.get_feature("k00007", "label") == built["records"][7]["label"]
    assert snapshot(built["db"]) == before
    assert not (built["dir"] / "attached.db").exists()
    assert not (built["dir"] / "copy.db").exists()


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM shardcat_records_1",
        "DROP TABLE shardcat_records_1",
        "PRAGMA query_only = 0",
        "ATTACH DATABASE ':memory:' AS other",
    ],
)
def test_refusal_says_read_only(built: dict[str, Any], sql: str) -> None:
    with Catalog(built["db"]) as cat, pytest.raises(CatalogError) as err:
        cat.query(sql)
    assert str(err.value) == (
        "query failed: the catalog is read-only here: only SELECT statements are allowed"
    )


def test_bad_sql_is_a_catalog_error(built: dict[str, Any]) -> None:
    before = snapshot(built["db"])
    with Catalog(built["db"]) as cat:
        with pytest.raises(CatalogError, match="query failed") as err:
            cat.query("SELEC key FROM train")
        assert "syntax error" in str(err.value)
        with pytest.raises(CatalogError, match="query failed") as err:
            cat.query('SELECT nope FROM "train"')
        assert "no such column: nope" in str(err.value)
        with pytest.raises(CatalogError, match="query failed") as err:
            cat.query("SELECT * FROM missing_table")
        assert "no such table: missing_table" in str(err.value)
        with pytest.raises(CatalogError, match="query failed"):
            cat.query('SELECT key FROM "train" WHERE label = ? AND score = ?', [1])
        assert isinstance(err.value, ValueError)
        assert cat.query("SELECT 1 AS one") == [(1,)]
    assert snapshot(built["db"]) == before


def test_where_with_injected_statement_fails_and_changes_nothing(built: dict[str, Any]) -> None:
    before = snapshot(built["db"])
    with Catalog(built["db"]) as cat, cat.dataset("train") as reader:
        for predicate in (
            "1=1; DROP TABLE shardcat_records_1",
            "1=1; DELETE FROM shardcat_records_1 --",
            "1=1) ; DROP TABLE shardcat_records_1 --",
        ):
            with pytest.raises(CatalogError, match="query failed"):
                reader.where(predicate)
        assert len(reader.where("1=1")) == SHARDS * PER_SHARD
        assert reader.get_feature("k00100", "caption") == b"cap 0"
    assert snapshot(built["db"]) == before


def test_closed_catalog_refuses_queries(built: dict[str, Any]) -> None:
    cat = Catalog(built["db"])
    cat.close()
    with pytest.raises(CatalogError, match="closed"):
        cat.query("SELECT 1")


# -- query plans ------------------------------------------------------------------


def _plan(db: Path, sql: str) -> list[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}")]
    finally:
        conn.close()


def test_filter_count_reads_the_records_table_alone(built: dict[str, Any]) -> None:
    """Field values live in the records' own rows (schema version 6); position and
    shard are subqueries SQLite drops when a query does not use them."""
    for sql in (
        'SELECT count(*) FROM "train" WHERE label < 10',
        'SELECT label, count(*) FROM "train" GROUP BY label',
        'SELECT key, score FROM "train" WHERE label = 3',
    ):
        plan = _plan(built["db"], sql)
        assert plan, sql
        tables = [step.split()[:2] for step in plan if not step.startswith("USE TEMP")]
        assert tables == [["SCAN", "r"]], (sql, plan)
    # The check can fail: selecting the position does read the shards (table ``s``).
    plan = _plan(built["db"], 'SELECT position FROM "train" WHERE label < 10')
    assert "SEARCH s USING INTEGER PRIMARY KEY (rowid=?)" in plan, plan
    with Catalog(built["db"]) as cat:
        assert cat.query('SELECT count(*) FROM "train" WHERE label < 10') == [(SHARDS * PER_SHARD,)]


def test_float_fields_compare_equal_to_their_decimal_spelling(tmp_path: Path) -> None:
    """TFRecord floats are float32: the view stores the shortest decimal that rounds to it."""
    path = tmp_path / "f.tfrecord"
    with TFRecordWriter(path) as w:
        for i, score in enumerate([0.967, 0.1, 1e-7, 3.0]):
            w.write(make_example({"key": f"k{i}", "score": score}))
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(path, "f").close()
        assert cat.query("SELECT key FROM f WHERE score = 0.967") == [("k0",)]
        assert cat.query("SELECT score FROM f ORDER BY position") == [
            (0.967,),
            (0.1,),
            (1e-7,),
            (3.0,),
        ]
