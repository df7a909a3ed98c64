"""Every SQL statement the readers run, each one constant text per dataset (its
records table is named in it) on the store's read-only DBAPI connection (so
``sqlite3`` prepares it once per connection and reuses it: a single lookup is
one cached point query, no SQLAlchemy in the way).

The single lookups by key and by position (:class:`RecordStatements`) are also
run as they are by the readers' hot path, without a function call around them.
Record rows are ``(batch index, shard_id, ordinal, offset, length, crc,
extents, item)``, plus the key where asked for: the location of the record as
the format's scan gave it (``extents`` JSON text or None; both left out for
formats whose records are one byte range, see :class:`RecordStatements`) and
its check (``crc``, schema version 7; None for rows indexed before), which
every read compares the bytes with.
Batches are one query per batch: the items go in as one JSON array and
``CROSS JOIN`` makes SQLite loop over it and look each item up (instead of
scanning the records), in sorted order for B-tree locality (2-3x faster than
random order). How a backend expands that array (:class:`BatchItems`) is the
backend's (:mod:`~shardcat.catalog.backend`): a PostgreSQL catalog expands it with
``jsonb_array_elements``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "BatchItems",
    "ReadConnection",
    "RecordStatements",
    "Row",
    "dataset_options",
    "dataset_version",
    "keys_of_shard",
    "member_by_key",
    "members_at",
    "members_by_key",
    "members_source",
    "page_of_members",
    "page_of_records",
    "record_by_key",
    "records_at",
    "records_by_key",
    "records_of_shard",
    "records_source",
    "records_table_of",
    "seek_index",
    "shards",
    "statements",
]

Row = tuple[Any, ...]


class ReadConnection(Protocol):
    """The read-only connection the readers' statements run on: a ``sqlite3``
    connection, or the PostgreSQL backend's ``ServerConnection``."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...

    @property
    def in_transaction(self) -> bool: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RecordStatements:
    """The record lookups of one dataset (its records table is in the text). Rows are
    ``(batch index, shard_id[, ordinal], offset, length, crc[, extents, item][, key])``:
    ``ordinal`` only for formats whose records have parts (their members are
    found by it), ``extents`` and ``item`` only where records may have them
    (every column a row carries costs the hot path about as much as the point
    query's own search). ``offset`` is the column the location starts at.
    ``one``: the single lookup by key of datasets of one-range records,
    ``(shard_id, offset, length, crc)`` only: every read by key runs it;
    ``one_at``: the same by ``(shard_id, ordinal)``, with the key last (the native
    batch read steps them per item, :mod:`shardcat.readers.batch`)."""

    offset: int
    one: str
    one_at: str
    by_key: str
    at: str
    many_by_key: str
    many_at: str
    member_by_key: str
    members_by_key: str
    keys_of_shard: str
    records_of_shard: str
    members_of_shard: str
    page_of_records: str
    page_of_members: str
    members_at: str


@dataclass(frozen=True)
class BatchItems:
    """How a backend turns a batch's one JSON array parameter into ``(index, value)``
    rows, in SQL fragments: ``items`` (the row source, one ``?``), ``index`` (the
    item's position), ``join`` (how the records are joined to it), ``key`` (the item
    as a key) and ``at`` (the item ``[shard_id, ordinal]`` as two integers)."""

    items: str
    index: str
    join: str
    key: str
    at: tuple[str, str]


def records_source(
    dataset_id: int, donor: int | None, fields: Sequence[str] = (), *, by_shard: bool = False
) -> str:
    """The records dataset ``dataset_id`` reads, as SQL a ``FROM`` takes: its own
    table, or (``donor``: the dataset whose rows it reads by reference, see
    :mod:`~shardcat.catalog.shares`) the donor's rows of the shards it shares, under
    its own shard ids (``fields``: the field columns to keep, ``v<idx>``). A lookup
    by key is the donor's key index, then one primary-key probe of ``shardcat_shares``;
    ``by_shard`` (lookups by shard and ordinal, batches of them) takes the share first
    (SQLite keeps a ``CROSS JOIN``'s order): its ``shard_id`` index, then the donor's
    primary key."""
    if donor is None:
        return f'"shardcat_records_{int(dataset_id)}"'
    kept = "".join(f", q.{c} AS {c}" for c in fields)
    return _shared(
        dataset_id,
        'q.ordinal AS ordinal, q.key AS key, q."offset" AS "offset", q.length AS length, '
        f"q.extents AS extents, q.item AS item, q.crc AS crc{kept}",
        f'"shardcat_records_{int(donor)}"',
        by_shard,
    )


