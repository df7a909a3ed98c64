"""Schema versions of the catalog and the ordered steps between them.

``SCHEMA_VERSION`` is what this library writes. A catalog records its version
in ``shardcat_meta`` (``catalog_meta`` before version 4). Opening an older
catalog runs every step from its version up to ``SCHEMA_VERSION`` — each step
and its version bump inside the same transaction, so an interrupted upgrade
leaves the catalog at a whole version — and says so once
(:func:`say_upgraded`: older shardcats can no longer open it).
A catalog newer than the library is refused with :class:`SchemaVersionError`.
:func:`upgrade` (``catalog migrate --upgrade``) does the same without opening
anything else, e.g. before a read-only open (which never upgrades).

Every version written is also written to ``catalog_meta`` (the marker): the
shardcats before version 4 read their version there only, so without it they
would take an upgraded catalog for an empty one and add their own tables to it;
with it they refuse it as too new, as every later shardcat does.

Importing legacy index files (tfd-utils, MXNet/DALI, vahidk) lives in
:mod:`shardcat.migrations.legacy`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Connection, MetaData, String, Table, Text, inspect, select, text

from shardcat.catalog import postgres, schema, tables
from shardcat.catalog.engine import make_engine
from shardcat.errors import CatalogError, SchemaVersionError, ShardcatWarning, upgrade_hint

__all__ = [
    "SCHEMA_VERSION",
    "STEPS",
    "ensure_schema",
    "read_version",
    "say_upgraded",
    "too_new",
    "upgrade",
]

SCHEMA_VERSION = 8


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
OLD_META = schema.OLD_META


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
        tables.create_view(conn, dataset_id, name)


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


# STEPS[n] upgrades a catalog from version n to n + 1.
STEPS: dict[int, Callable[[Connection], None]] = {
    1: _add_seek_indexes,
    2: _add_versions,
    3: _prefix_names,
    4: _add_locations,
    5: _records_per_dataset,
    6: _add_checks,
    7: _add_bad_records,
}


def _meta_table(conn: Connection) -> str | None:
    """Where the schema version is kept: ``shardcat_meta`` (version 4 on),
    ``catalog_meta`` (before), None in a database that is no catalog."""
    names = set(inspect(conn).get_table_names())
    for name in (schema.catalog_meta.name, OLD_META):
        if name in names:
            return name
    return None


def read_version(conn: Connection) -> int | None:
    """The catalog's schema version, or None for an empty database."""
    table = _meta_table(conn)
    if table is None:
        return None
    value = conn.execute(
        text(f"SELECT value FROM {table} WHERE name = 'schema_version'")
    ).scalar_one_or_none()
    return None if value is None else int(value)


# The marker: ``catalog_meta`` as the shardcats before version 4 created it.
_MARKER = Table(
    OLD_META,
    MetaData(),
    Column("name", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)


def _set_version(conn: Connection, table: str, version: int) -> None:
    updated = conn.execute(
        text(f"UPDATE {table} SET value = :v WHERE name = 'schema_version'"), {"v": str(version)}
    )
    if updated.rowcount == 0:
        conn.execute(
            text(f"INSERT INTO {table} (name, value) VALUES ('schema_version', :v)"),
            {"v": str(version)},
        )


def _write_version(conn: Connection, version: int) -> None:
    """Record ``version`` in the meta table, and in the marker (see the module
    docstring) once the meta table is no longer ``catalog_meta`` itself."""
    table = _meta_table(conn) or schema.catalog_meta.name
    _set_version(conn, table, version)
    if table == OLD_META or conn.dialect.name != "sqlite":  # (no older build ran on a server)
        return
    if OLD_META in inspect(conn).get_view_names():
        return  # a dataset took the name (allowed before the marker): no marker there
    _MARKER.create(conn, checkfirst=True)
    _set_version(conn, OLD_META, version)


def say_upgraded(where: str, found: int) -> None:
    """After an open upgraded the catalog at ``where`` from version ``found`` (and
    committed): one :class:`ShardcatWarning` saying so (nothing when ``found`` is 0,
    a new catalog, or already :data:`SCHEMA_VERSION`)."""
    if 0 < found < SCHEMA_VERSION:
        warnings.warn(
            f"upgraded the catalog {where} from schema version {found} to {SCHEMA_VERSION}: "
            "older shardcat versions can no longer open it (they refuse it as too new)",
            ShardcatWarning,
            stacklevel=4,
        )


def too_new(where: str, found: int) -> SchemaVersionError:
    """The error for a catalog written by a newer shardcat (never touched)."""
    return SchemaVersionError(
        f"{where} has catalog schema version {found}, but this shardcat only "
        f"knows versions up to {SCHEMA_VERSION}: upgrade shardcat "
        "(pip install -U shardcat) to open it"
    )


def too_old(where: str, found: int) -> SchemaVersionError:
    """The error for a catalog of an older schema opened where it must not be
    upgraded (read-only): its hint names ``catalog upgrade``."""
    return SchemaVersionError(
        f"{where} has catalog schema version {found}, this shardcat writes version "
        f"{SCHEMA_VERSION}:",
        hint=upgrade_hint(where),
    )


def ensure_schema(conn: Connection, where: str) -> int:
    """Create or upgrade the schema inside the caller's (write) transaction.

    Returns the version found before any change (0 for a new catalog).
    """
    found = read_version(conn)
    if found is None:
        schema.metadata.create_all(conn)
        _write_version(conn, SCHEMA_VERSION)
        return 0
    if found > SCHEMA_VERSION:
        raise too_new(where, found)
    for version in range(found, SCHEMA_VERSION):
        STEPS[version](conn)
        _write_version(conn, version + 1)
    return found


def upgrade(path: str | os.PathLike[str]) -> tuple[int, int]:
    """Upgrade the catalog at ``path`` to :data:`SCHEMA_VERSION` in place.

    Returns ``(version found, version now)``. Raises :class:`CatalogError`
    when there is no file at ``path`` and :class:`SchemaVersionError` for a
    catalog newer than this library.
    """
    where: Path | str = str(path) if postgres.is_server_url(path) else Path(path)
    if isinstance(where, Path) and not where.is_file():
        raise CatalogError(f"no catalog at {where}")
    engine = make_engine(where)
    try:
        with engine.begin() as conn:
            found = ensure_schema(conn, postgres.display(str(where)))
    finally:
        engine.dispose()
    return found, SCHEMA_VERSION
