"""Schema versions: a version-1 catalog upgrades through version 2 (``seek_indexes``),
version 3 (indexed shard versions, member extents) and version 4 (the catalog's
tables renamed ``shardcat_*``) and then has the shape of a freshly created one,
with every lookup unchanged."""

from __future__ import annotations

import gc
import gzip
import io
import os
import sqlite3
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from shardcat import Catalog, CatalogError, SchemaVersionError
from shardcat.cli import app
from shardcat.errors import ShardcatWarning
from shardcat.formats.tfrecord import TFRecordWriter, make_example
from shardcat.migrations import schema as migrations
from shardcat.testing.required import missing

# The catalog tables exactly as shardcat's schema version 1 created them (frozen:
# a change to these tables needs a new version and a migration step).
V1_DDL = {
    "catalog_meta": "CREATE TABLE catalog_meta (\n\tname VARCHAR(64) NOT NULL, \n\tvalue TEXT "
    "NOT NULL, \n\tPRIMARY KEY (name)\n)",
    "datasets": "CREATE TABLE datasets (\n\tid INTEGER NOT NULL, \n\tname VARCHAR(128) NOT NULL, "
    "\n\tformat VARCHAR(32) NOT NULL, \n\tkey_rule VARCHAR(256) NOT NULL, \n\tgrouping "
    "VARCHAR(32), \n\toptions TEXT NOT NULL, \n\tsource TEXT NOT NULL, \n\tcreated_at FLOAT NOT "
    "NULL, \n\tPRIMARY KEY (id), \n\tUNIQUE (name)\n)",
    "fields": "CREATE TABLE fields (\n\tdataset_id INTEGER NOT NULL, \n\tname TEXT NOT NULL, \n\t"
    "column_name TEXT NOT NULL, \n\tsql_type VARCHAR(16) NOT NULL, \n\tidx INTEGER NOT NULL, \n\t"
    "PRIMARY KEY (dataset_id, name), \n\tFOREIGN KEY(dataset_id) REFERENCES datasets (id) ON "
    "DELETE CASCADE\n)",
    "members": "CREATE TABLE members (\n\tshard_id INTEGER NOT NULL, \n\tordinal BIGINT NOT NULL, "
    '\n\tname TEXT NOT NULL, \n\t"offset" BIGINT NOT NULL, \n\tlength BIGINT NOT NULL, \n\t'
    "PRIMARY KEY (shard_id, ordinal, name), \n\tFOREIGN KEY(shard_id) REFERENCES shards (id) ON "
    "DELETE CASCADE\n)\n WITHOUT ROWID\n\n",
    "records": 'CREATE TABLE records (\n\tdataset_id INTEGER NOT NULL, \n\t"key" TEXT NOT NULL, '
    '\n\tshard_id INTEGER NOT NULL, \n\tordinal BIGINT NOT NULL, \n\t"offset" BIGINT NOT NULL, '
    '\n\tlength BIGINT NOT NULL, \n\tPRIMARY KEY (dataset_id, "key"), \n\tFOREIGN KEY(dataset_id) '
    "REFERENCES datasets (id) ON DELETE CASCADE, \n\tFOREIGN KEY(shard_id) REFERENCES shards (id) "
    "ON DELETE CASCADE\n)\n WITHOUT ROWID\n\n",
    "records_by_shard": "CREATE UNIQUE INDEX records_by_shard ON records (shard_id, ordinal)",
    "shards": "CREATE TABLE shards (\n\tid INTEGER NOT NULL, \n\tdataset_id INTEGER NOT NULL, \n\t"
    "path TEXT NOT NULL, \n\tsize BIGINT NOT NULL, \n\tmtime_ns BIGINT NOT NULL, \n\tfingerprint "
    "VARCHAR(64), \n\tcompression VARCHAR(16), \n\tnum_records BIGINT NOT NULL, \n\t"
    "first_position BIGINT, \n\tstate VARCHAR(16) NOT NULL, \n\terror TEXT, \n\tclaim_owner "
    "VARCHAR(256), \n\tclaimed_at FLOAT, \n\tindexed_at FLOAT, \n\tPRIMARY KEY (id), \n\tUNIQUE "
    "(dataset_id, path), \n\tFOREIGN KEY(dataset_id) REFERENCES datasets (id) ON DELETE CASCADE\n)",
    "sqlite_autoindex_catalog_meta_1": None,
    "sqlite_autoindex_datasets_1": None,
    "sqlite_autoindex_fields_1": None,
    "sqlite_autoindex_shards_1": None,
}