def _shared(dataset_id: int, columns: str, table: str, by_shard: bool) -> str:
    tables = (
        f"shardcat_shares x CROSS JOIN {table} q" if by_shard else f"{table} q, shardcat_shares x"
    )
    return (
        f"(SELECT x.shard_id AS shard_id, {columns} FROM {tables} "
        f"WHERE x.donor_shard_id = q.shard_id AND x.dataset_id = {int(dataset_id)})"
    )


def members_source(dataset_id: int, donor: int | None) -> str:
    """The members dataset ``dataset_id`` reads, as :func:`records_source` its records
    (always found by shard and ordinal)."""
    if donor is None:
        return "shardcat_members"
    columns = (
        'q.ordinal AS ordinal, q.name AS name, q."offset" AS "offset", q.length AS length, '
        "q.extents AS extents, q.crc AS crc"
    )
    return _shared(dataset_id, columns, "shardcat_members", True)


_DONOR = "SELECT donor_id FROM shardcat_shares WHERE dataset_id = ? LIMIT 1"


def records_table_of(conn: ReadConnection, dataset_id: int) -> int | None:
    """The dataset whose records table dataset ``dataset_id`` reads by reference
    (None: its own)."""
    row = conn.execute(_DONOR, (dataset_id,)).fetchone()
    return None if row is None else int(row[0])


@functools.lru_cache(maxsize=256)
def statements(
    dataset_id: int, one_range: bool, parts: bool, batch: BatchItems, donor: int | None = None
) -> RecordStatements:
    """The statements of dataset ``dataset_id`` (``one_range``: its format's records
    are always one byte range; ``parts``: they are made of members; ``batch``: the
    catalog backend's batch items, ``Backend.dialect.batch_items``; ``donor``: the
    dataset whose rows it reads by reference, see :func:`records_source`)."""
    t = records_source(dataset_id, donor)
    at = records_source(dataset_id, donor, by_shard=True)  # (the same for a dataset's own)
    members = members_source(dataset_id, donor)
    items, index, join, item_key, item_at = (
        batch.items,
        batch.index,
        batch.join,
        batch.key,
        batch.at,
    )
    location = (
        "r.shard_id"
        + (", r.ordinal" if parts else "")
        + ', r."offset", r.length, r.crc'
        + ("" if one_range else ", r.extents, r.item")
    )
    return RecordStatements(
        offset=3 if parts else 2,
        one=f'SELECT r.shard_id, r."offset", r.length, r.crc FROM {t} r WHERE r.key = ?',
        one_at=(
            f'SELECT r.shard_id, r."offset", r.length, r.crc, r.key FROM {at} r '
            "WHERE r.shard_id = ? AND r.ordinal = ?"
        ),
        by_key=f"SELECT 0, {location} FROM {t} r WHERE key = ?",
        at=f"SELECT 0, {location}, key FROM {at} r WHERE shard_id = ? AND ordinal = ?",
        many_by_key=(f"SELECT {index}, {location} FROM {items} {join} {t} r ON r.key = {item_key}"),
        many_at=(
            f"SELECT {index}, {location}, r.key FROM {items} {join} {at} r "
            f"ON r.shard_id = {item_at[0]} AND r.ordinal = {item_at[1]}"
        ),
        member_by_key=(
            f'SELECT r.shard_id, m."offset", m.length, m.extents, m.crc FROM {t} r '
            f"JOIN {members} m ON m.shard_id = r.shard_id AND m.ordinal = r.ordinal "
            "WHERE r.key = ? AND m.name = ?"
        ),
        members_by_key=(
            f'SELECT r.shard_id, m.name, m."offset", m.length FROM {t} r '
            f"JOIN {members} m ON m.shard_id = r.shard_id AND m.ordinal = r.ordinal "
            'WHERE r.key = ? ORDER BY m."offset"'
        ),
        keys_of_shard=f"SELECT r.key FROM {at} r WHERE r.shard_id = ? ORDER BY r.ordinal",
        records_of_shard=(
            f'SELECT r."offset", r.length, r.extents, r.item, r.crc, r.key FROM {at} r '
            'WHERE r.shard_id = ? ORDER BY r."offset"'
        ),
        members_of_shard=(
            f'SELECT m."offset", m.length, m.extents, NULL, m.crc, r.key FROM {members} m '
            f"JOIN {at} r ON r.shard_id = m.shard_id AND r.ordinal = m.ordinal "
            'WHERE m.shard_id = ? ORDER BY m."offset"'
        ),
        page_of_records=(
            f'SELECT r.ordinal, r.key, r."offset", r.length FROM {at} r '
            "WHERE r.shard_id = ? AND r.ordinal >= ? ORDER BY r.ordinal LIMIT ?"
        ),
        page_of_members=(
            f'SELECT m.ordinal, r.key, m.name, m."offset", m.length FROM {members} m '
            f"JOIN {at} r ON r.shard_id = m.shard_id AND r.ordinal = m.ordinal "
            "WHERE m.shard_id = ? AND m.ordinal >= ? AND m.ordinal < ? "
            'ORDER BY m.ordinal, m."offset"'
        ),
        # members of records (formats whose records have parts):
        # (batch index, name, offset, length, extents, crc), in file order
        members_at=(
            f'SELECT {index}, m.name, m."offset", m.length, m.extents, m.crc FROM {items} '
            f"{join} {members} m ON m.shard_id = {item_at[0]} "
            f'AND m.ordinal = {item_at[1]} ORDER BY m."offset"'
        ),
    )


