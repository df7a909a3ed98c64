"""The catalog's tables (SQLAlchemy Core), portable across SQLite and PostgreSQL.

Every table and index of the catalog's own is named ``shardcat_<name>`` (schema
version 4; below they are called by ``<name>``), so that the one SQL view per
dataset, named after the dataset, may take any other name.

- ``datasets``: one row per dataset: format, key rule, grouping rule, options.
- ``datasets.version`` counts the commits that changed the dataset's shard set
  or records; readers compare it to know when to reload their shard list.
- ``shards``: one row per container file: path (relative to the catalog's
  directory when below it), state (pending -> indexing -> ready | failed), the
  claim of the process indexing it, and the *indexed version*: ``generation``
  (NULL until a first commit, +1 with every re-index), the file identity it was
  indexed from (size, mtime, inode, ctime, a fingerprint of its first and last
  64 KiB), ``num_records`` and ``first_position``, the dataset position of its
  first record. A changed shard keeps its indexed version (and records) until
  the re-index commits, so readers see the old or the new version, never none.
- ``records_<dataset id>`` (schema version 6; before it one ``records`` table
  for every dataset and a separate ``fields_<dataset id>``): one table per
  dataset, one row per record, addressed by ``(shard_id, ordinal)`` (index
  within the shard; the primary key, WITHOUT ROWID), with its key, byte
  offset and length, and one column ``v<idx>`` per scalar field. The one
  index on ``key`` (unique, ``records_<dataset id>_key``) holds each key once
  beside its (shard, ordinal). A record's dataset position is
  ``shards.first_position + ordinal``, so re-indexing one shard never
  rewrites the rows of the others. ``extents`` and ``item`` (schema version
  5; NULL for one plain range): a location the format describes as several
  byte ranges (JSON ``[[offset, length], ...]``) and/or as one record inside
  those bytes (chunk + index formats: the row of a Parquet row group). The
  catalog stores them as the scan gave them and never interprets them.
  ``crc`` (schema version 7): the record's check, the CRC32C of the payload
  its format reads XOR the CRC32C of its key (UTF-8; the payload's alone for
  datasets keyed by position: see :func:`~shardcat.catalog.commit.keyed_check`
  and :mod:`shardcat.formats.checks`), compared by every read with the key it
  asked for, so a key index entry naming another row fails; NULL for records
  indexed before version 7 (reads then check their framing) and formats whose
  scan gives none. A dataset's first ingest builds the key index once its rows
  are in (a sort, not a random insert per row); until then it has no key index.
- ``members``: per-feature byte ranges of records stored as several parts
  (tar samples); empty for TFRecord. ``extents`` (schema version 3; NULL for
  one contiguous range) is a JSON list of ``[offset, length]`` pieces that make
  up the member's content in order, ``offset`` -1 for a run of zeros (sparse
  tar members). ``crc`` (schema version 7): the member's check, as a record's
  (its content's CRC32C XOR its sample's key's).
- ``fields``: the scalar field columns of each dataset (feature name, view
  column, SQL type, ``idx`` of its column ``v<idx>`` in ``records_<id>``),
  exposed with the key and position through a view named after the dataset.
- ``seek_indexes`` (schema version 2): seek points into the decompressed
  stream of each gzip/bz2-compressed shard; record and member offsets of
  compressed shards are decompressed-stream offsets.
- ``bad_records`` (schema version 8): the records an ingest with
  ``on_bad_record="skip"`` set aside instead of failing their shard: shard,
  byte offset, the bytes set aside (NULL when unknown), the reason, the key when
  it could be read. They are not records (no key index, no position); written
  with the shard's records, gone with them (a later good re-index clears them).
- ``deleted`` (schema version 9): the keys of records soft-deleted from a
  dataset (``Catalog.delete``): ``(dataset_id, key)``. The shards and record
  rows stay as they are; readers, samplers and the dataset's view skip these
  keys (the view is made with a filter only while the dataset has any), and a
  re-ingest keeps them deleted. ``Catalog.undelete`` removes the marks.
- ``tags`` (schema version 10): one row per tag (``Catalog.tag``): the dataset
  tagged, the tag's name, when, how many records it pins, and ``pinned_id``,
  the dataset row named ``<dataset>@<tag>`` that holds the pinned copy: its
  shard rows (each shard's indexed version: generation and file identity), its
  records table, members, seek points and deleted marks as they were (see
  :mod:`~shardcat.catalog.tags`). ``@`` is in no dataset name a user may give.
- ``shares`` (schema version 11): the shards a dataset reads by reference from
  another dataset with the same rule (a subset of its shards: see
  :mod:`~shardcat.catalog.shares`): ``(dataset_id, shard_id)``, the dataset's own
  shard row (its path, identity, count and position), and ``(donor_id,
  donor_shard_id)``, the donor's shard whose rows in ``records_<donor_id>``,
  ``members``, ``seek_indexes`` and ``bad_records`` it reads. A dataset either
  reads all its indexed shards this way or none.
- ``meta`` (``shardcat_meta``; ``catalog_meta`` before version 4): key/value
  pairs; ``schema_version`` among them.
"""

