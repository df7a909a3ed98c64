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

**Checks** (``crc``): a record's is its payload's CRC32C as the scan gave it,
mixed (XOR) with the CRC32C of its key (:func:`keyed_check`), so an index entry
that names another record's row fails the read by key; records keyed by
position keep the payload's.

**Bad records** (``on_bad_record="skip"``): the records the scan set aside
(``Batch.bad``) replace the shard's earlier ones in ``bad_records`` in the same
transaction; a good re-index leaves none.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import crc32c as _crc32c
from sqlalchemy import Connection, Engine, delete, func, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from shardcat.catalog import schema, shares, tables
from shardcat.catalog.backend import dialect_of, run
from shardcat.catalog.bulk import insert_columns
from shardcat.catalog.claims import DEFAULT_LEASE, ClaimedShard
from shardcat.catalog.names import BAD_RECORD_POLICIES, DUPLICATE_POLICIES
from shardcat.catalog.sync import bump_version, clear_shards, note_dropped, recompute_positions
from shardcat.errors import KEEP_ONE, CatalogError, DuplicateKeyError

__all__ = [
    "BAD_RECORD_POLICIES",
    "DUPLICATE_POLICIES",
    "Batch",
    "IngestJob",
    "ShardVersion",
    "catalog_error",
    "commit_shard",
    "dedupe_within",
    "defer_key_index",
    "finish_key_index",
]


class Batch(Protocol):
    """What the store needs of one scanned shard: its records column by column
    (a format's :class:`~shardcat.formats.base.Columns`)."""

    keys: list[str | None]
    offsets: list[int]
    lengths: list[int]
    fields: dict[str, list[Any]]
    members: list[tuple[Any, ...]]
    extents: list[Any] | None
    items: list[int | None] | None
    checks: list[int | None] | None
    #: records the scan set aside (``offset``, ``length``, ``reason``, ``key`` each)
    bad: list[Any]

    def __len__(self) -> int: ...

    def select(self, keep: Sequence[int]) -> Batch: ...

    def keyed_checks(self) -> list[int | None] | None:
        """``checks``, each mixed with its record's key (see :func:`keyed_check`)."""


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
    #: ``raise`` (a bad record fails its shard) or ``skip`` (set aside: see ``Batch.bad``)
    on_bad_record: str = "raise"


@dataclass(frozen=True)
class ShardVersion:
    """One scanned version of a shard as its commit writes it: the records (``batch``),
    the file's identity when it was scanned (``stat``, ``fingerprint``), its
    compression and stored seek points (``seek_index``: kind and bytes), and
    ``dropped``, the records already dropped as duplicate keys within the shard."""

    batch: Batch
    stat: os.stat_result
    fingerprint: str
    compression: str | None = None
    seek_index: tuple[str, bytes] | None = None
    dropped: int = 0


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
                f"and {batch.offsets[i]}",
                hint=KEEP_ONE,
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
    shares.release(conn, dataset_id, [shard_id])
    among, listed = dialect_of(conn).any_of("ordinal", removed)
    for table in (schema.records_table_name(dataset_id), schema.members.name):
        run(conn, f"DELETE FROM {table} WHERE shard_id = ? AND {among}", (shard_id, listed))
        shift_sql = (
            f"UPDATE {table} SET ordinal = -(ordinal - ?) - 1 "
            "WHERE shard_id = ? AND ordinal > ? AND ordinal < ?"
        )
        for shift, (low, high) in enumerate(zip(removed, [*removed[1:], None], strict=True), 1):
            # (the last gap runs to the end: any ordinal below the largest possible)
            run(conn, shift_sql, (shift, shard_id, low, 2**62 if high is None else high))
        run(
            conn,
            f"UPDATE {table} SET ordinal = -ordinal - 1 WHERE shard_id = ? AND ordinal < 0",
            (shard_id,),
        )


def conflicts(
    conn: Connection, dataset_id: int, keys: list[str]
) -> dict[str, tuple[int, str, int, int]]:
    """key -> (shard_id, shard path, ordinal, offset) of keys already in the dataset."""
    table = schema.records_table_name(dataset_id)
    found = {}
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        among, listed = dialect_of(conn).any_of("r.key", chunk)
        rows = run(
            conn,
            f'SELECT r.key, r.shard_id, s.path, r.ordinal, r."offset" FROM {table} r '
            f"JOIN shardcat_shards s ON s.id = r.shard_id WHERE {among}",
            (listed,),
        )
        for row in rows:
            found[row[0]] = (row[1], row[2], row[3], row[4])
    return found


def _across(key: str, other: str, other_offset: int, stored: str, mine: int, more: int) -> str:
    """The message for a key held by two shards (its hint: ``KEEP_ONE``)."""
    also = f" ({more} more keys are duplicated too)" if more else ""
    return (
        f"duplicate key {key!r}: in {other} at byte {other_offset} and in {stored} at "
        f"byte {mine}{also}"
    )


