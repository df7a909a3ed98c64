"""A shard's commit: its records, members, field values, identity and ``ready``
state in one transaction, replacing the version it had.

The store receives the entries a format's scan produced (objects with ``key``,
``offset``, ``length``, ``extents``, ``item``, ``fields`` and ``members``, see
:class:`Entry`); it never scans. The commit increments the shard's
``generation`` and the dataset's ``version`` (what open readers watch) and
recomputes positions, so a reader never sees half a shard.

**Duplicate keys** (``on_duplicate``): ``error`` fails the shard; ``first`` /
``last`` keep one record per key in position order (shard path, then record
order); the records dropped that way are counted (:data:`~shardcat.catalog.sync.DROPPED`).
"""

from __future__ import annotations

import json
import operator
import os
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
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
    "Entry",
    "IngestJob",
    "catalog_error",
    "commit_shard",
    "dedupe_within",
]

DUPLICATE_POLICIES = ("error", "first", "last")


class Entry(Protocol):
    """What the store needs of one scanned record (a format's ``Entry``)."""

    key: str | None
    offset: int
    length: int
    extents: Sequence[Sequence[int]] | None
    item: int | None
    fields: Mapping[str, Any]
    members: Sequence[tuple[Any, ...]]


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


def dedupe_within(entries: list[Entry], path: str, policy: str) -> list[Entry]:
    distinct = set(map(_key, entries))
    if len(distinct) == len(entries) or distinct == {None}:  # the common case, at C speed
        return entries
    winner: dict[str, int] = {}
    for i, e in enumerate(entries):
        if e.key is None:
            continue
        j = winner.get(e.key)
        if j is None or policy == "last":
            winner[e.key] = i
        elif policy == "error":
            raise DuplicateKeyError(
                f"duplicate key {e.key!r} in {path}: records at bytes {entries[j].offset} "
                f"and {e.offset} (use on_duplicate='first' or 'last' to keep one)"
            )
    return [e for i, e in enumerate(entries) if e.key is None or winner[e.key] == i]


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
    conn: Connection, job: IngestJob, stored: str, entries: list[Entry]
) -> tuple[list[Entry], dict[str, int]]:
    """Settle keys this shard shares with shards already committed: the entries to
    insert, and how many records each other shard (by path) lost to this one."""
    clash = conflicts(conn, job.dataset_id, [e.key for e in entries if e.key is not None])
    if not clash:
        return entries, {}
    if job.on_duplicate == "error":
        key, (_, other, _, other_offset) = next(iter(clash.items()))
        mine = next(e.offset for e in entries if e.key == key)
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
    return [e for e in entries if e.key is None or new_wins.get(e.key, True)], dict(lost)


def insert_fields(conn: Connection, job: IngestJob, shard_id: int, entries: list[Entry]) -> None:
    """One row per record in the dataset's field table, adding columns for new fields
    (and for the fields the format declares every dataset has, NULL where absent)."""
    types = dict(job.field_types)
    for e in entries:
        for name, value in e.fields.items():
            if name not in types and value is not None:
                types[name] = field_store.sql_type_of(value)
    cols = field_store.ensure_field_columns(conn, job.dataset_id, job.dataset_name, types)
    values = {f"v{cols[name][2]}": [e.fields.get(name) for e in entries] for name in cols}
    insert_columns(
        conn,
        schema.field_table_name(job.dataset_id),
        {"shard_id": shard_id, "ordinal": range(len(entries)), **values},
    )


def insert_records(conn: Connection, job: IngestJob, shard_id: int, entries: list[Entry]) -> None:
    n = len(entries)
    columns: dict[str, Any] = {
        "dataset_id": job.dataset_id,
        # position keys are placeholders: a position is first_position + ordinal
        "key": (
            [f"#{shard_id}:{i}" for i in range(n)]
            if job.key_rule == "position"
            else [*map(_key, entries)]
        ),
        "shard_id": shard_id,
        "ordinal": range(n),
        "offset": [*map(_offset, entries)],
        "length": [*map(_length, entries)],
    }
    # locations of more than one plain range (schema version 5): only when some have them
    extents = [*map(_extents, entries)]
    items = [*map(_item, entries)]
    several = any(e is not None for e in extents) or any(i is not None for i in items)
    if several and job.one_range:
        raise CatalogError(
            f"format {job.format} declares every record one byte range (ONE_RANGE), "
            "but its scan gave locations with extents or items: refusing to index them"
        )
    if any(e is not None for e in extents):
        columns["extents"] = [
            None if e is None else json.dumps([list(p) for p in e]) for e in extents
        ]
    if any(i is not None for i in items):
        columns["item"] = items
    insert_columns(conn, schema.records.name, columns)


_key, _offset, _length, _extents, _item = (
    operator.attrgetter(a) for a in ("key", "offset", "length", "extents", "item")
)


def commit_shard(
    conn: Connection,
    job: IngestJob,
    shard_id: int,
    stored: str,
    entries: list[Entry],
    st: os.stat_result,
    fp: str,
    compression: str | None = None,
    seek_index: tuple[str, bytes] | None = None,
    dropped: int = 0,
) -> tuple[int, int]:
    """Replace the shard's indexed version with ``entries``; returns the records
    committed and the records dropped as duplicates (``dropped`` of them within the
    shard already, before this call)."""
    clear_shards(conn, job.dataset_id, [shard_id])  # the version this one replaces
    lost: dict[str, int] = {}
    try:
        with conn.begin_nested():
            insert_records(conn, job, shard_id, entries)
    except IntegrityError:  # keys already in other shards: settle them, then insert
        before = len(entries)
        entries, lost = resolve_across(conn, job, stored, entries)
        dropped += before - len(entries)
        insert_records(conn, job, shard_id, entries)
    note_dropped(conn, job.dataset_id, {stored: dropped}, lost)
    members = [(i, *member) for i, e in enumerate(entries) for member in e.members]
    if members:  # tar samples: one row per member
        ordinal = [m[0] for m in members]
        columns: dict[str, Any] = {
            "shard_id": shard_id,
            "ordinal": ordinal,
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
        insert_fields(conn, job, shard_id, entries)
    s = schema.shards
    conn.execute(
        update(s)
        .where(s.c.id == shard_id)
        .values(
            state="ready",
            generation=func.coalesce(s.c.generation, 0) + 1,
            num_records=len(entries),
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
    return len(entries), dropped + sum(lost.values())
