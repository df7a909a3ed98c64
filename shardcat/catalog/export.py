"""The rows an export of a dataset reads: its shards in path order, and each
shard's records and members in file order (``catalog export-index`` turns
them into DALI index files: :mod:`shardcat.facade.export`)."""

from __future__ import annotations

from typing import Any

from shardcat.catalog.lookup import ReadConnection

__all__ = ["members_of", "records_of", "shards_of"]

# a shard read by reference (catalog/shares.py) names the donor's shard and dataset
# its rows are under
_SHARDS = (
    "SELECT coalesce(x.donor_shard_id, s.id), s.path, s.state, s.size, s.mtime_ns, "
    "s.compression, s.first_position, coalesce(x.donor_id, s.dataset_id) "
    "FROM shardcat_shards s JOIN shardcat_datasets d ON d.id = s.dataset_id "
    "LEFT JOIN shardcat_shares x ON x.shard_id = s.id WHERE d.name = ? ORDER BY s.path"
)
_RECORDS = (
    'SELECT key, ordinal, "offset", length FROM "shardcat_records_{}" WHERE shard_id = ? '
    "ORDER BY ordinal"
)
_MEMBERS = (
    'SELECT ordinal, name, "offset", length, extents FROM shardcat_members WHERE shard_id = ? '
    'ORDER BY ordinal, "offset"'
)


def shards_of(conn: ReadConnection, dataset: str) -> list[Any]:
    """``(id, stored path, state, size, mtime_ns, compression, first_position,
    dataset_id)`` of every shard of ``dataset``, in path order (``id`` and
    ``dataset_id``: where its rows are, the donor's for a shard read by reference)."""
    return conn.execute(_SHARDS, (dataset,)).fetchall()


def records_of(conn: ReadConnection, dataset_id: int, shard_id: int) -> list[Any]:
    """``(key, ordinal, offset, length)`` of every record of a shard, in file order."""
    return conn.execute(_RECORDS.format(int(dataset_id)), (shard_id,)).fetchall()


def members_of(conn: ReadConnection, shard_id: int) -> list[Any]:
    """``(ordinal, name, offset, length, extents)`` of every member of a shard."""
    return conn.execute(_MEMBERS, (shard_id,)).fetchall()
