"""Per-dataset records tables, their scalar field columns, the key index, and the
SQL view named after each dataset.

A dataset's records live in ``shardcat_records_<dataset id>`` (schema version
6): ``shard_id, ordinal`` (the record; the primary key), ``key``, ``offset``,
``length``, ``extents``, ``item``, ``crc`` (its check, version 7), and one
column ``v<idx>`` per scalar field, so feature names never have to be valid
column names. The view renames them to the feature names::

    CREATE VIEW train AS
    SELECT r.key AS key,
           (SELECT s.first_position FROM shardcat_shards s WHERE s.id = r.shard_id)
             + r.ordinal AS position,
           (SELECT s.path FROM shardcat_shards s WHERE s.id = r.shard_id) AS shard,
           r.v1 AS label, r.v2 AS score
    FROM shardcat_records_1 r

Position and shard are scalar subqueries on the shards' primary key, so SQLite
drops them from every query that does not use them (``count(*) WHERE label <
10``, ``GROUP BY label`` read the records table or a field index alone); a join
would be kept (it could change the row count).

The key index (``shardcat_records_<dataset id>_key``, unique) is made with the
table; a dataset's first ingest drops it and builds it after the rows are in
(:func:`drop_key_index`, :func:`create_key_index`). Indexes a user asks for
(:func:`create_field_index`) are one per field column,
``shardcat_records_<dataset id>_v<idx>`` on ``v<idx>``; the database's own
catalog (SQLite's ``sqlite_master``, PostgreSQL's ``pg_indexes``) is the record
of which fields have one (no table of ours), a re-ingest's deletes and inserts
keep them current, and dropping the dataset's records table drops them. A
WITHOUT ROWID table's index holds its primary key too, so ``count(*) WHERE
label < 10`` through the view reads the index alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from sqlalchemy import Connection, select

from shardcat.catalog import schema
from shardcat.catalog.backend import dialect_of, run
from shardcat.catalog.lookup import records_source
from shardcat.errors import CatalogError

__all__ = [
    "create_field_index",
    "create_key_index",
    "create_records_table",
    "donor_of",
    "drop_dataset_objects",
    "drop_field_index",
    "drop_key_index",
    "ensure_field_columns",
    "field_index_name",
    "has_key_index",
    "indexed_columns",
    "sql_type_of",
]

SQL_TYPES = {"integer": "BIGINT", "real": "DOUBLE PRECISION", "text": "TEXT"}


def sql_type_of(value: object) -> str:
    if isinstance(value, str):
        return "text"
    if isinstance(value, float):
        return "real"
    return "integer"


def _quote(conn: Connection, name: str) -> str:
    return conn.dialect.identifier_preparer.quote_identifier(name)


def create_records_table(conn: Connection, dataset_id: int, key_index: bool = True) -> None:
    """The dataset's records table and (``key_index``) its key index (see the module
    docstring)."""
    table = _quote(conn, schema.records_table_name(dataset_id))
    dialect = dialect_of(conn)
    run(
        conn,
        f"CREATE TABLE {table} (shard_id INTEGER NOT NULL {dialect.shard_reference}, "
        'ordinal BIGINT NOT NULL, key TEXT NOT NULL, "offset" BIGINT NOT NULL, '
        "length BIGINT NOT NULL, extents TEXT, item BIGINT, crc BIGINT, "
        f"PRIMARY KEY (shard_id, ordinal)){dialect.records_options}",
    )
    if key_index:
        create_key_index(conn, dataset_id)


def create_key_index(conn: Connection, dataset_id: int) -> None:
    """The unique index on the dataset's keys (IntegrityError when two records share
    a key)."""
    with dialect_of(conn).index_build(conn):
        run(
            conn,
            f"CREATE UNIQUE INDEX IF NOT EXISTS {_quote(conn, schema.key_index_name(dataset_id))} "
            f"ON {_quote(conn, schema.records_table_name(dataset_id))} (key)",
        )


def drop_key_index(conn: Connection, dataset_id: int) -> None:
    run(conn, f"DROP INDEX IF EXISTS {_quote(conn, schema.key_index_name(dataset_id))}")


def has_key_index(conn: Connection, dataset_id: int) -> bool:
    return schema.key_index_name(dataset_id) in _index_names(conn, dataset_id)


def field_columns(conn: Connection, dataset_id: int) -> dict[str, tuple[str, str, int]]:
    """feature name -> (view column, sql type, idx), in idx order."""
    f = schema.fields
    rows = conn.execute(
        select(f.c.name, f.c.column_name, f.c.sql_type, f.c.idx)
        .where(f.c.dataset_id == dataset_id)
        .order_by(f.c.idx)
    )
    return {r.name: (r.column_name, r.sql_type, r.idx) for r in rows}


def _view_name_for(feature: str, taken: set[str]) -> str:
    return schema.first_free(
        f"f_{feature}" if feature.lower() in schema.VIEW_COLUMNS else feature, taken
    )


def ensure_field_columns(
    conn: Connection, dataset_id: int, dataset_name: str, wanted: Mapping[str, str]
) -> dict[str, tuple[str, str, int]]:
    """Add columns for the features in ``wanted`` (name -> sql type) that the
    dataset does not have yet; rebuild its view if anything was added."""
    existing = field_columns(conn, dataset_id)
    new = [name for name in wanted if name not in existing]
    if not new:
        return existing
    taken = {col.lower() for col, _, _ in existing.values()} | set(schema.VIEW_COLUMNS)
    idx = max((i for _, _, i in existing.values()), default=0)
    table = _quote(conn, schema.records_table_name(dataset_id))
    for name in new:
        idx += 1
        col = _view_name_for(name, taken)
        taken.add(col.lower())
        sql_type = wanted[name]
        run(conn, f"ALTER TABLE {table} ADD COLUMN v{idx} {SQL_TYPES[sql_type]}")
        conn.execute(
            schema.fields.insert().values(
                dataset_id=dataset_id, name=name, column_name=col, sql_type=sql_type, idx=idx
            )
        )
        existing[name] = (col, sql_type, idx)
    create_view(conn, dataset_id, dataset_name)
    return existing


def create_view(
    conn: Connection,
    dataset_id: int,
    dataset_name: str,
    *,
    live: bool | None = None,
    shared: bool = True,
) -> None:
    """(Re)create the view named after the dataset (see the module docstring); a
    dataset ingested without fields shows none; while it has soft-deleted keys
    (schema version 9) the view leaves them out (``live``: whether to; None: look
    whether it has any; False for catalogs before version 9). ``shared``: False
    for catalogs before version 11, where every dataset reads its own rows."""
    q = _quote(conn, dataset_name)
    run(conn, f"DROP VIEW IF EXISTS {q}")
    if live is None:
        d = schema.deleted
        found = conn.execute(select(d.c.key).where(d.c.dataset_id == dataset_id).limit(1))
        live = found.first() is not None
    select_sql = view_select(conn, dataset_id, live=live, shared=shared)
    run(conn, f"CREATE VIEW {q} AS {select_sql}")


def donor_of(conn: Connection, dataset_id: int) -> int | None:
    """The dataset whose records dataset ``dataset_id`` reads by reference (None: its
    own; see :mod:`~shardcat.catalog.shares`)."""
    x = schema.shares
    found = conn.execute(select(x.c.donor_id).where(x.c.dataset_id == dataset_id).limit(1))
    return found.scalar()


def view_select(conn: Connection, dataset_id: int, *, live: bool, shared: bool = True) -> str:
    """The SELECT of the dataset's view; ``live``: without its soft-deleted keys. A
    dataset reading another's rows by reference selects them from the donor's table
    (:func:`~shardcat.catalog.lookup.records_source`)."""
    d = schema.datasets
    row = conn.execute(select(d.c.key_rule, d.c.options).where(d.c.id == dataset_id)).one()
    with_fields = json.loads(row.options).get("fields", True)
    shown = field_columns(conn, dataset_id).values() if with_fields else ()
    cols = "".join(f", r.v{idx} AS {_quote(conn, col)}" for col, _, idx in shown)
    shard = "FROM shardcat_shards s WHERE s.id = r.shard_id)"
    position = f"(SELECT s.first_position {shard} + r.ordinal"
    donor = donor_of(conn, dataset_id) if shared else None
    source = records_source(dataset_id, donor, [f"v{idx}" for _, _, idx in shown])
    key = f"CAST({position} AS TEXT)" if row.key_rule == "position" else "r.key"
    where = (
        " WHERE NOT EXISTS (SELECT 1 FROM shardcat_deleted x "
        f"WHERE x.dataset_id = {int(dataset_id)} AND x.key = r.key)"
        if live
        else ""
    )
    return (
        f"SELECT {key} AS key, {position} AS position, "
        f"(SELECT s.path {shard} AS shard{cols} "
        f"FROM {source} r{where}"
    )


def drop_dataset_objects(conn: Connection, dataset_id: int, dataset_name: str) -> None:
    """The dataset's view and records table (with every index on it)."""
    run(conn, f"DROP VIEW IF EXISTS {_quote(conn, dataset_name)}")
    run(conn, f"DROP TABLE IF EXISTS {_quote(conn, schema.records_table_name(dataset_id))}")


