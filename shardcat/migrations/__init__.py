"""Schema versions of the catalog and the ordered steps between them.

``SCHEMA_VERSION`` is what this library writes. A catalog records its version
in ``catalog_meta``. Opening an older catalog runs every step from its version
up to ``SCHEMA_VERSION`` — each step and its version bump inside the same
transaction, so an interrupted upgrade leaves the catalog at a whole version.
A catalog newer than the library is refused with :class:`SchemaVersionError`.
:func:`upgrade` (``catalog migrate --upgrade``) does the same without opening
anything else, e.g. before a read-only open (which never upgrades).

Importing legacy index files (tfd-utils, MXNet/DALI, vahidk) lives in
:mod:`shardcat.migrations.legacy`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Connection, inspect, select, text

from shardcat.catalog import schema
from shardcat.errors import CatalogError, SchemaVersionError

__all__ = ["SCHEMA_VERSION", "STEPS", "ensure_schema", "read_version", "too_new", "upgrade"]

SCHEMA_VERSION = 3


def _add_seek_indexes(conn: Connection) -> None:
    """1 -> 2: the ``seek_indexes`` table (seek points of compressed shards).
    Version 1 could not ingest compressed shards, so there is nothing to fill."""
    schema.seek_indexes.create(conn)


def _add_versions(conn: Connection) -> None:
    """2 -> 3: indexed versions of shards (``generation``, ``ino``, ``ctime_ns``),
    ``datasets.version`` and ``members.extents``. Ready shards become generation 1;
    inode and ctime stay NULL until a sync or a reader has checked the fingerprint."""
    for table, column in (
        ("shards", "generation BIGINT"),
        ("shards", "ino BIGINT"),
        ("shards", "ctime_ns BIGINT"),
        ("datasets", "version BIGINT NOT NULL DEFAULT '0'"),
        ("members", "extents TEXT"),
    ):
        conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {column}"))
    conn.execute(text("UPDATE shards SET generation = 1 WHERE state = 'ready'"))


# STEPS[n] upgrades a catalog from version n to n + 1.
STEPS: dict[int, Callable[[Connection], None]] = {1: _add_seek_indexes, 2: _add_versions}


def read_version(conn: Connection) -> int | None:
    """The catalog's schema version, or None for an empty database."""
    if not inspect(conn).has_table("catalog_meta"):
        return None
    value = conn.execute(
        select(schema.catalog_meta.c.value).where(schema.catalog_meta.c.name == "schema_version")
    ).scalar_one_or_none()
    return None if value is None else int(value)


def _write_version(conn: Connection, version: int) -> None:
    table = schema.catalog_meta
    updated = conn.execute(
        table.update().where(table.c.name == "schema_version").values(value=str(version))
    )
    if updated.rowcount == 0:
        conn.execute(table.insert().values(name="schema_version", value=str(version)))


def too_new(where: str, found: int) -> SchemaVersionError:
    """The error for a catalog written by a newer shardcat (never touched)."""
    return SchemaVersionError(
        f"{where} has catalog schema version {found}, but this shardcat only "
        f"knows versions up to {SCHEMA_VERSION}: upgrade shardcat "
        "(pip install -U shardcat) to open it"
    )


def ensure_schema(conn: Connection, where: str) -> int:
    """Create or upgrade the schema inside the caller's (write) transaction.

    Returns the version found before any change (0 for a new catalog).
    """
    found = read_version(conn)
    if found is None:
        schema.metadata.create_all(conn)
        _write_version(conn, SCHEMA_VERSION)
        return 0
    if found > SCHEMA_VERSION:
        raise too_new(where, found)
    for version in range(found, SCHEMA_VERSION):
        STEPS[version](conn)
        _write_version(conn, version + 1)
    return found


def upgrade(path: str | os.PathLike[str]) -> tuple[int, int]:
    """Upgrade the catalog at ``path`` to :data:`SCHEMA_VERSION` in place.

    Returns ``(version found, version now)``. Raises :class:`CatalogError`
    when there is no file at ``path`` and :class:`SchemaVersionError` for a
    catalog newer than this library.
    """
    from shardcat.catalog.engine import make_engine

    where = Path(path)
    if not where.is_file():
        raise CatalogError(f"no catalog at {where}")
    engine = make_engine(where)
    try:
        with engine.begin() as conn:
            found = ensure_schema(conn, str(where))
    finally:
        engine.dispose()
    return found, SCHEMA_VERSION
