"""The records an ingest set aside instead of failing their shard (ingest with
``on_bad_record="skip"``; table ``shardcat_bad_records``, schema version 8): read
back as :class:`SetAside` objects."""

from __future__ import annotations

from dataclasses import dataclass

from shardcat.catalog.lookup import ReadConnection

__all__ = ["SetAside", "bad_records_of"]


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
    'SELECT s.path, b."offset", b.length, b.reason, b.key FROM shardcat_shards s '
    "LEFT JOIN shardcat_shares x ON x.shard_id = s.id "  # (read by reference: the donor's)
    "JOIN shardcat_bad_records b ON b.shard_id = coalesce(x.donor_shard_id, s.id) "
    'WHERE s.dataset_id = ? ORDER BY s.path, b."offset"'
)


def bad_records_of(conn: ReadConnection, dataset_id: int) -> list[SetAside]:
    """Every record the dataset's shards set aside, by shard path then offset."""
    return [SetAside(*row) for row in conn.execute(_BAD, (dataset_id,)).fetchall()]