def resolve_across(
    conn: Connection, job: IngestJob, stored: str, batch: Batch
) -> tuple[Batch, dict[str, int]]:
    """Settle keys this shard shares with shards already committed: the records to
    insert, and how many records each other shard (by path) lost to this one."""
    clash = conflicts(conn, job.dataset_id, [k for k in batch.keys if k is not None])
    if not clash:
        return batch, {}
    if job.on_duplicate == "error":  # named: the shard's first record with a taken key
        at = next(i for i, k in enumerate(batch.keys) if k in clash)
        key = batch.keys[at]
        assert key is not None
        _, other, _, other_offset = clash[key]
        mine = batch.offsets[at]
        why = _across(key, other, other_offset, stored, mine, len(clash) - 1)
        raise DuplicateKeyError(why, hint=KEEP_ONE)
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


def keyed_check(check: int | None, key: str | None) -> int | None:
    """The check the catalog stores for a record (or member) whose payload's CRC32C
    is ``check``: XOR the CRC32C of its key (UTF-8, surrogateescape); unchanged
    without a key or a check. (Reads mix the same: ``formats.checks.key_check``;
    a shard's records at once: ``Batch.keyed_checks``.)"""
    if check is None or key is None:
        return check
    return check ^ _crc32c.crc32c(key.encode("utf-8", "surrogateescape"))