from __future__ import annotations

import re

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

catalog_meta = Table(
    "shardcat_meta",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

datasets = Table(
    "shardcat_datasets",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(128), nullable=False, unique=True),
    Column("format", String(32), nullable=False),
    Column("key_rule", String(256), nullable=False),  # "feature:<name>" or "position"
    Column("grouping", String(32)),  # tar member grouping rule; NULL for the other formats
    Column("options", Text, nullable=False),  # JSON: format options
    Column("source", Text, nullable=False),  # JSON: the patterns the dataset was ingested from
    Column("created_at", Float, nullable=False),
    Column("version", BigInteger, nullable=False, server_default="0"),  # schema version 3
)

shards = Table(
    "shardcat_shards",
    metadata,
    Column("id", Integer, primary_key=True),
    Column(
        "dataset_id",
        Integer,
        ForeignKey("shardcat_datasets.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("path", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("mtime_ns", BigInteger, nullable=False),
    Column("fingerprint", String(64)),
    Column("compression", String(16)),
    Column("num_records", BigInteger, nullable=False, default=0),
    Column("first_position", BigInteger),
    Column("state", String(16), nullable=False),  # pending, indexing, ready or failed
    Column("error", Text),
    Column("claim_owner", String(256)),
    Column("claimed_at", Float),
    Column("indexed_at", Float),
    # schema version 3: which indexed version the records are, and the file they came from
    Column("generation", BigInteger),
    Column("ino", BigInteger),
    Column("ctime_ns", BigInteger),
    UniqueConstraint("dataset_id", "path"),
)

members = Table(
    "shardcat_members",
    metadata,
    Column(
        "shard_id", Integer, ForeignKey("shardcat_shards.id", ondelete="CASCADE"), nullable=False
    ),
    Column("ordinal", BigInteger, nullable=False),
    Column("name", Text, nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("length", BigInteger, nullable=False),
    Column("extents", Text),  # schema version 3
    Column("crc", BigInteger),  # schema version 7
    PrimaryKeyConstraint("shard_id", "ordinal", "name"),
    sqlite_with_rowid=False,
)

# Schema version 2: seek points of compressed shards (one blob per shard, written
# in the transaction that commits the shard's records; see readers/compressed.py).
seek_indexes = Table(
    "shardcat_seek_indexes",
    metadata,
    Column(
        "shard_id",
        Integer,
        ForeignKey("shardcat_shards.id", ondelete="CASCADE"),
        primary_key=True,
        autoincrement=False,
    ),
    Column("kind", String(32), nullable=False),  # "zran" (gzip) or "bz2-blocks"
    Column("data", LargeBinary, nullable=False),
)

# Schema version 7: records set aside by an ingest with on_bad_record="skip" (committed
# in the transaction that commits the shard's records; see catalog/commit.py).
bad_records = Table(
    "shardcat_bad_records",
    metadata,
    Column(
        "shard_id", Integer, ForeignKey("shardcat_shards.id", ondelete="CASCADE"), nullable=False
    ),
    Column("offset", BigInteger, nullable=False),
    Column("length", BigInteger),  # the bytes set aside from offset; NULL: unknown
    Column("reason", Text, nullable=False),
    Column("key", Text),  # NULL: not readable
    PrimaryKeyConstraint("shard_id", "offset"),
)

# Schema version 9: soft-deleted keys (see catalog/deletes.py).
deleted = Table(
    "shardcat_deleted",
    metadata,
    Column(
        "dataset_id",
        Integer,
        ForeignKey("shardcat_datasets.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("key", Text, nullable=False),
    PrimaryKeyConstraint("dataset_id", "key"),
)

# Schema version 10: tags (see catalog/tags.py); the pinned copy is a dataset row.
tags = Table(
    "shardcat_tags",
    metadata,
    Column("id", Integer, primary_key=True),
    Column(
        "dataset_id",
        Integer,
        ForeignKey("shardcat_datasets.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("name", String(128), nullable=False),
    Column(
        "pinned_id",
        Integer,
        ForeignKey("shardcat_datasets.id", ondelete="CASCADE"),
        nullable=False,
        unique=True,
    ),
    Column("created", Float, nullable=False),
    Column("record_count", BigInteger, nullable=False),
    UniqueConstraint("dataset_id", "name"),
)

# Schema version 11: shards read by reference from another dataset (see catalog/shares.py).
shares = Table(
    "shardcat_shares",
    metadata,
    Column(
        "dataset_id",
        Integer,
        ForeignKey("shardcat_datasets.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column(
        "shard_id",
        Integer,
        ForeignKey("shardcat_shards.id", ondelete="CASCADE"),
        nullable=False,
        unique=True,
    ),
    Column("donor_id", Integer, nullable=False),
    # (a donor's shard goes only after its readers by reference own their rows;
    # CASCADE makes a row that missed that read nothing rather than other rows)
    Column(
        "donor_shard_id",
        Integer,
        ForeignKey("shardcat_shards.id", ondelete="CASCADE"),
        nullable=False,
    ),
    PrimaryKeyConstraint("donor_shard_id", "dataset_id"),
    Index("shardcat_shares_by_dataset", "dataset_id"),
    Index("shardcat_shares_by_donor", "donor_id"),
    sqlite_with_rowid=False,
)

fields = Table(
    "shardcat_fields",
    metadata,
    Column(
        "dataset_id",
        Integer,
        ForeignKey("shardcat_datasets.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("name", Text, nullable=False),  # the feature's name in the data
    Column("column_name", Text, nullable=False),  # its column in the dataset's view
    Column("sql_type", String(16), nullable=False),  # integer, real or text
    Column("idx", Integer, nullable=False),  # column "v<idx>" of shardcat_records_<dataset id>
    PrimaryKeyConstraint("dataset_id", "name"),
)

# Columns every dataset view has; a field with one of these names is renamed "f_<name>".
VIEW_COLUMNS = ("key", "position", "shard")
# The catalog's own tables and indexes all start with this (schema version 4): a
# dataset may take any other identifier, ``shards`` and ``records`` included.
PREFIX = "shardcat_"

# What a dataset, view column or attached schema may be called: a plain SQL identifier
# (``\Z``, not ``$``, which would also match before a trailing newline). SQL does
# not tell identifiers apart by case: nor do dataset names (datasets.ensure).
IDENTIFIER = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")


# What separates a dataset's name from a tag's in the name of the tag's pinned
# dataset and view (``train@v1``, schema version 10); never in a dataset's name.
TAG_MARK = "@"


def tag_of(name: str) -> tuple[str, str] | None:
    """``(dataset, tag)`` of a tagged name ``dataset@tag``; None for any other name."""
    dataset, mark, tag = name.partition(TAG_MARK)
    return (dataset, tag) if mark else None


def first_free(base: str, taken: set[str]) -> str:
    """``base``, else ``base_2``, ``base_3``, ...: the first not in ``taken`` (lower case)."""
    name, n = base, 1
    while name.lower() in taken:
        n += 1
        name = f"{base}_{n}"
    return name


def records_table_name(dataset_id: int) -> str:
    """The dataset's records table (schema version 6): a plain identifier, SQL as is."""
    return f"{PREFIX}records_{int(dataset_id)}"


def key_index_name(dataset_id: int) -> str:
    """The unique index on the keys of the dataset's records table."""
    return f"{PREFIX}records_{dataset_id}_key"


# The table where catalogs before version 4 kept their schema version; kept as the
# marker older shardcats read (see :mod:`shardcat.catalog.versions`).
OLD_META = "catalog_meta"


def is_dataset_name(name: str) -> bool:
    """Whether a dataset's view may be called ``name``: a plain identifier outside the
    catalog's own namespace (``shardcat_*``, :data:`OLD_META`) and SQLite's
    (``sqlite_*``)."""
    lower = name.lower()
    return (
        bool(IDENTIFIER.match(name))
        and not lower.startswith((PREFIX, "sqlite_"))
        and lower != OLD_META
    )