def schema_rows(db: Path) -> list[tuple[str, str, str, str | None]]:
    """Every schema object (tables, indexes, views) but the per-dataset ones' root pages."""
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
        ).fetchall()


def catalog_objects(db: Path) -> dict[str, str | None]:
    """The catalog's own tables and indexes (not the per-dataset fields tables and views)."""
    return {
        name: sql
        for kind, name, table, sql in schema_rows(db)
        if kind in ("table", "index") and not table.startswith("fields_")
    }


def build(directory: Path) -> Path:
    """A catalog with a TFRecord and a tar dataset (the data version 1 could hold)."""
    directory.mkdir()
    with TFRecordWriter(directory / "a.tfrecord") as w:
        for i in range(30):
            w.write(make_example({"key": f"r{i}", "label": i % 3, "image": bytes([i]) * 50}))
    with tarfile.open(directory / "b.tar", "w") as tf:
        for i in range(10):
            for ext, data in (("jpg", bytes([i]) * 100), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"s{i}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    db = directory / "catalog.sqlite"
    with Catalog(db) as cat:
        cat.ingest(directory / "a.tfrecord", "tf").close()
        cat.ingest(directory / "b.tar", "wds").close()
    return db


# Columns schema version 3 added (SQLite's DROP COLUMN restores the older DDL text).
V3_COLUMNS = (
    ("shards", "generation"),
    ("shards", "ino"),
    ("shards", "ctime_ns"),
    ("datasets", "version"),
    ("members", "extents"),
)


OLD_NAMES = ("catalog_meta", "datasets", "shards", "records", "members", "seek_indexes", "fields")


def _new_name(old: str) -> str:
    return "shardcat_meta" if old == "catalog_meta" else f"shardcat_{old}"


# The DDL text of version 5 (as SQLAlchemy wrote it): one records table for every dataset.
V5_RECORDS = (
    'CREATE TABLE shardcat_records (\n\tdataset_id INTEGER NOT NULL, \n\t"key" TEXT NOT NULL, '
    '\n\tshard_id INTEGER NOT NULL, \n\tordinal BIGINT NOT NULL, \n\t"offset" BIGINT NOT NULL, '
    "\n\tlength BIGINT NOT NULL, \n\textents TEXT, \n\titem BIGINT, \n\tPRIMARY KEY (dataset_id, "
    '"key"), \n\tFOREIGN KEY(dataset_id) REFERENCES shardcat_datasets (id) ON DELETE CASCADE, '
    "\n\tFOREIGN KEY(shard_id) REFERENCES shardcat_shards (id) ON DELETE CASCADE\n)\n WITHOUT ROWID"
    "\n\n"
)
V5_FIELDS = (
    "CREATE TABLE shardcat_fields_{} (\n\tshard_id INTEGER NOT NULL, \n\tordinal BIGINT NOT "
    "NULL, \n\tPRIMARY KEY (shard_id, ordinal)\n)\n WITHOUT ROWID\n\n"
)
V5_TYPES = {"integer": "BIGINT", "real": "DOUBLE PRECISION", "text": "TEXT"}


def downgrade_to_v10(db: Path) -> None:
    """What a version-10 catalog is: no ``shardcat_shares`` table (issue 31)."""
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE shardcat_shares")
        conn.execute("UPDATE shardcat_meta SET value = '10' WHERE name = 'schema_version'")
    conn.close()


def downgrade_to_v9(db: Path) -> None:
    """What a version-9 catalog is: no ``shardcat_tags`` table (issue 32)."""
    downgrade_to_v10(db)
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE shardcat_tags")
        conn.execute("UPDATE shardcat_meta SET value = '9' WHERE name = 'schema_version'")
    conn.close()


def downgrade_to_v8(db: Path) -> None:
    """What a version-8 catalog is: no ``shardcat_deleted`` table (issue 32)."""
    downgrade_to_v9(db)
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE shardcat_deleted")
        conn.execute("UPDATE shardcat_meta SET value = '8' WHERE name = 'schema_version'")
    conn.close()


def downgrade_to_v7(db: Path) -> None:
    """What a version-7 catalog is: no ``shardcat_bad_records`` table (issue 27)."""
    downgrade_to_v8(db)
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE shardcat_bad_records")
        conn.execute("UPDATE shardcat_meta SET value = '7' WHERE name = 'schema_version'")
    conn.close()


def downgrade_to_v6(db: Path) -> None:
    """What a version-6 catalog of the same data is: no ``crc`` column (the checks of
    version 7) in the records tables and members, version 6."""
    downgrade_to_v7(db)
    with sqlite3.connect(db) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND (name LIKE 'shardcat_records_%' OR name = 'shardcat_members')"
            )
        ]
        for table in tables:
            conn.execute(f'ALTER TABLE "{table}" DROP COLUMN crc')
        conn.execute("UPDATE shardcat_meta SET value = '6' WHERE name = 'schema_version'")
    conn.close()