def insert_records(conn: Connection, job: IngestJob, shard_id: int, batch: Batch) -> None:
    """The shard's rows in the dataset's records table, fields included, adding
    columns for new fields (and for the fields the format declares every dataset
    has, NULL where absent)."""
    n = len(batch)
    columns: dict[str, Any] = {
        "shard_id": shard_id,
        "ordinal": range(n),
        # position keys are placeholders: a position is first_position + ordinal
        "key": [f"#{shard_id}:{i}" for i in range(n)] if job.key_rule == "position" else batch.keys,
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
    if batch.checks is not None:  # each record's check (schema version 7)
        columns["crc"] = batch.checks if job.key_rule == "position" else batch.keyed_checks()
    if job.options.get("fields", True):  # without fields the records have no field columns
        types = dict(job.field_types)
        for name in sorted(batch.fields):  # new columns in name order, whatever the scan's
            values = batch.fields[name]
            if name not in types:
                first = next((v for v in values if v is not None), None)
                if first is not None:
                    types[name] = tables.sql_type_of(first)
        cols = tables.ensure_field_columns(conn, job.dataset_id, job.dataset_name, types)
        keeps_nul = dialect_of(conn).text_holds_nul
        for name in cols:
            column = batch.fields.get(name)
            if column is not None and any(v is not None for v in column):
                if not keeps_nul and cols[name][1] == "text":  # (PostgreSQL's text)
                    column = [None if isinstance(v, str) and "\x00" in v else v for v in column]
                columns[f"v{cols[name][2]}"] = column
    # Into a key index, in key order: it takes the shard's keys in one sweep. Without
    # one (a first ingest builds it last), in ordinal order: the table's own.
    order = "key" if tables.has_key_index(conn, job.dataset_id) else None
    if order is not None:
        dialect_of(conn).keyed_commit(conn)
    insert_columns(conn, schema.records_table_name(job.dataset_id), columns, order_by=order)


def insert_bad_records(conn: Connection, shard_id: int, bad: Sequence[Any]) -> None:
    """The records the shard's scan set aside (``offset``, ``length``, ``reason``,
    ``key`` each); PostgreSQL text cannot hold NUL: such a key is not kept."""
    keeps_nul = dialect_of(conn).text_holds_nul
    conn.execute(
        schema.bad_records.insert(),
        [
            {
                "shard_id": shard_id,
                "offset": b.offset,
                "length": b.length,
                "reason": b.reason.replace("\x00", "\\x00"),
                "key": b.key if keeps_nul or not b.key or "\x00" not in b.key else None,
            }
            for b in bad
        ],
    )


def _refuse_nul(conn: Connection, job: IngestJob, stored: str, batch: Batch) -> None:
    """A NUL character where the catalog cannot keep it fails the shard, naming the
    first record that has it (its byte offset and key, escaped): in a field name (a
    SQL column name, on either database), in a key on PostgreSQL (its text cannot
    hold NUL; SQLite stores such keys exactly)."""

    def record(i: int) -> str:
        key = batch.keys[i]
        return f"{stored}: at byte {batch.offsets[i]}: record " + (
            f"{key!r}" if key is not None else f"{i} of the shard"
        )

    if job.options.get("fields", True):
        for name, values in batch.fields.items():
            if "\x00" in name:
                i = next((i for i, v in enumerate(values) if v is not None), 0)
                raise CatalogError(
                    f"{record(i)} has a field named {name!r}: a NUL character cannot be in a "
                    "SQL name (rename the feature, or ingest with fields=False)"
                )
    if not dialect_of(conn).text_holds_nul:
        i = next((i for i, k in enumerate(batch.keys) if k is not None and "\x00" in k), -1)
        if i >= 0:
            raise CatalogError(
                f"{record(i)}: its key holds a NUL character, which PostgreSQL text cannot "
                "store (key the dataset by position, key=None, or by another feature)"
            )


def commit_shard(
    conn: Connection, job: IngestJob, shard: ClaimedShard, version: ShardVersion
) -> tuple[int, int]:
    """Replace the shard's indexed version with ``version``; returns the records
    committed and the records dropped as duplicates (``version.dropped`` of them
    within the shard already, before this call)."""
    shard_id, stored, batch, dropped = shard.id, shard.stored, version.batch, version.dropped
    st, seek_index = version.stat, version.seek_index
    _refuse_nul(conn, job, stored, batch)
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
        if any(len(m) > 4 and m[4] for m in members):  # pieces of sparse members
            columns["extents"] = [
                json.dumps([list(p) for p in m[4]]) if len(m) > 4 and m[4] else None
                for m in members
            ]
        if any(len(m) > 5 for m in members):  # each member's check (schema version 7)
            keys = batch.keys if job.key_rule != "position" else [None] * len(batch)
            columns["crc"] = [
                keyed_check(m[5], keys[m[0]]) if len(m) > 5 else None for m in members
            ]
        insert_columns(conn, schema.members.name, columns)
    if batch.bad:  # set aside by the scan (schema version 8); cleared above with the rest
        insert_bad_records(conn, shard_id, batch.bad)
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
            fingerprint=version.fingerprint,
            compression=version.compression,
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


# -- the key index of a first ingest ------------------------------------------------


def defer_key_index(engine: Engine, dataset_id: int) -> None:
    """At the start of an ingest: drop the key index of a dataset that has no records
    yet, so that its shards commit without a random insert per key; the index is
    built once the rows are in (:func:`finish_key_index`, a sort)."""
    table = schema.records_table_name(dataset_id)
    with engine.begin() as conn:
        empty = run(conn, f"SELECT 1 FROM {table} LIMIT 1").first() is None
        if empty and tables.has_key_index(conn, dataset_id):
            tables.drop_key_index(conn, dataset_id)


def finish_key_index(engine: Engine, job: IngestJob) -> tuple[dict[str, str], dict[str, int]]:
    """Build the dataset's key index if it is missing (after a first ingest, or one
    that was interrupted), settling the keys that several shards hold by the
    duplicate policy as a commit would have in position order: ``error`` fails
    every shard holding a key of a shard before it (its records go), ``first`` /
    ``last`` drop the other records. Returns ``{stored path: error}`` of the shards
    that failed that way and ``{stored path: records dropped}`` of the shards that
    lost records."""
    with engine.begin() as conn:
        if tables.has_key_index(conn, job.dataset_id):
            return {}, {}
        try:
            with conn.begin_nested():
                tables.create_key_index(conn, job.dataset_id)
            return {}, {}
        except IntegrityError:
            pass  # keys held by more than one shard
        failed = _settle_duplicates(conn, job)
        tables.create_key_index(conn, job.dataset_id)
        return failed


def _settle_duplicates(conn: Connection, job: IngestJob) -> tuple[dict[str, str], dict[str, int]]:
    table = schema.records_table_name(job.dataset_id)
    rows = run(
        conn,
        f'SELECT r.key, s.path, r.shard_id, r.ordinal, r."offset" FROM {table} r '
        "JOIN shardcat_shards s ON s.id = r.shard_id WHERE r.key IN "
        f"(SELECT key FROM {table} GROUP BY key HAVING count(*) > 1) ORDER BY s.path",
    ).all()
    by_shard: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        by_shard[row[1]].append(row)
    failed: dict[int, tuple[str, str]] = {}  # shard id -> (path, why)
    losers: dict[int, list[int]] = defaultdict(list)
    lost: dict[str, int] = defaultdict(int)
    if job.on_duplicate == "error":  # shards in position order, as commits would have been
        held: dict[str, Any] = {}
        for path, mine in by_shard.items():
            clash = [r for r in mine if r[0] in held]
            if not clash:
                held.update((r[0], r) for r in mine)
                continue
            key, _, shard_id, _, offset = clash[0]
            other = held[key]
            failed[shard_id] = (
                path,
                KEEP_ONE.join(_across(key, other[1], other[4], path, offset, len(clash) - 1)),
            )
    else:
        groups: dict[str, list[Any]] = defaultdict(list)
        for row in rows:
            groups[row[0]].append(row)
        for group in groups.values():  # in path order
            keep = group[0] if job.on_duplicate == "first" else group[-1]
            for row in group:
                if row is not keep:
                    losers[row[2]].append(row[3])
                    lost[row[1]] += 1
    s = schema.shards
    for shard_id, (_, why) in failed.items():  # no indexed version: as if never committed
        clear_shards(conn, job.dataset_id, [shard_id])
        conn.execute(
            update(s)
            .where(s.c.id == shard_id)
            .values(state="failed", generation=None, num_records=0, error=why)
        )
    for shard_id, ordinals in losers.items():
        remove_ordinals(conn, job.dataset_id, shard_id, ordinals)
        conn.execute(
            update(s).where(s.c.id == shard_id).values(num_records=s.c.num_records - len(ordinals))
        )
    if lost:
        note_dropped(conn, job.dataset_id, {}, lost)
    bump_version(conn, job.dataset_id)
    recompute_positions(conn, job.dataset_id)
    return dict(failed.values()), dict(lost)