_SHARDS = (
    "SELECT s.id, s.path, s.first_position, s.num_records, s.compression, s.generation, "
    "s.size, s.mtime_ns, s.ino, s.ctime_ns, s.fingerprint, x.donor_id FROM shardcat_shards s "
    "LEFT JOIN shardcat_shares x ON x.shard_id = s.id "
    "WHERE s.dataset_id = ? AND s.generation IS NOT NULL ORDER BY s.path"
)
_VERSION = "SELECT version FROM shardcat_datasets WHERE id = ?"
_OPTIONS = "SELECT options FROM shardcat_datasets WHERE id = ?"
# (a shard read by reference: the donor's shard's, see records_source)
_SEEK_INDEX = (
    "SELECT i.data FROM shardcat_shards s LEFT JOIN shardcat_shares x ON x.shard_id = s.id "
    "JOIN shardcat_seek_indexes i ON i.shard_id = coalesce(x.donor_shard_id, s.id) "
    "WHERE s.id = ? AND s.generation = ?"
)


def _batch(
    conn: ReadConnection, sql: str, items: Sequence[Any], params: tuple[Any, ...]
) -> list[Row]:
    """Run a ``json_each`` batch query over ``items`` looked up in sorted order; each
    row's first column is the index of its item in ``items``."""
    order = sorted(range(len(items)), key=items.__getitem__)
    rows = conn.execute(sql, (json.dumps([items[i] for i in order]), *params)).fetchall()
    return [(order[r[0]], *r[1:]) for r in rows]


def record_by_key(conn: ReadConnection, sql: RecordStatements, key: str) -> Row | None:
    """The record row of one key (batch index 0), or None."""
    row: Row | None = conn.execute(sql.by_key, (key,)).fetchone()
    return row


def records_by_key(conn: ReadConnection, sql: RecordStatements, keys: Sequence[str]) -> list[Row]:
    """Record rows of the keys found (batch index: the key's place in ``keys``)."""
    return _batch(conn, sql.many_by_key, keys, ())