def field_index_name(dataset_id: int, idx: int) -> str:
    """The index on column ``v<idx>`` of the dataset's field table."""
    return f"{schema.records_table_name(dataset_id)}_v{idx}"


def _field_idx(conn: Connection, dataset_id: int, dataset_name: str, field: str) -> int:
    """``idx`` of the field named ``field`` in the dataset's view (else its feature
    name); :class:`CatalogError` listing the fields when there is none."""
    cols = field_columns(conn, dataset_id)
    for col, _, idx in cols.values():
        if col == field:
            return idx
    if field in cols:
        return cols[field][2]
    for col, _, idx in cols.values():  # SQL names are case-insensitive
        if col.lower() == field.lower():
            return idx
    known = ", ".join(col for col, _, _ in cols.values())
    raise CatalogError(
        f"dataset {dataset_name!r} has no SQL field {field!r}"
        + (
            f" (its fields: {known})"
            if known
            else " (it has no SQL fields: ingested with fields=False, or its records have none)"
        )
    )


def create_field_index(conn: Connection, dataset_id: int, dataset_name: str, field: str) -> bool:
    """Index the field's column; False when it already had its index."""
    idx = _field_idx(conn, dataset_id, dataset_name, field)
    name = field_index_name(dataset_id, idx)
    if name in _index_names(conn, dataset_id):
        return False
    table = _quote(conn, schema.records_table_name(dataset_id))
    run(conn, f"CREATE INDEX {_quote(conn, name)} ON {table} (v{idx})")
    return True


def drop_field_index(conn: Connection, dataset_id: int, dataset_name: str, field: str) -> bool:
    """Drop the field's index; False when it had none."""
    idx = _field_idx(conn, dataset_id, dataset_name, field)
    name = field_index_name(dataset_id, idx)
    if name not in _index_names(conn, dataset_id):
        return False
    run(conn, f"DROP INDEX {_quote(conn, name)}")
    return True


def _index_names(conn: Connection, dataset_id: int) -> set[str]:
    table = schema.records_table_name(dataset_id)
    rows = run(conn, dialect_of(conn).index_names_sql, (table,))
    return {r[0] for r in rows}


def indexed_columns(names: Iterable[str], dataset_id: int, columns: Mapping[int, str]) -> list[str]:
    """The view columns (``idx -> column``) whose index is among the index ``names``,
    in idx order."""
    have = set(names)
    return [
        col for idx, col in sorted(columns.items()) if field_index_name(dataset_id, idx) in have
    ]