def downgrade_to_v5(db: Path) -> None:
    """What a version-5 catalog of the same data is: one ``shardcat_records`` table
    keyed by (dataset, key) with a unique (shard, ordinal) index, field values in
    ``shardcat_fields_<id>``, the views over them, version 5, no ``catalog_meta``
    marker (it came later)."""
    downgrade_to_v6(db)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.execute("DROP TABLE IF EXISTS catalog_meta")
        for (view,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'view'"):
            conn.execute(f'DROP VIEW "{view}"')
        conn.execute(V5_RECORDS)
        datasets = conn.execute("SELECT id, name, key_rule, options FROM shardcat_datasets")
        for dataset_id, name, key_rule, options in datasets.fetchall():
            table = f"shardcat_records_{dataset_id}"
            conn.execute(
                'INSERT INTO shardcat_records SELECT ?, key, shard_id, ordinal, "offset", '
                f"length, extents, item FROM {table}",
                (dataset_id,),
            )
            fields = conn.execute(
                "SELECT column_name, sql_type, idx FROM shardcat_fields WHERE dataset_id = ? "
                "ORDER BY idx",
                (dataset_id,),
            ).fetchall()
            ftable = f"shardcat_fields_{dataset_id}"
            conn.execute(V5_FIELDS.format(dataset_id))
            for _, sql_type, idx in fields:
                conn.execute(f"ALTER TABLE {ftable} ADD COLUMN v{idx} {V5_TYPES[sql_type]}")
            with_fields = '"fields": false' not in options
            if with_fields:
                vs = "".join(f", v{idx}" for _, _, idx in fields)
                conn.execute(
                    f"INSERT INTO {ftable} (shard_id, ordinal{vs}) "
                    f"SELECT shard_id, ordinal{vs} FROM {table}"
                )
                cols = "".join(f', f.v{idx} AS "{col}"' for col, _, idx in fields)
                key = (
                    "CAST(s.first_position + f.ordinal AS TEXT)"
                    if key_rule == "position"
                    else "(SELECT r.key FROM shardcat_records r WHERE r.shard_id = f.shard_id "
                    "AND r.ordinal = f.ordinal)"
                )
                conn.execute(
                    f'CREATE VIEW "{name}" AS SELECT {key} AS key, s.first_position + f.ordinal '
                    f'AS position, s.path AS shard{cols} FROM "{ftable}" f JOIN shardcat_shards '
                    "s ON s.id = f.shard_id"
                )
            else:
                key = (
                    "CAST(s.first_position + r.ordinal AS TEXT)"
                    if key_rule == "position"
                    else "r.key"
                )
                conn.execute(
                    f'CREATE VIEW "{name}" AS SELECT {key} AS key, s.first_position + r.ordinal '
                    "AS position, s.path AS shard FROM shardcat_records r JOIN shardcat_shards s "
                    f"ON s.id = r.shard_id WHERE r.dataset_id = {dataset_id}"
                )
            for (index,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? "
                "AND sql IS NOT NULL AND name LIKE '%\\_v%' ESCAPE '\\'",
                (table,),
            ).fetchall():
                idx = index.rsplit("_v", 1)[1]
                conn.execute(f"CREATE INDEX {ftable}_v{idx} ON {ftable} (v{idx})")
            conn.execute(f"DROP TABLE {table}")
        conn.execute(
            "CREATE UNIQUE INDEX shardcat_records_by_shard ON shardcat_records (shard_id, ordinal)"
        )
        conn.execute("UPDATE shardcat_meta SET value = '5' WHERE name = 'schema_version'")
        conn.execute("COMMIT")
    finally:
        conn.close()


def downgrade_to_v4(db: Path) -> None:
    """What a version-4 catalog of the same data is: records without the location
    columns of version 5 (``extents``, ``item``), version 4."""
    downgrade_to_v5(db)
    with sqlite3.connect(db) as conn:
        for column in ("extents", "item"):
            conn.execute(f"ALTER TABLE shardcat_records DROP COLUMN {column}")
        conn.execute("UPDATE shardcat_meta SET value = '4' WHERE name = 'schema_version'")


def downgrade_to_v3(db: Path) -> None:
    """What a version-3 catalog of the same data is: the tables under their old names
    (and their DDL text as version 3 wrote it), version 3."""
    downgrade_to_v4(db)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        views = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'view'").fetchall()
        for name, _ in views:
            conn.execute(f'DROP VIEW "{name}"')
        fields = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name LIKE 'shardcat_fields_%'"
            )
        ]
        for old in OLD_NAMES:
            conn.execute(f"ALTER TABLE {_new_name(old)} RENAME TO {old}")
        for table in fields:
            conn.execute(f"ALTER TABLE {table} RENAME TO {table.removeprefix('shardcat_')}")
        conn.execute("DROP INDEX shardcat_records_by_shard")
        conn.execute("CREATE UNIQUE INDEX records_by_shard ON records (shard_id, ordinal)")
        # RENAME quotes the names it writes; version 3 wrote them bare
        conn.execute("PRAGMA writable_schema = ON")
        for old in [*OLD_NAMES, *(t.removeprefix("shardcat_") for t in fields)]:
            conn.execute("UPDATE sqlite_master SET sql = replace(sql, ?, ?)", (f'"{old}"', old))
        conn.execute("PRAGMA writable_schema = OFF")
    finally:
        conn.close()
    with sqlite3.connect(db) as conn:
        for _, sql in views:
            conn.execute(sql.replace("shardcat_", ""))
        conn.execute("UPDATE catalog_meta SET value = '3' WHERE name = 'schema_version'")


