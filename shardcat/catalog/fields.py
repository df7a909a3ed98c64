"""Per-dataset scalar fields and the SQL view named after each dataset.

Field values live in ``fields_<dataset id>``: ``shard_id, ordinal`` (the
record) and one column ``v<idx>`` per field, so feature names never have to
be valid column names. The view renames them to the feature names::

    CREATE VIEW train AS
    SELECT (SELECT r.key FROM shardcat_records r
            WHERE r.shard_id = f.shard_id AND r.ordinal = f.ordinal) AS key,
           s.first_position + f.ordinal AS position, s.path AS shard,
           f.v1 AS label, f.v2 AS score
    FROM fields_1 f JOIN shardcat_shards s ON s.id = f.shard_id

The key is a scalar subquery on a unique index, so SQLite skips ``records``
entirely for queries that do not use ``key`` (``count(*) WHERE label < 10``,
``GROUP BY label``). A LEFT JOIN would not be skipped in aggregates: with 1M
records that made ``count(*) WHERE label < 10`` ~3x and ``GROUP BY`` ~3x slower.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    select,
)

from shardcat.catalog import schema

__all__ = ["create_field_table", "drop_dataset_objects", "ensure_field_columns", "sql_type_of"]

_SQL_TYPES = {"integer": "BIGINT", "real": "DOUBLE PRECISION", "text": "TEXT"}


def sql_type_of(value: object) -> str:
    if isinstance(value, str):
        return "text"
    if isinstance(value, float):
        return "real"
    return "integer"


def _quote(conn: Connection, name: str) -> str:
    return conn.dialect.identifier_preparer.quote_identifier(name)


def create_field_table(conn: Connection, dataset_id: int) -> None:
    Table(
        schema.field_table_name(dataset_id),
        MetaData(),
        Column("shard_id", Integer, nullable=False),
        Column("ordinal", BigInteger, nullable=False),
        PrimaryKeyConstraint("shard_id", "ordinal"),
        sqlite_with_rowid=False,
    ).create(conn)


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
    table = _quote(conn, schema.field_table_name(dataset_id))
    for name in new:
        idx += 1
        col = _view_name_for(name, taken)
        taken.add(col.lower())
        sql_type = wanted[name]
        conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN v{idx} {_SQL_TYPES[sql_type]}")
        conn.execute(
            schema.fields.insert().values(
                dataset_id=dataset_id, name=name, column_name=col, sql_type=sql_type, idx=idx
            )
        )
        existing[name] = (col, sql_type, idx)
    create_view(conn, dataset_id, dataset_name)
    return existing


def create_view(conn: Connection, dataset_id: int, dataset_name: str) -> None:
    """(Re)create the view named after the dataset.

    A dataset ingested without fields has no rows in its field table (half the
    inserts); its view reads ``records`` instead.
    """
    d = schema.datasets
    row = conn.execute(select(d.c.key_rule, d.c.options).where(d.c.id == dataset_id)).one()
    by_position = row.key_rule == "position"
    q = _quote(conn, dataset_name)
    conn.exec_driver_sql(f"DROP VIEW IF EXISTS {q}")
    if not json.loads(row.options).get("fields", True):
        key = "CAST(s.first_position + r.ordinal AS TEXT)" if by_position else "r.key"
        conn.exec_driver_sql(
            f"CREATE VIEW {q} AS SELECT {key} AS key, s.first_position + r.ordinal AS position, "
            "s.path AS shard FROM shardcat_records r JOIN shardcat_shards s ON s.id = r.shard_id "
            f"WHERE r.dataset_id = {int(dataset_id)}"
        )
        return
    cols = ", ".join(
        f"f.v{idx} AS {_quote(conn, col)}"
        for col, _, idx in field_columns(conn, dataset_id).values()
    )
    # A correlated scalar subquery, not a LEFT JOIN: SQLite drops an unused
    # subquery column in every query, but keeps an unused LEFT JOIN in
    # aggregates (count(*), GROUP BY), one records lookup per row.
    key = (
        "CAST(s.first_position + f.ordinal AS TEXT)"
        if by_position
        else (
            "(SELECT r.key FROM shardcat_records r WHERE r.shard_id = f.shard_id AND "
            "r.ordinal = f.ordinal)"
        )
    )
    conn.exec_driver_sql(
        f"CREATE VIEW {q} AS SELECT {key} AS key, s.first_position + f.ordinal AS position, "
        f"s.path AS shard{', ' + cols if cols else ''} "
        f"FROM {_quote(conn, schema.field_table_name(dataset_id))} f "
        "JOIN shardcat_shards s ON s.id = f.shard_id"
    )


def drop_dataset_objects(conn: Connection, dataset_id: int, dataset_name: str) -> None:
    conn.exec_driver_sql(f"DROP VIEW IF EXISTS {_quote(conn, dataset_name)}")
    conn.exec_driver_sql(
        f"DROP TABLE IF EXISTS {_quote(conn, schema.field_table_name(dataset_id))}"
    )
