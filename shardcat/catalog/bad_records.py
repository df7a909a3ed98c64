"""The records an ingest set aside instead of failing their shard (ingest with
``on_bad_record="skip"``; table ``shardcat_bad_records``, schema version 7): read
back as :class:`SetAside` objects, and the key of the catalog row at a byte offset
(what ``catalog verify`` names a bad record by)."""

from __future__ import annotations

from dataclasses import dataclass

from shardcat.catalog.lookup import ReadConnection
from shardcat.catalog.schema import records_table_name

__all__ = ["SetAside", "bad_records_of", "key_at"]


@dataclass(frozen=True)
class SetAside:
    """One record set aside at ingest: its shard (the path as stored), where it starts
    (``offset``), the bytes set aside from there (``length``, None when unknown), why
    (``reason``) and its key when it could be read (else None)."""

    shard: str
    offset: int
    length: int | None
    reason: str
    key: str | None


_BAD = (
    'SELECT s.path, b."offset", b.length, b.reason, b.key FROM shardcat_bad_records b '
    'JOIN shardcat_shards s ON s.id = b.shard_id WHERE s.dataset_id = ? ORDER BY s.path, b."offset"'
)


def bad_records_of(conn: ReadConnection, dataset_id: int) -> list[SetAside]:
    """Every record the dataset's shards set aside, by shard path then offset."""
    return [SetAside(*row) for row in conn.execute(_BAD, (dataset_id,)).fetchall()]


def key_at(
    conn: ReadConnection,
    dataset_id: int,
    shard_id: int,
    offset: int,
    *,
    parts: bool,
    by_position: bool,
) -> str | None:
    """The key of the shard's record at byte ``offset``: the record starting there,
    or, for records made of members (``parts``), the one whose member's data starts
    there or right after a header block there. For a dataset keyed by position, its
    position. None when no record is there."""
    table = records_table_name(dataset_id)
    if parts:
        where = (
            "EXISTS (SELECT 1 FROM shardcat_members m WHERE m.shard_id = r.shard_id AND "
            'm.ordinal = r.ordinal AND m."offset" IN (?, ?))'
        )
        params: tuple[int, ...] = (shard_id, offset, offset + 512)
    else:
        where, params = 'r."offset" = ?', (shard_id, offset)
    row = conn.execute(
        f"SELECT r.key, s.first_position + r.ordinal FROM {table} r JOIN shardcat_shards s "
        f"ON s.id = r.shard_id WHERE r.shard_id = ? AND {where} LIMIT 1",
        params,
    ).fetchone()
    if row is None:
        return None
    return str(row[1]) if by_position else str(row[0])
