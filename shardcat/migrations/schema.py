"""The catalog's schema steps: ``STEPS[n]`` upgrades a catalog from schema version
``n`` to ``n + 1`` (calibre's and mopidy-local's ordered steps). :func:`upgrade`
runs every step from a catalog's version up to
:data:`~shardcat.catalog.versions.SCHEMA_VERSION` through the store's
:func:`~shardcat.catalog.versions.upgrade` (its create/upgrade lock; each step
and its version bump in the transaction that commits them, so an interrupted
upgrade leaves the catalog at a whole version). The opener
(:mod:`shardcat.facade.opener`) runs it before it opens an older catalog for
writing; a read-only open never upgrades.

Adding a version: write the step here, add it to ``STEPS`` and raise
``SCHEMA_VERSION``; the store knows nothing of what a step does.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import Connection, inspect, select, text

from shardcat.catalog import schema, tables, versions
from shardcat.catalog.versions import OLD_META, SCHEMA_VERSION, Step

__all__ = ["SCHEMA_VERSION", "STEPS", "upgrade"]


def _add_seek_indexes(conn: Connection) -> None:
    """1 -> 2: the ``seek_indexes`` table (seek points of compressed shards).
    Version 1 could not ingest compressed shards, so there is nothing to fill.
    (The DDL is frozen as version 2 wrote it: later versions renamed the tables.)"""
    conn.execute(
        text(
            "CREATE TABLE seek_indexes (\n\tshard_id INTEGER NOT NULL, \n\tkind VARCHAR(32) "
            "NOT NULL, \n\tdata BLOB NOT NULL, \n\tPRIMARY KEY (shard_id), \n\tFOREIGN "
            "KEY(shard_id) REFERENCES shards (id) ON DELETE CASCADE\n)"
        )
    )


def _add_versions(conn: Connection) -> None:
    """2 -> 3: indexed versions of shards (``generation``, ``ino``, ``ctime_ns``),
    ``datasets.version`` and ``members.extents``. Ready shards become generation 1;
    inode and ctime stay NULL until a sync or a reader has checked the fingerprint."""
    for table, column in (
        ("shards", "generation BIGINT"),
        ("shards", "ino BIGINT"),
        ("shards", "ctime_ns BIGINT"),
        ("datasets", "version BIGINT NOT NULL DEFAULT '0'"),
        ("members", "extents TEXT"),
    ):
        conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {column}"))
    conn.execute(text("UPDATE shards SET generation = 1 WHERE state = 'ready'"))
    _shortest_floats(conn)


def _float32_shortest(value: float) -> float:
    """A float32 widened to a double as the shortest decimal of that float32 (numpy's
    shortest repr, what ``float32_shortest`` stores today); any other value as it is."""
    import numpy as np  # (only upgrades from version 2 need it)

    f32 = np.float32(value)
    if float(f32) != value or value.is_integer() or not np.isfinite(f32):
        return value
    return float(str(f32))


def _shortest_floats(conn: Connection) -> None:
    """(2 -> 3) TFRecord float fields written before float32 values were stored as
    their shortest decimal (version 1 and the first version-2 builds kept
    ``0.3401091396808624`` for the float32 ``0.34010914``): rewritten as today's
    ingest stores them, so ``WHERE score = 0.34010914`` finds them. Values that
    are no float32 (already shortest) stay as they are."""
    columns = conn.execute(
        text(
            "SELECT f.dataset_id, f.idx FROM fields f JOIN datasets d ON d.id = f.dataset_id "
            "WHERE f.sql_type = 'real' AND d.format = 'tfrecord'"
        )
    ).all()
    if not columns:
        return
    dbapi: Any = conn.connection.driver_connection  # versions 1-3 were SQLite only
    dbapi.create_function("shardcat_f32", 1, _float32_shortest, deterministic=True)
    for dataset_id, idx in columns:
        conn.execute(
            text(
                f'UPDATE "fields_{dataset_id}" SET v{idx} = shardcat_f32(v{idx}) '
                f"WHERE typeof(v{idx}) = 'real'"
            )
        )


# The catalog's tables before version 4, which gave them the ``shardcat_`` prefix.
OLD_NAMES = ("catalog_meta", "datasets", "shards", "records", "members", "seek_indexes", "fields")


def _prefix_names(conn: Connection) -> None:
    """3 -> 4: the catalog's own tables and index move to the ``shardcat_`` prefix
    (``shards`` -> ``shardcat_shards``, ``fields_<id>`` -> ``shardcat_fields_<id>``,
    ``catalog_meta`` -> ``shardcat_meta``), so that a dataset may be called
    ``shards``; SQLite rewrites the foreign keys, and every dataset view is made
    again over the new names."""
    for (view,) in conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'view'")).all():
        conn.execute(text(f'DROP VIEW "{view}"'))
    ids = [r[0] for r in conn.execute(text("SELECT id FROM datasets")).all()]
    for old in OLD_NAMES:
        new = schema.catalog_meta.name if old == OLD_META else f"{schema.PREFIX}{old}"
        conn.execute(text(f'ALTER TABLE "{old}" RENAME TO "{new}"'))
    for dataset_id in ids:
        conn.execute(
            text(f'ALTER TABLE "fields_{dataset_id}" RENAME TO "shardcat_fields_{dataset_id}"')
        )
    conn.execute(text("DROP INDEX records_by_shard"))
    conn.execute(
        text(
            "CREATE UNIQUE INDEX shardcat_records_by_shard ON shardcat_records (shard_id, ordinal)"
        )
    )
    # the views come back with the last step (a catalog always upgrades to the end)


def _add_locations(conn: Connection) -> None:
    """4 -> 5: a record's location may be more than its one byte range:
    ``shardcat_records.extents`` (the ranges that make it, JSON) and ``item`` (which
    record inside them, for chunk + index formats). NULL for every record before."""
    for column in ("extents TEXT", "item BIGINT"):
        conn.execute(text(f"ALTER TABLE shardcat_records ADD COLUMN {column}"))


def _records_per_dataset(conn: Connection) -> None:
    """5 -> 6: each dataset's records and field values move into one table of its own,
    ``shardcat_records_<id>`` keyed by (shard, ordinal) with one unique index on the
    key (built after the rows, a sort); field indexes follow their columns; the shared
    ``shardcat_records`` and the ``shardcat_fields_<id>`` tables go; every view is
    made again."""
    for (view,) in conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'view'")).all():
        conn.execute(text(f'DROP VIEW "{view}"'))
    indexes = {
        r[0]
        for r in conn.execute(
            text("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")
        ).all()
    }
    datasets = conn.execute(select(schema.datasets.c.id, schema.datasets.c.name)).all()
    for dataset_id, _ in datasets:
        tables.create_records_table(conn, dataset_id, key_index=False)
        table = f'"{schema.records_table_name(dataset_id)}"'
        cols = tables.field_columns(conn, dataset_id)
        for _, sql_type, idx in cols.values():
            conn.execute(
                text(f"ALTER TABLE {table} ADD COLUMN v{idx} {tables.SQL_TYPES[sql_type]}")
            )
        target = "".join(f", v{idx}" for _, _, idx in cols.values())
        source = "".join(f", f.v{idx}" for _, _, idx in cols.values())
        old_fields = f'"shardcat_fields_{dataset_id}"'
        conn.execute(
            text(
                f'INSERT INTO {table} (shard_id, ordinal, key, "offset", length, extents, '
                f'item{target}) SELECT r.shard_id, r.ordinal, r.key, r."offset", r.length, '
                f"r.extents, r.item{source} FROM shardcat_records r LEFT JOIN {old_fields} f "
                "ON f.shard_id = r.shard_id AND f.ordinal = r.ordinal "
                "WHERE r.dataset_id = :id ORDER BY r.shard_id, r.ordinal"
            ),
            {"id": dataset_id},
        )
        tables.create_key_index(conn, dataset_id)
        for _, _, idx in cols.values():
            if f"shardcat_fields_{dataset_id}_v{idx}" in indexes:
                name = tables.field_index_name(dataset_id, idx)
                conn.execute(text(f'CREATE INDEX "{name}" ON {table} (v{idx})'))
        conn.execute(text(f"DROP TABLE IF EXISTS {old_fields}"))
    conn.execute(text("DROP TABLE shardcat_records"))
    for dataset_id, name in datasets:
        # (no deletes before 9, no shares before 11)
        tables.create_view(conn, dataset_id, name, live=False, shared=False)


def _add_checks(conn: Connection) -> None:
    """6 -> 7: each record's and member's check, ``crc`` (the CRC32C of its payload
    mixed with its key's, see :mod:`~shardcat.catalog.schema`), in every dataset's
    records table and in ``shardcat_members``. NULL for every row indexed before:
    reads check those by their framing until the shard is re-ingested. (A records
    table made by step 5 -> 6 of this library has the column already.)"""
    names = [schema.members.name] + [
        schema.records_table_name(r[0]) for r in conn.execute(select(schema.datasets.c.id))
    ]
    inspector = inspect(conn)
    for name in names:
        if "crc" not in {c["name"] for c in inspector.get_columns(name)}:
            conn.execute(text(f'ALTER TABLE "{name}" ADD COLUMN crc BIGINT'))


def _add_bad_records(conn: Connection) -> None:
    """7 -> 8: the ``shardcat_bad_records`` table (records an ingest with
    ``on_bad_record="skip"`` set aside). Earlier versions set none aside: empty."""
    schema.bad_records.create(conn)


def _add_deleted(conn: Connection) -> None:
    """8 -> 9: the ``shardcat_deleted`` table (soft-deleted keys). Earlier versions
    deleted none: empty, and the views stay as they are."""
    schema.deleted.create(conn, checkfirst=True)  # (a test may fake an older version)


def _add_tags(conn: Connection) -> None:
    """9 -> 10: the ``shardcat_tags`` table (tags: pinned record sets). Earlier
    versions had none: empty."""
    schema.tags.create(conn, checkfirst=True)  # (a test may fake an older version)


def _add_shares(conn: Connection) -> None:
    """10 -> 11: the ``shardcat_shares`` table (shards a dataset reads by reference
    from another). Earlier versions copied such rows: empty, views as they are."""
    schema.shares.create(conn, checkfirst=True)  # (a test may fake an older version)


# STEPS[n] upgrades a catalog from version n to n + 1.
STEPS: dict[int, Step] = {
    1: _add_seek_indexes,
    2: _add_versions,
    3: _prefix_names,
    4: _add_locations,
    5: _records_per_dataset,
    6: _add_checks,
    7: _add_bad_records,
    8: _add_deleted,
    9: _add_tags,
    10: _add_shares,
}


def upgrade(where: str | os.PathLike[str]) -> tuple[int, int]:
    """Upgrade the catalog at ``where`` (a file or a server URL) to
    :data:`~shardcat.catalog.versions.SCHEMA_VERSION` in place; returns ``(version
    found, version now)`` (see :func:`shardcat.catalog.versions.upgrade`)."""
    return versions.upgrade(where, STEPS)
