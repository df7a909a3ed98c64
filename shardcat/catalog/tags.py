"""Tags (schema version 10): a dataset pinned as it is, read later by the name
``<dataset>@<tag>`` whatever happens to the dataset since.

A tag is a row of ``shardcat_tags`` and a *pinned dataset*: a dataset row named
``<dataset>@<tag>`` (a name no user's dataset can take: ``@`` is no identifier
character) holding what readers of the dataset saw when it was tagged, in one
write transaction (one moment of the dataset):

- a shard row per shard with an indexed version, carrying that version: its
  ``generation`` and the file identity it was indexed from (size, mtime, inode,
  ctime, fingerprint), its positions and record count;
- the rows of those versions *by reference* (:mod:`~shardcat.catalog.shares`, as
  a subset reads its donor's): records with their field values, members and seek
  points stay in the dataset's tables (in its donor's, when the dataset itself
  reads by reference); the tag's own records table is empty, with the field
  indexes the dataset's has;
- a copy of the dataset's soft-delete marks;
- its view, named ``<dataset>@<tag>`` (SQL: ``SELECT * FROM "train@v1"``).

So tagging costs the dataset's shards and deleted marks, not its records. The
rows a tag reads never change under it: before the live dataset's ingest
rewrites or drops a shard's rows (a changed shard re-indexed, a shard gone,
duplicates dropped, the donor dropped), :func:`~shardcat.catalog.shares.release`
copies every row the tag reads into its own tables, once; from then on it owns
them. Every reader (``Catalog.dataset("train@v1")``, samplers, snapshots, SQL)
reads exactly the tagged record set through the same code as any dataset, and
reads of the live dataset pay nothing for tags. A pinned shard whose file
changed on disk since is a :class:`~shardcat.errors.StaleShardError` naming the
tag and the file (checked like every shard, by its identity); one the live
dataset dropped reads fine while its file is unchanged. :func:`unpin` drops the
tag's shard rows, shares, records table and view at once (a tag that owns its
rows may be a new subset's donor: that subset copies them first).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import Connection, Insert, delete, func, select

from shardcat.catalog import schema, shares, tables
from shardcat.catalog.backend import dialect_of, run
from shardcat.catalog.datasets import DELETED_COUNT, DatasetRow
from shardcat.catalog.lookup import records_source
from shardcat.errors import CatalogError

__all__ = ["TagInfo", "listed", "pin", "refuse_write", "unpin"]


@dataclass(frozen=True)
class TagInfo:
    """One tag: the dataset tagged, its name, the records it pins (soft-deleted ones
    left out), its shards and when it was made (seconds since the epoch)."""

    dataset: str
    name: str
    records: int
    shards: int
    created: float

    @property
    def pinned(self) -> str:
        """The name the tag is read by: ``<dataset>@<tag>``."""
        return f"{self.dataset}{schema.TAG_MARK}{self.name}"


def refuse_write(name: str, doing: str) -> None:
    """:class:`CatalogError` when ``name`` is a tag's (``dataset@tag``): tags are
    read-only."""
    tagged = schema.tag_of(name)
    if tagged is not None:
        dataset, tag = tagged
        instead = (
            f"`catalog untag {dataset} {tag}` removes it"
            if doing == "drop"
            else f"change {dataset!r}, then tag it again"
        )
        raise CatalogError(
            f"cannot {doing} {name!r}: it is tag {tag!r} of dataset {dataset!r}, "
            f"and tags are read-only ({instead})"
        )


def _check_tag_name(tag: str) -> None:
    if not schema.IDENTIFIER.match(tag):
        raise CatalogError(
            f"invalid tag name {tag!r}: use letters, digits and '_' (not starting with a digit)"
        )


def pin(conn: Connection, live: DatasetRow, tag: str) -> TagInfo:
    """Tag dataset ``live`` as ``tag``: a pinned dataset reading by reference what its
    readers see now (see the module docstring); :class:`CatalogError` for a bad or
    taken name."""
    _check_tag_name(tag)
    t, d = schema.tags, schema.datasets
    # the dataset's row locked first (PostgreSQL; SQLite's write lock holds it all):
    # a shard commit or a delete bumps its version, so none lands mid-tag
    source = conn.execute(select(d).where(d.c.id == live.id).with_for_update()).mappings().one()
    taken = conn.execute(
        select(t.c.name).where(t.c.dataset_id == live.id, func.lower(t.c.name) == tag.lower())
    ).first()
    if taken is not None:
        raise CatalogError(
            f"dataset {live.name!r} has a tag {taken[0]!r} already "
            f"(`catalog untag {live.name} {taken[0]}` first to move it)"
        )
    name = f"{live.name}{schema.TAG_MARK}{tag}"
    if len(name) > schema.datasets.c.name.type.length:  # type: ignore[attr-defined]
        raise CatalogError(f"tag name {tag!r} is too long for dataset {live.name!r}: {name!r}")
    pinned_id = _inserted(
        conn,
        d.insert().values(
            **{c: source[c] for c in ("format", "key_rule", "grouping", "options", "source")},
            name=name,
            created_at=time.time(),
            version=source["version"],
        ),
    )
    run(
        conn,
        "INSERT INTO shardcat_deleted (dataset_id, key) "
        "SELECT ?, key FROM shardcat_deleted WHERE dataset_id = ?",
        (pinned_id, live.id),
    )
    s = schema.shards
    shards = (
        conn.execute(select(s.c.id).where(s.c.dataset_id == live.id, s.c.generation.is_not(None)))
        .scalars()
        .all()
    )
    tables.create_records_table(conn, pinned_id)  # (empty: for the copy it may make)
    shares.share(conn, pinned_id, name, live.id, shards, pinned=True)
    _pin_field_indexes(conn, live.id, pinned_id, name)
    records = _live_records(conn, pinned_id)
    created = time.time()
    conn.execute(
        t.insert().values(
            dataset_id=live.id,
            name=tag,
            pinned_id=pinned_id,
            created=created,
            record_count=records,
        )
    )
    return TagInfo(live.name, tag, records, len(shards), created)


def _inserted(conn: Connection, insert: Insert) -> int:
    """The id of the row ``insert`` made."""
    key = conn.execute(insert).inserted_primary_key
    assert key is not None  # (an INSERT of one row has one)
    return int(key[0])


def _pin_field_indexes(conn: Connection, live_id: int, pinned_id: int, name: str) -> None:
    """The field indexes the dataset's own table has (``create_index``), on the tag's
    (empty until it copies its rows; meanwhile its view reads the donor's, indexed)."""
    sql = dialect_of(conn).index_names_sql
    have = {r[0] for r in run(conn, sql, (schema.records_table_name(live_id),))}
    for column, _, idx in tables.field_columns(conn, pinned_id).values():
        if tables.field_index_name(live_id, idx) in have:
            tables.create_field_index(conn, pinned_id, name, column)


def _live_records(conn: Connection, dataset_id: int) -> int:
    """Records of the dataset's shards, less those marked deleted."""
    s = schema.shards
    total = conn.execute(
        select(func.coalesce(func.sum(s.c.num_records), 0)).where(s.c.dataset_id == dataset_id)
    ).scalar_one()
    records = records_source(dataset_id, tables.donor_of(conn, dataset_id))
    dead = run(conn, DELETED_COUNT.format(records=records), (dataset_id,)).scalar_one()
    return int(total) - int(dead)


def unpin(conn: Connection, live: DatasetRow, tag: str) -> TagInfo:
    """Remove tag ``tag`` of dataset ``live``: its pinned dataset's view, records
    table and rows go (files on disk are untouched); :class:`CatalogError` naming
    the dataset's tags when it has no such tag."""
    t = schema.tags
    found = [i for i in listed(conn, live.id) if i.name.lower() == tag.lower()]
    if not found:
        have = [i.name for i in listed(conn, live.id)]
        raise CatalogError(
            f"dataset {live.name!r} has no tag {tag!r}"
            + (f" (its tags: {', '.join(have)})" if have else " (it has no tags)")
        )
    pinned_id = conn.execute(
        select(t.c.pinned_id).where(t.c.dataset_id == live.id, t.c.name == found[0].name)
    ).scalar_one()
    shares.release(conn, pinned_id, None, own=False)  # (a tag that copied may be a donor)
    tables.drop_dataset_objects(conn, pinned_id, found[0].pinned)
    # its shards, members, seek points, marks and tag row go with it (ON DELETE CASCADE)
    conn.execute(delete(schema.datasets).where(schema.datasets.c.id == pinned_id))
    return found[0]


def listed(conn: Connection, dataset_id: int | None = None) -> list[TagInfo]:
    """The tags of one dataset (None: of every dataset), by dataset then tag name."""
    t, d, s = schema.tags, schema.datasets, schema.shards
    shards = (
        select(func.count()).select_from(s).where(s.c.dataset_id == t.c.pinned_id).scalar_subquery()
    )
    query = select(d.c.name, t.c.name, t.c.record_count, shards, t.c.created).join(
        d, d.c.id == t.c.dataset_id
    )
    if dataset_id is not None:
        query = query.where(t.c.dataset_id == dataset_id)
    rows = conn.execute(query.order_by(d.c.name, t.c.name)).all()
    return [TagInfo(r[0], r[1], int(r[2]), int(r[3]), float(r[4])) for r in rows]
