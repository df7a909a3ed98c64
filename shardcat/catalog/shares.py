"""Datasets that read another dataset's rows by reference (schema version 11).

A new dataset over shards another dataset has indexed with the same rule (a
reader over ``train-0000[1-3].tfrecord`` after ``train-*.tfrecord``: see
:mod:`~shardcat.catalog.reuse`), and a tag of a dataset
(:mod:`~shardcat.catalog.tags`), does not copy their rows: :func:`share` gives it
its own shard rows (path, file identity, record count, so its own positions)
and one ``shardcat_shares`` row per shard naming the donor's shard. Its lookups,
its deleted keys and its SQL view read the donor's records table restricted to
those shards (:func:`~shardcat.catalog.lookup.records_source`), so opening it
(or tagging a dataset) costs its shards, not its records. One made from a
dataset that reads by reference itself reads that dataset's donor's rows. Soft
deletes stay per dataset (marks are by dataset and key).

A dataset reads all its indexed shards this way or none, and the rows it reads
never change under it: before anything writes records, :func:`release` makes
every dataset reading them by reference own a copy first (:func:`materialize`:
the rows copied into its own table, as a seed copied them before version 11,
its shares gone, its ``version`` moved so open readers reload). That covers a
re-ingest of a shared shard on either side, a shard leaving either dataset,
records dropped as duplicates, a dataset dropped, and an index asked for on the
dataset itself. Readers of the old snapshot keep reading the donor's rows of
that snapshot; a reader's next call sees the copy.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, select, update

from shardcat.catalog import schema, tables
from shardcat.catalog.backend import dialect_of, run

__all__ = ["MEMBER_COLUMNS", "RECORD_COLUMNS", "copies", "materialize", "release", "share"]

#: the columns of a records table but its fields, and of ``shardcat_members``
RECORD_COLUMNS = ("shard_id", "ordinal", "key", "offset", "length", "extents", "item", "crc")
MEMBER_COLUMNS = ("shard_id", "ordinal", "name", "offset", "length", "extents", "crc")


_SHARD_COPY = (
    "INSERT INTO shardcat_shards (dataset_id, path, size, mtime_ns, fingerprint, compression, "
    "num_records, state, indexed_at, generation, first_position, ino, ctime_ns) SELECT ?, path, "
    "size, mtime_ns, fingerprint, compression, num_records, 'ready', indexed_at, {generation}, "
    "first_position, ino, ctime_ns FROM shardcat_shards WHERE dataset_id = ? AND {among}"
)
# each new shard reads the rows its source shard reads: the source's own, or (a source
# reading by reference itself) its donor's
_SHARES = (
    "INSERT INTO shardcat_shares (dataset_id, shard_id, donor_id, donor_shard_id) "
    "SELECT ?, s.id, coalesce(x.donor_id, d.dataset_id), coalesce(x.donor_shard_id, d.id) "
    "FROM shardcat_shards s JOIN shardcat_shards d ON d.path = s.path "
    "LEFT JOIN shardcat_shares x ON x.shard_id = d.id "
    "WHERE s.dataset_id = ? AND d.dataset_id = ? AND {among}"
)


def share(
    conn: Connection,
    dataset_id: int,
    name: str,
    source_id: int,
    shard_ids: Sequence[int],
    *,
    pinned: bool = False,
) -> None:
    """Give the new dataset ``dataset_id`` the shards ``shard_ids`` of dataset
    ``source_id`` (ready) by reference: its own shard rows (file identity,
    ``indexed_at`` and positions kept; ``pinned``: their ``generation`` too, as a tag
    keeps them, else 1), their shares (the rows the source's shards read: a source
    that reads by reference itself passes on its donor's), the source's field columns
    (same ``v<idx>``, so its view reads the donor's table) and its view. The caller
    moves its version (and positions). Driver SQL, a few statements whatever the
    number of shards."""
    fields = run(
        conn,
        "SELECT name, column_name, sql_type, idx FROM shardcat_fields WHERE dataset_id = ? "
        "ORDER BY idx",
        (source_id,),
    ).all()
    table = schema.records_table_name(dataset_id)
    for field in fields:  # (its own table gets them too, for the copy it may make)
        sql_type = tables.SQL_TYPES[field.sql_type]
        run(conn, f'ALTER TABLE "{table}" ADD COLUMN v{int(field.idx)} {sql_type}')
    if fields:
        run(
            conn,
            "INSERT INTO shardcat_fields (dataset_id, name, column_name, sql_type, idx) "
            "VALUES (?, ?, ?, ?, ?)",
            [(dataset_id, *field) for field in fields],
        )
    if shard_ids:
        among, listed = dialect_of(conn).any_of("id", list(shard_ids))
        generation = "generation" if pinned else "1"
        copy = _SHARD_COPY.format(generation=generation, among=among)
        run(conn, copy, (dataset_id, source_id, listed))
        among, listed = dialect_of(conn).any_of("d.id", list(shard_ids))
        run(conn, _SHARES.format(among=among), (dataset_id, dataset_id, source_id, listed))
    tables.create_view(conn, dataset_id, name)


def copies(conn: Connection, dataset_id: int, donor: int) -> list[tuple[str, list[str], str]]:
    """How to copy the rows dataset ``dataset_id`` reads by reference from ``donor``
    under its own shard ids: ``(table, its columns, SELECT of their values)`` for its
    records, members, seek points and bad records (run on the catalog that holds
    them; a snapshot streams them into another)."""
    d = schema.datasets
    key_rule = conn.execute(select(d.c.key_rule).where(d.c.id == dataset_id)).scalar_one()
    idx = [f"v{i}" for _, _, i in tables.field_columns(conn, dataset_id).values()]
    fields = "".join(f", r.{v}" for v in idx)
    # position keys name their shard (see commit.insert_records)
    key = (
        "'#' || CAST(x.shard_id AS TEXT) || ':' || CAST(r.ordinal AS TEXT)"
        if key_rule == "position"
        else "r.key"
    )
    shared = (
        "JOIN shardcat_shares x ON x.donor_shard_id = r.shard_id "
        f"WHERE x.dataset_id = {int(dataset_id)}"
    )
    return [
        (
            schema.records_table_name(dataset_id),
            [*RECORD_COLUMNS, *idx],
            f'SELECT x.shard_id, r.ordinal, {key}, r."offset", r.length, r.extents, r.item, '
            f'r.crc{fields} FROM "{schema.records_table_name(donor)}" r '
            f"{shared}",
        ),
        (
            schema.members.name,
            [*MEMBER_COLUMNS],
            'SELECT x.shard_id, r.ordinal, r.name, r."offset", r.length, r.extents, r.crc '
            f"FROM shardcat_members r {shared}",
        ),
        (
            schema.seek_indexes.name,
            ["shard_id", "kind", "data"],
            f"SELECT x.shard_id, r.kind, r.data FROM shardcat_seek_indexes r {shared}",
        ),
        (
            schema.bad_records.name,
            ["shard_id", "offset", "length", "reason", "key"],
            'SELECT x.shard_id, r."offset", r.length, r.reason, r.key '
            f"FROM shardcat_bad_records r {shared}",
        ),
    ]


def materialize(conn: Connection, dataset_id: int) -> bool:
    """Copy the rows dataset ``dataset_id`` reads by reference into its own tables
    under its own shard ids (:func:`copies`), drop its shares, rebuild its view and
    move its version; False when it reads its own rows already."""
    donor = tables.donor_of(conn, dataset_id)
    if donor is None:
        return False
    for into, columns, rows in copies(conn, dataset_id, donor):
        names = ", ".join(f'"{c}"' for c in columns)
        run(conn, f'INSERT INTO "{into}" ({names}) {rows}')
    conn.execute(schema.shares.delete().where(schema.shares.c.dataset_id == dataset_id))
    d = schema.datasets
    conn.execute(update(d).where(d.c.id == dataset_id).values(version=d.c.version + 1))
    name = conn.execute(select(d.c.name).where(d.c.id == dataset_id)).scalar_one()
    tables.create_view(conn, dataset_id, name)
    return True


def release(
    conn: Connection, dataset_id: int, shard_ids: Sequence[int] | None, *, own: bool = True
) -> None:
    """Before the records of dataset ``dataset_id``'s shards ``shard_ids`` (None:
    all) change or go: the dataset owns its rows (``own``; False for a dataset
    being dropped), and so does every dataset that reads them by reference (see
    the module docstring)."""
    if own:
        materialize(conn, dataset_id)
    x = schema.shares
    readers = select(x.c.dataset_id).where(x.c.donor_id == dataset_id)
    if shard_ids is not None:
        if not shard_ids:
            return
        readers = readers.where(x.c.donor_shard_id.in_(list(shard_ids)))
    for reader in sorted(set(conn.execute(readers).scalars())):
        materialize(conn, reader)