def downgrade_to_v2(db: Path) -> None:
    """What a version-2 catalog of the same data is: no version-3 columns, version 2."""
    downgrade_to_v3(db)
    with sqlite3.connect(db) as conn:
        for table, column in V3_COLUMNS:
            conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        conn.execute("UPDATE catalog_meta SET value = '2' WHERE name = 'schema_version'")


def downgrade_to_v1(db: Path) -> None:
    """What a version-1 catalog of the same data is: no seek_indexes, version 1."""
    downgrade_to_v2(db)
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE seek_indexes")
        conn.execute("UPDATE catalog_meta SET value = '1' WHERE name = 'schema_version'")


def marker(db: Path) -> str:
    """The schema version in ``catalog_meta``, where shardcats before version 4 read it."""
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT value FROM catalog_meta WHERE name = 'schema_version'")
        return str(row.fetchone()[0])


def schema_shape(db: Path) -> dict[str, object]:
    """Every table's columns (name, type, not null, default, pk), indexes and foreign
    keys, and every view's SQL: what an upgrade must make equal to a fresh catalog
    (``ALTER TABLE ADD COLUMN`` writes the DDL text differently, not the table)."""
    with sqlite3.connect(db) as conn:
        out: dict[str, object] = {}
        for kind, name, sql in conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE type IN ('table', 'view') "
            "ORDER BY name"
        ):
            if kind == "view":
                out[name] = sql
                continue
            indexes = conn.execute(f'PRAGMA index_list("{name}")').fetchall()
            out[name] = (
                [r[1:] for r in conn.execute(f'PRAGMA table_info("{name}")')],
                sorted(
                    (i[2], i[3], [c[2] for c in conn.execute(f'PRAGMA index_info("{i[1]}")')])
                    for i in indexes
                ),
                conn.execute(f'PRAGMA foreign_key_list("{name}")').fetchall(),
                "WITHOUT ROWID" in (sql or ""),
            )
        return out


