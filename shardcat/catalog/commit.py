"""A shard's commit: its records, members, field values, identity and ``ready``
state in one transaction, replacing the version it had.

The store receives what a format's scan produced, column by column (keys,
offsets, lengths, fields, members, extents, items: see :class:`Batch`); it
never scans. The commit increments the shard's
``generation`` and the dataset's ``version`` (what open readers watch) and
recomputes positions, so a reader never sees half a shard.

**Duplicate keys** (``on_duplicate``): ``error`` fails the shard; ``first`` /
``last`` keep one record per key in position order (shard path, then record
order); the records dropped that way are counted (:data:`~shardcat.catalog.sync.DROPPED`).
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import Connection, delete, func, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from shardcat.catalog import fields as field_store
from shardcat.catalog import schema
from shardcat.catalog.bulk import insert_columns
from shardcat.catalog.claims import DEFAULT_LEASE
from shardcat.catalog.sync import bump_version, clear_shards, note_dropped, recompute_positions
from shardcat.errors import CatalogError, DuplicateKeyError

__all__ = [
    "DUPLICATE_POLICIES",
    "Batch",
    "IngestJob",
    "catalog_error",
    "commit_shard",
    "dedupe_within",
]

DUPLICATE_POLICIES = ("error", "first", "last")


class Batch(Protocol):
    """What the store needs of one scanned shard: its records column by column
    (a format's :class:`~shardcat.readers.formats.Columns`)."""

    keys: list[str | None]
    offsets: list[int]
    lengths: list[int]
    fields: dict[str, list[Any]]
    members: list[tuple[Any, ...]]
    extents: list[Any] | None
    items: list[int | None] | None

    def __len__(self) -> int: ...

    def select(self, keep: Sequence[int]) -> Batch: ...


@dataclass(frozen=True)
class IngestJob:
    """What an indexing process needs to know of its dataset; small and picklable.

    ``format`` and ``options`` are the dataset's as stored (the store keeps them
    for the scan, never reads them but the ``fields`` flag); ``key_rule``
    ``"position"`` keys records by position; ``field_types`` are the SQL columns
    every record of the dataset has (NULL where absent).
    """

    catalog: str
    catalog_dir: str
    dataset_id: int
    dataset_name: str
    format: str
    options: dict[str, Any]
    key_rule: str
    field_types: dict[str, str] = field(default_factory=dict)
    on_duplicate: str = "error"
    lease: float = DEFAULT_LEASE
    #: the format says every record is one byte range: readers look up offset and
    #: length only, so a record with extents or an item would be read wrong
    one_range: bool = False


def catalog_error(catalog: str, exc: SQLAlchemyError) -> CatalogError:
    """A database failure while writing the catalog (disk full, I/O error, locked)
    as one clear error; what was committed before stays."""
    orig = getattr(exc, "orig", None) or exc
    return CatalogError(f"cannot write the catalog {catalog}: {orig}")


def dedupe_within(batch: Batch, path: str, policy: str) -> Batch:
    keys = batch.keys
    distinct = set(keys)
    if len(distinct) == len(keys) or distinct == {None}:  # the common case, at C speed
        return batch
    winner: dict[str, int] = {}
    for i, key in enumerate(keys):
        if key is None:
            continue
        j = winner.get(key)
        if j is None or policy == "last":
            winner[key] = i
        elif policy == "error":
            raise DuplicateKeyError(
                f"duplicate key {key!r} in {path}: records at bytes {batch.offsets[j]} "
                f"and {batch.offsets[i]} (use on_duplicate='first' or 'last' to keep one)"
            )
    return batch.select([i for i, key in enumerate(keys) if key is None or winner[key] == i])


def remove_ordinals(conn: Connection, dataset_id: int, shard_id: int, removed: list[int]) -> None:
    """Delete a shard's records at these ordinals and renumber the rest without gaps.

    Rows between the i-th and the next removed ordinal move down by i: one UPDATE
    per gap, so every row moves once however many are removed. Moved rows are
    negated on the way (then flipped back) so the unique (shard_id, ordinal)
    never sees a collision.
    """
    removed = sorted(removed)
    ftable = conn.dialect.identifier_preparer.quote_identifier(schema.field_table_name(dataset_id))
    for table in (schema.records.name, schema.members.name, ftable):
        conn.exec_driver_sql(
            f"DELETE FROM {table} "
            "WHERE shard_id = ? AND ordinal IN (SELECT value FROM json_each(?))",
            (shard_id, json.dumps(removed)),
        )
        for shift, (low, high) in enumerate(zip(removed, [*removed[1:], None], strict=True), 1):
            conn.exec_driver_sql(
                f"UPDATE {table} SET ordinal = -(ordinal - ?) - 1 "
                "WHERE shard_id = ? AND ordinal > ? AND (? IS NULL OR ordinal < ?)",
                (shift, shard_id, low, high, high),
            )
        conn.exec_driver_sql(
            f"UPDATE {table} SET ordinal = -ordinal - 1 WHERE shard_id = ? AND ordinal < 0",
            (shard_id,),
        )


def conflicts(
    conn: Connection, dataset_id: int, keys: list[str]
) -> dict[str, tuple[int, str, int, int]]:
    """key -> (shard_id, shard path, ordinal, offset) of keys already in the dataset."""
    r, s = schema.records, schema.shards
    found = {}
    for i in range(0, len(keys), 500):
        rows = conn.execute(
            select(r.c.key, r.c.shard_id, s.c.path, r.c.ordinal, r.c.offset)
            .join(s, s.c.id == r.c.shard_id)
            .where(r.c.dataset_id == dataset_id, r.c.key.in_(keys[i : i + 500]))
        )
        for row in rows:
            found[row.key] = (row.shard_id, row.path, row.ordinal, row.offset)
    return found


def resolve_across(
    conn: Connection, job: IngestJob, stored: str, batch: Batch
) -> tuple[Batch, dict[str, int]]:
    """Settle keys this shard shares with shards already committed: the records to
    insert, and how many records each other shard (by path) lost to this one."""
    clash = conflicts(conn, job.dataset_id, [k for k in batch.keys if k is not None])
    if not clash:
        return batch, {}
    if job.on_duplicate == "error":
        key, (_, other, _, other_offset) = next(iter(clash.items()))
        mine = batch.offsets[batch.keys.index(key)]
        more = f" ({len(clash) - 1} more keys are duplicated too)" if len(clash) > 1 else ""
        raise DuplicateKeyError(
            f"duplicate key {key!r}: in {other} at byte {other_offset} and in {stored} at "
            f"byte {mine}{more} (use on_duplicate='first' or 'last' to keep one)"
        )
    # "first"/"last" mean first/last in position order, i.e. by shard path.
    new_wins = {
        key: (stored < other) == (job.on_duplicate == "first")
        for key, (_, other, _, _) in clash.items()
    }
    losers: dict[int, list[int]] = defaultdict(list)
    lost: dict[str, int] = defaultdict(int)
    for key, wins in new_wins.items():
        if wins:
            shard_id, other, ordinal, _ = clash[key]
            losers[shard_id].append(ordinal)
            lost[other] += 1
    s = schema.shards
    for shard_id, ordinals in losers.items():
        remove_ordinals(conn, job.dataset_id, shard_id, ordinals)
        conn.execute(
            update(s).where(s.c.id == shard_id).values(num_records=s.c.num_records - len(ordinals))
        )
    keep = [i for i, k in enumerate(batch.keys) if k is None or new_wins.get(k, True)]
    return batch.select(keep), dict(lost)


def insert_fields(conn: Connection, job: IngestJob, shard_id: int, batch: Batch) -> None:
    """One row per record in the dataset's field table, adding columns for new fields
    (and for the fields the format declares every dataset has, NULL where absent)."""
    types = dict(job.field_types)
    for name, values in batch.fields.items():
        if name not in types:
            first = next((v for v in values if v is not None), None)
            if first is not None:
                types[name] = field_store.sql_type_of(first)
    cols = field_store.ensure_field_columns(conn, job.dataset_id, job.dataset_name, types)
    n = len(batch)
    columns: dict[str, Any] = {"shard_id": shard_id, "ordinal": range(n)}
    for name in cols:
        columns[f"v{cols[name][2]}"] = batch.fields.get(name) or [None] * n
    insert_columns(conn, schema.field_table_name(job.dataset_id), columns)


def insert_records(conn: Connection, job: IngestJob, shard_id: int, batch: Batch) -> None:
    n = len(batch)
    columns: dict[str, Any] = {
        "dataset_id": job.dataset_id,
        # position keys are placeholders: a position is first_position + ordinal
        "key": (
            [f"#{shard_id}:{i}" for i in range(n)] if job.key_rule == "position" else batch.keys
        ),
        "shard_id": shard_id,
        "ordinal": range(n),
        "offset": batch.offsets,
        "length": batch.lengths,
    }
    # locations of more than one plain range (schema version 5): only when some have them
    extents = batch.extents if batch.extents and any(e is not None for e in batch.extents) else None
    items = batch.items if batch.items and any(i is not None for i in batch.items) else None
    if (extents or items) and job.one_range:
        raise CatalogError(
            f"format {job.format} declares every record one byte range (ONE_RANGE), "
            "but its scan gave locations with extents or items: refusing to index them"
        )
    if extents:
        columns["extents"] = [
            None if e is None else json.dumps([list(p) for p in e]) for e in extents
        ]
    if items:
        columns["item"] = items
    insert_columns(conn, schema.records.name, columns)


def commit_shard(
    conn: Connection,
    job: IngestJob,
    shard_id: int,
    stored: str,
    batch: Batch,
    st: os.stat_result,
    fp: str,
    compression: str | None = None,
    seek_index: tuple[str, bytes] | None = None,
    dropped: int = 0,
) -> tuple[int, int]:
    """Replace the shard's indexed version with ``batch``; returns the records
    committed and the records dropped as duplicates (``dropped`` of them within the
    shard already, before this call)."""
    clear_shards(conn, job.dataset_id, [shard_id])  # the version this one replaces
    lost: dict[str, int] = {}
    try:
        with conn.begin_nested():
            insert_records(conn, job, shard_id, batch)
    except IntegrityError:  # keys already in other shards: settle them, then insert
        before = len(batch)
        batch, lost = resolve_across(conn, job, stored, batch)
        dropped += before - len(batch)
        insert_records(conn, job, shard_id, batch)
    note_dropped(conn, job.dataset_id, {stored: dropped}, lost)
    members = batch.members
    if members:  # tar samples: one row per member
        columns: dict[str, Any] = {
            "shard_id": shard_id,
            "ordinal": [m[0] for m in members],
            "name": [m[1] for m in members],
            "offset": [m[2] for m in members],
            "length": [m[3] for m in members],
        }
        if any(len(m) > 4 for m in members):  # pieces of sparse members (see schema)
            columns["extents"] = [
                json.dumps([list(p) for p in m[4]]) if len(m) > 4 and m[4] else None
                for m in members
            ]
        insert_columns(conn, schema.members.name, columns)
    if job.options.get("fields", True):  # without fields the view reads records alone
        insert_fields(conn, job, shard_id, batch)
    s = schema.shards
    conn.execute(
        update(s)
        .where(s.c.id == shard_id)
        .values(
            state="ready",
            generation=func.coalesce(s.c.generation, 0) + 1,
            num_records=len(batch),
            size=st.st_size,
            mtime_ns=st.st_mtime_ns,
            ino=st.st_ino,
            ctime_ns=st.st_ctime_ns,
            fingerprint=fp,
            compression=compression,
            claim_owner=None,
            claimed_at=None,
            error=None,
            indexed_at=time.time(),
        )
    )
    # Seek points of a compressed shard commit with its records (schema version 2).
    conn.execute(delete(schema.seek_indexes).where(schema.seek_indexes.c.shard_id == shard_id))
    if seek_index is not None:
        conn.execute(
            schema.seek_indexes.insert().values(
                shard_id=shard_id, kind=seek_index[0], data=seek_index[1]
            )
        )
    bump_version(conn, job.dataset_id)
    recompute_positions(conn, job.dataset_id)
    return len(batch), dropped + sum(lost.values())
