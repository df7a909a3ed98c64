"""Soft deletes (schema version 9): the keys of a dataset's records marked deleted,
one row each in ``shardcat_deleted``; shards and record rows are never rewritten.

Marking (or unmarking) keys bumps the dataset's ``version`` (open readers then
reload their deleted set, see :mod:`shardcat.readers.view`) and makes its view
again: with a filter leaving the marked keys out while there are any, the plain
view otherwise (so a dataset without deletes pays nothing). Marks are by key, so
a re-ingest of a changed shard keeps its deleted records deleted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, inspect, select, text

from shardcat.catalog import schema, tables
from shardcat.catalog.sync import bump_version

__all__ = ["DELETED_AT", "Pick", "copy_marks", "count", "mark", "unmark"]


@dataclass(frozen=True)
class Pick:
    """Which records of a dataset a delete or restore names: those matching ``where``
    (SQL over the dataset's view, ``params`` its placeholders' values) and/or
    ``keys``; both None: every one (restores only)."""

    where: str | None = None
    params: Sequence[Any] | Mapping[str, Any] | None = None
    keys: Sequence[str] | None = None


#: ``(shard_id, ordinal, key)`` of the dataset's records whose key is marked deleted
#: (run by readers on their read connection: the dataset's records as
#: :func:`~shardcat.catalog.lookup.records_source` gives them, then its id)
DELETED_AT = (
    "SELECT r.shard_id, r.ordinal, r.key FROM shardcat_deleted d "
    "JOIN {records} r ON r.key = d.key WHERE d.dataset_id = ?"
)

_BATCH = 10_000


def mark(conn: Connection, dataset_id: int, name: str, keys: Sequence[str]) -> int:
    """Mark ``keys`` of the dataset deleted (keys marked already stay so); returns how
    many were newly marked."""
    sql = text(
        "INSERT INTO shardcat_deleted (dataset_id, key) VALUES (:id, :key) "
        "ON CONFLICT (dataset_id, key) DO NOTHING"
    )
    before = count(conn, dataset_id)
    for start in range(0, len(keys), _BATCH):
        part = keys[start : start + _BATCH]
        conn.execute(sql, [{"id": dataset_id, "key": k} for k in part])
    added = count(conn, dataset_id) - before
    if added:
        _changed(conn, dataset_id, name)
    return added


def unmark(conn: Connection, dataset_id: int, name: str, keys: Sequence[str] | None) -> int:
    """Restore ``keys`` (None: every deleted key of the dataset); returns how many."""
    d = schema.deleted
    before = count(conn, dataset_id)
    if keys is None:
        conn.execute(delete(d).where(d.c.dataset_id == dataset_id))
    for start in range(0, len(keys or ()), _BATCH):
        part = list(keys[start : start + _BATCH])  # type: ignore[index]
        conn.execute(delete(d).where(d.c.dataset_id == dataset_id, d.c.key.in_(part)))
    restored = before - count(conn, dataset_id)
    if restored:
        _changed(conn, dataset_id, name)
    return restored


def count(conn: Connection, dataset_id: int) -> int:
    """How many keys of the dataset are marked deleted."""
    d = schema.deleted
    sql = select(d.c.key).where(d.c.dataset_id == dataset_id).subquery()
    return int(conn.execute(select(text("count(*)")).select_from(sql)).scalar_one())


def copy_marks(src: Connection, dst: Connection, name: str, dst_id: int) -> None:
    """Copy dataset ``name``'s marks from ``src`` to ``dst`` (a snapshot's copy,
    ``dst_id``); none from a catalog before version 9."""
    if not inspect(src).has_table(schema.deleted.name):
        return
    d, ds = schema.deleted, schema.datasets
    src_id = src.execute(select(ds.c.id).where(ds.c.name == name)).scalar_one()
    keys = src.execute(select(d.c.key).where(d.c.dataset_id == src_id)).scalars().all()
    if keys:
        dst.execute(d.insert(), [{"dataset_id": dst_id, "key": k} for k in keys])


def _changed(conn: Connection, dataset_id: int, name: str) -> None:
    bump_version(conn, dataset_id)
    tables.create_view(conn, dataset_id, name)