def lookups(db: Path) -> dict[str, object]:
    with Catalog(db, readonly=True) as cat:
        out: dict[str, object] = {}
        with cat.dataset("tf") as reader:
            for key in reader.get_keys():
                out[f"tf/{key}"] = reader.get_feature(key, "image")
            out["tf/where"] = reader.where("label = 1")
        with cat.dataset("wds") as reader:
            for key in reader.get_keys():
                out[f"wds/{key}"] = reader.get_record(key)
        out["sql"] = cat.query("SELECT key, cls FROM wds ORDER BY position")
        return out


@pytest.fixture
def v1_catalog(tmp_path: Path) -> Path:
    db = build(tmp_path / "v1")
    downgrade_to_v1(db)
    return db


def test_fixture_is_a_true_version_1_catalog(v1_catalog: Path):
    assert catalog_objects(v1_catalog) == V1_DDL
    with sqlite3.connect(v1_catalog) as conn:
        version = conn.execute("SELECT value FROM catalog_meta WHERE name = 'schema_version'")
        assert version.fetchone() == ("1",)


def test_upgrade_from_version_1(v1_catalog: Path, tmp_path: Path):
    with pytest.raises(SchemaVersionError, match="open it once without readonly=True"):
        Catalog(v1_catalog, readonly=True)
    fresh = build(tmp_path / "fresh")
    expected = lookups(fresh)
    with Catalog(v1_catalog):  # opening for writing upgrades
        pass
    assert schema_shape(v1_catalog) == schema_shape(fresh)
    with sqlite3.connect(v1_catalog) as conn:
        version = conn.execute("SELECT value FROM shardcat_meta WHERE name = 'schema_version'")
        assert version.fetchone() == (str(migrations.SCHEMA_VERSION),)
    # 7: each record's check (issue 26); 8: bad records set aside (issue 27);
    # 9: soft-deleted keys, 10: tags (issue 32); 11: rows shared by reference (issue 31)
    assert migrations.SCHEMA_VERSION == 11
    assert lookups(v1_catalog) == expected
    # the upgraded catalog takes compressed shards like a fresh one
    gz = tmp_path / "v1" / "c.tfrecord"
    gz.write_bytes(gzip.compress((tmp_path / "v1" / "a.tfrecord").read_bytes()))
    with Catalog(v1_catalog) as cat, cat.ingest(gz, "gz") as reader:
        assert reader.get_feature("r7", "image") == bytes([7]) * 50
        assert cat.store.reader_connection().execute(
            "SELECT kind FROM shardcat_seek_indexes"
        ).fetchall() == [("zran",)]


