"""A dataset's row: :func:`ensure` creates it (or checks the rule it is read with)
and syncs its shard rows; :class:`DatasetInfo` is what the catalog says of it (its
rule, options, shard and record counts, SQL fields and which of them are indexed),
read on the store's read-only connection."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, NamedTuple

from sqlalchemy import Connection, func, select

from shardcat.catalog import reuse, schema, tables
from shardcat.catalog.lookup import ReadConnection, records_source, records_table_of
from shardcat.catalog.sync import DROPPED, Judge, sync_shards
from shardcat.errors import CatalogError

__all__ = ["DatasetInfo", "DatasetPlan", "DatasetRow", "describe", "ensure"]

#: the columns of a dataset row as :class:`DatasetRow` holds them
ROW_COLUMNS = "id, name, format, key_rule, grouping, options, source, created_at"


class DatasetRow(NamedTuple):
    """A dataset's ``shardcat_datasets`` row (``options`` and ``source`` decoded)."""

    id: int
    name: str
    format: str
    key_rule: str
    grouping: str | None
    options: dict[str, Any]
    source: list[str]
    created_at: float

    @classmethod
    def of(cls, row: Sequence[Any]) -> DatasetRow:
        """The row as the ``ROW_COLUMNS`` query returns it."""
        id_, name, format, key_rule, grouping, options, source, created_at = row
        options, source = json.loads(options), json.loads(source)
        return cls(id_, name, format, key_rule, grouping, options, source, created_at)


@dataclass(frozen=True)
class DatasetPlan:
    """What an ingest asks of a dataset's rows (:meth:`Store.ensure_dataset
    <shardcat.catalog.store.Store.ensure_dataset>`): the dataset ``name`` read with
    ``rule``, its ``source`` patterns, and its shard rows matching ``files`` (stored
    path -> stat; ``same_file`` judges an unchanged file, ``rescan`` re-indexes them
    all). A new dataset starts from ``first`` (the options only all its shards
    tell) and, with ``seed``, copies the rows of shards another dataset holds with
    the same rule (:mod:`~shardcat.catalog.reuse`)."""

    name: str
    rule: reuse.Rule
    source: Sequence[str]
    files: Mapping[str, Any]
    same_file: Judge
    first: Mapping[str, Any] = dataclass_field(default_factory=dict)
    rescan: bool = False
    seed: bool = True


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
    # of ``records``, how many are soft-deleted (schema version 9)
    deleted: int = 0
    # how many tags pin a version of it (schema version 10)
    tags: int = 0

    @property
    def key_feature(self) -> str | None:
        return self.key_rule.partition(":")[2] if self.key_rule.startswith("feature:") else None


DELETED_COUNT = (
    "SELECT count(*) FROM shardcat_deleted d JOIN {records} r ON r.key = d.key "
    "WHERE d.dataset_id = ?"
)


TAG_COUNT = "SELECT count(*) FROM shardcat_tags WHERE dataset_id = ?"


def describe(conn: ReadConnection, row: DatasetRow, index_names_sql: str) -> DatasetInfo:
    """The dataset whose ``shardcat_datasets`` row is ``row``; ``index_names_sql``: the
    backend's statement for the names of a table's indexes."""
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
    index_names = conn.execute(index_names_sql, (schema.records_table_name(row[0]),))
    indexed = tables.indexed_columns(
        (r[0] for r in index_names), row[0], {idx: col for col, _, idx in registry}
    )
    return DatasetInfo(
        name=row.name,
        format=row.format,
        key_rule=row.key_rule,
        grouping=row.grouping,
        options=row.options,
        source=row.source,
        created_at=row.created_at,
        shards=sum(states.values()),
        ready_shards=states.get("ready", 0),
        failed_shards=states.get("failed", 0),
        records=int(n),
        fields=cols,
        indexed=indexed,
        deleted=conn.execute(
            DELETED_COUNT.format(records=records_source(row.id, records_table_of(conn, row.id))),
            (row.id,),
        ).fetchone()[0],
        tags=conn.execute(TAG_COUNT, (row[0],)).fetchone()[0],
    )


def _refuse_case_twin(conn: Connection, name: str) -> None:
    """A new dataset's name must differ from every other's in more than case: SQL
    names do not tell case apart, so ``TRAIN`` and ``train`` would be one view."""
    d = schema.datasets
    twin = conn.execute(select(d.c.name).where(func.lower(d.c.name) == name.lower())).scalar()
    if twin is not None:
        raise CatalogError(
            f"dataset name {name!r} is taken by dataset {twin!r} (SQL names do not tell "
            f"case apart): ingest into {twin!r}, or choose another name"
        )


def ensure(conn: Connection, plan: DatasetPlan) -> tuple[int, dict[str, Any], str]:
    """:meth:`Store.ensure_dataset <shardcat.catalog.store.Store.ensure_dataset>` in the
    caller's write transaction: the dataset row (created, or checked against ``rule``),
    its options and source, its records table and view, and its shard rows."""
    name, rule, source, files, same_file = (
        plan.name,
        plan.rule,
        plan.source,
        plan.files,
        plan.same_file,
    )
    rescan = plan.rescan
    d = schema.datasets
    row = conn.execute(select(d).where(d.c.name == name)).one_or_none()
    stored = dict(plan.first) if row is None else json.loads(row.options)
    opts: dict[str, Any] = rule.options(stored)
    key_rule = rule.key_rule(opts)
    if row is None:
        _refuse_case_twin(conn, name)
        inserted = conn.execute(
            d.insert().values(
                name=name,
                format=rule.format,
                key_rule=key_rule,
                grouping=opts.get("grouping"),
                # an empty DROPPED table: its counts are complete from the start
                options=json.dumps({**opts, DROPPED: {}}),
                source=json.dumps(list(source)),
                created_at=time.time(),
            )
        ).inserted_primary_key
        assert inserted is not None  # both databases report the new row's id
        dataset_id = inserted[0]
        tables.create_records_table(conn, dataset_id)
        tables.create_view(conn, dataset_id, name)
        if plan.seed:  # rows another dataset already holds
            reuse.seed(conn, dataset_id, name, opts, files, same_file)
    else:
        dataset_id = row.id
        if (row.format, row.key_rule, row.grouping) != (
            rule.format,
            key_rule,
            opts.get("grouping"),
        ):
            raise CatalogError(
                f"dataset {name!r} holds {row.format} records keyed by "
                f"{row.key_rule}, not {rule.format} keyed by {key_rule}"
                + (f" (grouping {opts.get('grouping')})" if opts.get("grouping") else "")
                + ": ingest into "
                f"another dataset or drop it first (catalog drop {name})"
            )
        kept = {**opts, DROPPED: stored[DROPPED]} if DROPPED in stored else opts
        if (row.options, row.source) != (json.dumps(kept), json.dumps(list(source))):
            conn.execute(
                d.update()
                .where(d.c.id == dataset_id)
                .values(options=json.dumps(kept), source=json.dumps(list(source)))
            )
        if stored.get("fields", True) != opts.get("fields", True):
            rescan = True  # every shard gains (or loses) its field rows
            tables.create_view(conn, dataset_id, name)
    sync_shards(conn, dataset_id, files, same_file, rescan)
    return dataset_id, opts, key_rule
