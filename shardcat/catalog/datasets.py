"""What the catalog says of a dataset: :class:`DatasetInfo` (its rule, options,
shard and record counts, SQL fields and which of them are indexed), read on the
store's read-only connection."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from shardcat.catalog import schema, tables
from shardcat.catalog.lookup import ReadConnection

__all__ = ["DatasetInfo", "describe"]


@dataclass(frozen=True)
class DatasetInfo:
    """A dataset as the catalog describes it."""

    name: str
    format: str
    key_rule: str
    grouping: str | None
    options: dict[str, Any]
    source: list[str]
    created_at: float
    shards: int
    ready_shards: int
    failed_shards: int
    records: int
    fields: dict[str, str]  # view column -> sql type
    # view columns with an index (create_index), in field order
    indexed: list[str] = dataclass_field(default_factory=list)

    @property
    def key_feature(self) -> str | None:
        return self.key_rule.partition(":")[2] if self.key_rule.startswith("feature:") else None


def describe(conn: ReadConnection, row: Sequence[Any], *, server: bool) -> DatasetInfo:
    """The dataset whose ``shardcat_datasets`` row is ``row`` (id, name, format,
    key_rule, grouping, options, source, created_at); ``server``: a PostgreSQL catalog."""
    states = dict(
        conn.execute(
            "SELECT state, count(*) FROM shardcat_shards WHERE dataset_id = ? GROUP BY state",
            (row[0],),
        ).fetchall()
    )
    n = conn.execute(
        "SELECT coalesce(sum(num_records), 0) FROM shardcat_shards "
        "WHERE dataset_id = ? AND state = 'ready'",
        (row[0],),
    ).fetchone()[0]
    registry = conn.execute(
        "SELECT column_name, sql_type, idx FROM shardcat_fields WHERE dataset_id = ? ORDER BY idx",
        (row[0],),
    ).fetchall()
    cols = {col: sql_type for col, sql_type, _ in registry}
    index_names = conn.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = ?"
        if server
        else "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?",
        (schema.records_table_name(row[0]),),
    )
    indexed = tables.indexed_columns(
        (r[0] for r in index_names), row[0], {idx: col for col, _, idx in registry}
    )
    return DatasetInfo(
        name=row[1],
        format=row[2],
        key_rule=row[3],
        grouping=row[4],
        options=json.loads(row[5]),
        source=json.loads(row[6]),
        created_at=row[7],
        shards=sum(states.values()),
        ready_shards=states.get("ready", 0),
        failed_shards=states.get("failed", 0),
        records=int(n),
        fields=cols,
        indexed=indexed,
    )