def test_the_upgrade_warning_points_at_the_code_that_opened_the_catalog(v1_catalog: Path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Catalog(v1_catalog).close()
    (upgraded,) = [w for w in caught if "upgraded the catalog" in str(w.message)]
    assert upgraded.category is ShardcatWarning
    assert upgraded.filename == __file__  # not shardcat's own frames


def test_a_failed_step_leaves_version_1(v1_catalog: Path, monkeypatch: pytest.MonkeyPatch):
    def broken(conn: object) -> None:
        migrations.STEPS[1].__wrapped__(conn)  # type: ignore[attr-defined]
        raise RuntimeError("disk full")

    original = migrations.STEPS[1]
    broken.__wrapped__ = original  # type: ignore[attr-defined]
    monkeypatch.setitem(migrations.STEPS, 1, broken)
    with pytest.raises(RuntimeError, match="disk full"):
        Catalog(v1_catalog)
    assert catalog_objects(v1_catalog) == V1_DDL  # the step's table was rolled back too
    monkeypatch.setitem(migrations.STEPS, 1, original)
    with Catalog(v1_catalog) as cat:
        assert cat.datasets()[0].name == "tf"


def test_upgrade_from_version_3_renames_the_catalog_s_tables(tmp_path: Path):
    """A version-3 catalog (tables ``shards``, ``records``... beside the dataset views)
    reads the same after the upgrade, its tables now ``shardcat_*``."""
    fresh = build(tmp_path / "fresh")
    expected = lookups(fresh)
    db = build(tmp_path / "v3")
    downgrade_to_v3(db)
    assert {"shards", "records", "catalog_meta"} <= set(catalog_objects(db))
    with pytest.raises(SchemaVersionError, match="version 3"):
        Catalog(db, readonly=True)
    with Catalog(db):  # opening for writing upgrades
        pass
    assert schema_shape(db) == schema_shape(fresh)
    assert not {"shards", "records"} & set(catalog_objects(db))
    assert marker(db) == str(migrations.SCHEMA_VERSION)  # what older shardcats read
    assert lookups(db) == expected


def test_upgrade_from_version_4_adds_the_record_locations(tmp_path: Path):
    """4 -> 5: ``shardcat_records`` gains ``extents`` and ``item`` (NULL for every
    record before), nothing else changes, and readers find the same records."""
    db = build(tmp_path / "v4")
    downgrade_to_v4(db)
    with sqlite3.connect(db) as conn:
        columns = [r[1] for r in conn.execute("PRAGMA table_info(shardcat_records)")]
    assert "extents" not in columns and "item" not in columns
    fresh = build(tmp_path / "fresh")
    with Catalog(db):
        pass
    assert schema_shape(db) == schema_shape(fresh)
    assert lookups(db) == lookups(fresh)
    with sqlite3.connect(db) as conn:
        assert conn.execute(
            "SELECT count(*) FROM shardcat_records_1 WHERE extents IS NOT NULL OR item IS NOT NULL"
        ).fetchone() == (0,)
        version = conn.execute("SELECT value FROM shardcat_meta WHERE name = 'schema_version'")
        assert version.fetchone() == (str(migrations.SCHEMA_VERSION),)


def test_upgrade_from_version_5_gives_each_dataset_its_records_table(tmp_path: Path):
    """5 -> 6: the shared ``shardcat_records`` and the ``shardcat_fields_<id>`` tables
    become one ``shardcat_records_<id>`` per dataset (fields in the same rows, one
    unique key index); a field index moves with its column; readers and SQL find
    the same records."""
    fresh = build(tmp_path / "fresh")
    with Catalog(fresh) as cat:
        cat.create_index("tf", "label")
    db = build(tmp_path / "v5")
    with Catalog(db) as cat:
        cat.create_index("tf", "label")
    downgrade_to_v5(db)
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"shardcat_records", "shardcat_fields_1", "shardcat_fields_2"} <= tables
        assert not {"shardcat_records_1", "shardcat_records_2"} & tables
        assert conn.execute("SELECT count(*) FROM shardcat_records").fetchone() == (30 + 10,)
        (label,) = conn.execute(
            "SELECT idx FROM shardcat_fields WHERE dataset_id = 1 AND name = 'label'"
        ).fetchone()
        assert conn.execute(
            "SELECT name FROM sqlite_master WHERE name LIKE 'shardcat_fields_1_v%'"
        ).fetchall() == [(f"shardcat_fields_1_v{label}",)]
    with Catalog(db):
        pass
    assert schema_shape(db) == schema_shape(fresh)
    assert lookups(db) == lookups(fresh)
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "shardcat_records" not in tables and "shardcat_fields_1" not in tables
        assert conn.execute("SELECT count(*) FROM shardcat_records_1").fetchone() == (30,)
        plan = " ".join(
            str(r[3])
            for r in conn.execute("EXPLAIN QUERY PLAN SELECT count(*) FROM tf WHERE label = 1")
        )
        assert "USING COVERING INDEX shardcat_records_1_v" in plan
        version = conn.execute("SELECT value FROM shardcat_meta WHERE name = 'schema_version'")
        assert version.fetchone() == (str(migrations.SCHEMA_VERSION),)