def records_at(
    conn: ReadConnection, sql: RecordStatements, pairs: Sequence[tuple[int, int]]
) -> list[Row]:
    """Record rows (key last) of ``(shard_id, ordinal)`` pairs, one query."""
    return _batch(conn, sql.many_at, pairs, ())


def members_at(
    conn: ReadConnection, sql: RecordStatements, pairs: Sequence[tuple[int, int]]
) -> list[Row]:
    """``(batch index, name, offset, length, extents, crc)`` of the members of the
    records at ``(shard_id, ordinal)`` pairs, in file order."""
    rows: list[Row] = conn.execute(sql.members_at, (json.dumps(list(pairs)),)).fetchall()
    return rows


def member_by_key(
    conn: ReadConnection, sql: RecordStatements, key: str, name: str
) -> tuple[int, int, int, str | None, int | None] | None:
    """``(shard_id, offset, length, extents, crc)`` of one member of one record, or None."""
    row: tuple[int, int, int, str | None, int | None] | None = conn.execute(
        sql.member_by_key, (key, name)
    ).fetchone()
    return row


def members_by_key(conn: ReadConnection, sql: RecordStatements, key: str) -> list[Row]:
    """``(shard_id, name, offset, length)`` of every member of one record."""
    rows: list[Row] = conn.execute(sql.members_by_key, (key,)).fetchall()
    return rows


def shards(conn: ReadConnection, dataset_id: int) -> list[Row]:
    """The shards with an indexed version, in position order: ``(id, path,
    first_position, num_records, compression, generation, size, mtime_ns, ino,
    ctime_ns, fingerprint, donor)`` (``donor``: the dataset whose rows the shard is
    read from by reference, see :func:`records_source`; None: its own)."""
    rows: list[Row] = conn.execute(_SHARDS, (dataset_id,)).fetchall()
    return rows


def dataset_version(conn: ReadConnection, dataset_id: int) -> int | None:
    """The dataset's ``version`` (None: the dataset was dropped)."""
    row = conn.execute(_VERSION, (dataset_id,)).fetchone()
    return None if row is None else int(row[0])


def dataset_options(conn: ReadConnection, dataset_id: int) -> dict[str, Any]:
    options: dict[str, Any] = json.loads(conn.execute(_OPTIONS, (dataset_id,)).fetchone()[0])
    return options


def seek_index(conn: ReadConnection, shard_id: int, generation: int) -> bytes | None:
    """The stored seek points of one indexed version of a compressed shard."""
    row = conn.execute(_SEEK_INDEX, (shard_id, generation)).fetchone()
    return None if row is None else bytes(row[0])


def keys_of_shard(conn: ReadConnection, sql: RecordStatements, shard_id: int) -> list[str]:
    return [key for (key,) in conn.execute(sql.keys_of_shard, (shard_id,)).fetchall()]


def records_of_shard(
    conn: ReadConnection, sql: RecordStatements, shard_id: int, parts: bool
) -> list[Row]:
    """``(offset, length, extents, item, crc, key)`` of every record of a shard (of
    every member, for formats whose records have parts), in file order."""
    rows: list[Row] = conn.execute(
        sql.members_of_shard if parts else sql.records_of_shard, (shard_id,)
    ).fetchall()
    return rows


def page_of_records(
    conn: ReadConnection, sql: RecordStatements, shard_id: int, start: int, size: int
) -> list[Row]:
    """``(ordinal, key, offset, length)`` of up to ``size`` records from ordinal ``start``."""
    rows: list[Row] = conn.execute(sql.page_of_records, (shard_id, start, size)).fetchall()
    return rows


def page_of_members(
    conn: ReadConnection, sql: RecordStatements, shard_id: int, start: int, stop: int
) -> list[Row]:
    """``(ordinal, key, name, offset, length)`` of the members of ordinals ``start``
    to ``stop`` (exclusive), by ordinal then file order."""
    rows: list[Row] = conn.execute(sql.page_of_members, (shard_id, start, stop)).fetchall()
    return rows