# -- upgrades say what they do; older shardcats refuse what they cannot read (issue 27) ----


def _notice(db: Path, found: int) -> str:
    return (
        f"upgraded the catalog {db} from schema version {found} to {migrations.SCHEMA_VERSION}: "
        "older shardcat versions can no longer open it (they refuse it as too new)"
    )


def test_the_store_alone_never_upgrades_the_opener_does(v1_catalog: Path) -> None:
    """The steps live above the store (``migrations.schema``): the store refuses an
    older catalog, naming the version, and the opener (``Catalog``) upgrades it."""
    from shardcat.catalog.store import Store

    gc.collect()
    before = v1_catalog.read_bytes()
    with pytest.raises(SchemaVersionError, match="has catalog schema version 1") as err:
        Store(v1_catalog)
    assert err.value.found == 1
    assert v1_catalog.read_bytes() == before
    with pytest.warns(ShardcatWarning, match="upgraded the catalog"), Catalog(v1_catalog) as cat:
        assert cat.datasets()[0].name == "tf"
    with Store(v1_catalog) as store:
        assert store.datasets()[0].name == "tf"


def test_read_only_opens_never_upgrade(v1_catalog: Path) -> None:
    gc.collect()  # the fixture's sqlite3 connections: their close checkpoints the file
    before = v1_catalog.read_bytes()
    with pytest.raises(SchemaVersionError, match="has catalog schema version 1"):
        Catalog(v1_catalog, readonly=True)
    for command in (["datasets"], ["query", "SELECT 1"], ["verify", "tf"]):
        result = CliRunner().invoke(app, [*command, "-c", str(v1_catalog)])
        assert result.exit_code == 1
        assert "has catalog schema version 1" in result.stderr
    assert v1_catalog.read_bytes() == before
    assert marker(v1_catalog) == "1"


def test_an_upgrade_says_so_once(v1_catalog: Path) -> None:
    with pytest.warns(ShardcatWarning) as said:
        Catalog(v1_catalog).close()
    assert [str(w.message) for w in said] == [_notice(v1_catalog, 1)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Catalog(v1_catalog).close()  # up to date: nothing to say


def test_an_upgrade_by_a_command_is_one_line(v1_catalog: Path) -> None:
    shard = v1_catalog.parent / "a.tfrecord"
    result = CliRunner().invoke(app, ["ingest", str(shard), "-d", "tf", "-c", str(v1_catalog)])
    assert result.exit_code == 0, result.output
    assert result.stderr.count("upgraded the catalog") == 1
    assert f"warning: {_notice(v1_catalog, 1)}\n" in result.stderr
    result = CliRunner().invoke(app, ["ingest", str(shard), "-d", "tf", "-c", str(v1_catalog)])
    assert "upgraded" not in result.stderr


def test_upgrade_gives_version_1_floats_their_float32_spelling(tmp_path: Path) -> None:
    """Version 1 stored a float32 field widened (``0.3401091396808624``); the upgrade
    stores it as an ingest does today (``0.34010914``), so SQL finds it by its value."""
    directory = tmp_path / "v1"
    directory.mkdir()
    scores = [0.34010914, 0.5, 2.0, 1e-30, -7.25e-3]
    with TFRecordWriter(directory / "s.tfrecord") as w:
        for i, score in enumerate(scores):
            w.write(make_example({"key": f"r{i}", "score": score, "label": i}))
    db = directory / "catalog.sqlite"
    with Catalog(db) as cat:
        cat.ingest(directory / "s.tfrecord", "t").close()
        fresh = cat.query("SELECT key, score FROM t ORDER BY position")
    downgrade_to_v1(db)
    with sqlite3.connect(db) as conn:  # what version 1 wrote: the float32 as a double
        (idx,) = conn.execute("SELECT idx FROM fields WHERE name = 'score'").fetchone()
        for i, score in enumerate(scores):
            conn.execute(
                f"UPDATE fields_1 SET v{idx} = ? WHERE ordinal = ?", (float(np.float32(score)), i)
            )
        widened = conn.execute(f"SELECT v{idx} FROM fields_1 ORDER BY ordinal").fetchall()
    assert widened[0] == (0.3401091396808624,)
    with pytest.warns(ShardcatWarning, match="from schema version 1"), Catalog(db) as cat:
        assert cat.query("SELECT key, score FROM t ORDER BY position") == fresh
        assert cat.query("SELECT key FROM t WHERE score = 0.34010914") == [("r0",)]
        assert cat.query("SELECT key FROM t WHERE score = -0.00725") == [("r4",)]


# The last shardcat before the catalog's tables took the shardcat_ prefix (schema
# version 3): it reads the schema version from catalog_meta only.
PRE_RENAME = "4e5088c90d716418e09efe00941397df7d6022c4"


@pytest.fixture(scope="module")
def pre_rename_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """That shardcat's package, from this repository's history."""
    repo = Path(__file__).resolve().parents[1]
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", PRE_RENAME, "shardcat"], capture_output=True
    )
    if archive.returncode != 0:
        missing(f"the git history (commit {PRE_RENAME}): {archive.stderr!r}")
    where = tmp_path_factory.mktemp("pre_rename")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tf:
        tf.extractall(where, filter="data")
    return where


def test_older_shardcats_refuse_an_upgraded_or_new_catalog(
    pre_rename_build: Path, tmp_path: Path
) -> None:
    """Shardcats before the rename look for ``catalog_meta`` only: without the marker
    they took an upgraded catalog for an empty one and wrote their own tables into
    it. With it they refuse it as too new, and leave it as it is."""
    upgraded = build(tmp_path / "v1")
    downgrade_to_v1(upgraded)
    with pytest.warns(ShardcatWarning):
        Catalog(upgraded).close()
    created = build(tmp_path / "new")
    env = {**os.environ, "PYTHONPATH": str(pre_rename_build)}
    env.pop("SHARDCAT_CATALOG", None)
    for db in (upgraded, created):
        assert marker(db) == str(migrations.SCHEMA_VERSION)
        before = schema_rows(db)
        refused = (
            f"{db} has catalog schema version {migrations.SCHEMA_VERSION}, but this shardcat "
            "only knows versions up to 3: upgrade shardcat (pip install -U shardcat) to open it"
        )
        shard = str(db.parent / "a.tfrecord")
        for command in (["datasets"], ["ingest", shard, "-d", "other"]):
            done = subprocess.run(
                [sys.executable, "-m", "shardcat", *command, "-c", str(db)],
                env=env,
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert (done.returncode, done.stdout, done.stderr) == (1, "", f"error: {refused}\n")
        library = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from shardcat import Catalog; Catalog(sys.argv[1])",
                str(db),
            ],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert library.returncode == 1
        assert library.stderr.splitlines()[-1] == f"shardcat.errors.SchemaVersionError: {refused}"
        assert schema_rows(db) == before


def test_no_dataset_takes_the_marker_s_name(tmp_path: Path) -> None:
    db = build(tmp_path / "cat")
    with (
        Catalog(db) as cat,
        pytest.raises(CatalogError, match="invalid dataset name 'Catalog_Meta'"),
    ):
        cat.ingest(tmp_path / "cat" / "a.tfrecord", "Catalog_Meta")
