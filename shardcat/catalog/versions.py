"""Schema versions of the catalog: the store's bookkeeping of them.

``SCHEMA_VERSION`` is what this library writes. A catalog records its version
in ``shardcat_meta`` (``catalog_meta`` before version 4). The store creates a
new catalog at ``SCHEMA_VERSION`` (:func:`ensure_schema`), refuses a newer one
(:func:`too_new`) and an older one (:func:`too_old`: its hint names ``catalog
upgrade``). The steps between versions live above the store, in
:mod:`shardcat.migrations.schema`; :func:`upgrade` runs the steps it is given
under the store's create/upgrade lock (one write transaction: every step and its
version bump commit together, so an interrupted upgrade leaves the catalog at a
whole version), and :func:`say_upgraded` says so once (older shardcats can no
longer open it).

Every version written is also written to ``catalog_meta`` (the marker): the
shardcats before version 4 read their version there only, so without it they
would take an upgraded catalog for an empty one and add their own tables to it;
with it they refuse it as too new, as every later shardcat does.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping

from sqlalchemy import Column, Connection, MetaData, String, Table, Text, inspect, text

from shardcat.catalog import schema
from shardcat.catalog.backend import backend_for, dialect_of
from shardcat.errors import CatalogError, SchemaVersionError, ShardcatWarning, upgrade_hint

__all__ = [
    "SCHEMA_VERSION",
    "Step",
    "ensure_schema",
    "read_version",
    "say_upgraded",
    "too_new",
    "too_old",
    "upgrade",
]

SCHEMA_VERSION = 11


# Where catalogs before version 4 (no ``shardcat_`` prefix) kept their version.
OLD_META = schema.OLD_META

# A step upgrades a catalog (on a connection in the upgrade's transaction) by one version.
Step = Callable[[Connection], None]


def _meta_table(conn: Connection) -> str | None:
    """Where the schema version is kept: ``shardcat_meta`` (version 4 on),
    ``catalog_meta`` (before), None in a database that is no catalog."""
    names = set(inspect(conn).get_table_names())
    for name in (schema.catalog_meta.name, OLD_META):
        if name in names:
            return name
    return None


def read_version(conn: Connection) -> int | None:
    """The catalog's schema version, or None for an empty database."""
    table = _meta_table(conn)
    if table is None:
        return None
    value = conn.execute(
        text(f"SELECT value FROM {table} WHERE name = 'schema_version'")
    ).scalar_one_or_none()
    return None if value is None else int(value)


# The marker: ``catalog_meta`` as the shardcats before version 4 created it.
_MARKER = Table(
    OLD_META,
    MetaData(),
    Column("name", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)


def _set_version(conn: Connection, table: str, version: int) -> None:
    updated = conn.execute(
        text(f"UPDATE {table} SET value = :v WHERE name = 'schema_version'"), {"v": str(version)}
    )
    if updated.rowcount == 0:
        conn.execute(
            text(f"INSERT INTO {table} (name, value) VALUES ('schema_version', :v)"),
            {"v": str(version)},
        )


def _write_version(conn: Connection, version: int) -> None:
    """Record ``version`` in the meta table, and in the marker (see the module
    docstring) once the meta table is no longer ``catalog_meta`` itself."""
    table = _meta_table(conn) or schema.catalog_meta.name
    _set_version(conn, table, version)
    if table == OLD_META or not dialect_of(conn).keeps_old_marker:
        return
    if OLD_META in inspect(conn).get_view_names():
        return  # a dataset took the name (allowed before the marker): no marker there
    _MARKER.create(conn, checkfirst=True)
    _set_version(conn, OLD_META, version)


def say_upgraded(where: str, found: int) -> None:
    """After an open upgraded the catalog at ``where`` from version ``found`` (and
    committed): one :class:`ShardcatWarning` saying so (nothing when ``found`` is 0,
    a new catalog, or already :data:`SCHEMA_VERSION`)."""
    if 0 < found < SCHEMA_VERSION:
        warnings.warn(
            f"upgraded the catalog {where} from schema version {found} to {SCHEMA_VERSION}: "
            "older shardcat versions can no longer open it (they refuse it as too new)",
            ShardcatWarning,
            stacklevel=5,  # (_open_schema, Store.__init__, Catalog.__init__) the code opening it
        )


def too_new(where: str, found: int) -> SchemaVersionError:
    """The error for a catalog written by a newer shardcat (never touched)."""
    return SchemaVersionError(
        f"{where} has catalog schema version {found}, but this shardcat only "
        f"knows versions up to {SCHEMA_VERSION}: upgrade shardcat "
        "(pip install -U shardcat) to open it"
    )


def too_old(where: str, found: int) -> SchemaVersionError:
    """The error for a catalog of an older schema opened where it must not be
    upgraded (read-only): its hint names ``catalog upgrade``."""
    error = SchemaVersionError(
        f"{where} has catalog schema version {found}, this shardcat writes version "
        f"{SCHEMA_VERSION}:",
        hint=upgrade_hint(where),
    )
    error.found = found
    return error


def ensure_schema(conn: Connection, where: str, steps: Mapping[int, Step] | None = None) -> int:
    """Create the schema, or upgrade it with ``steps`` (``steps[n]``: version n to
    n + 1), inside the caller's (write) transaction; without ``steps`` an older
    catalog is refused (:func:`too_old`).

    Returns the version found before any change (0 for a new catalog).
    """
    found = read_version(conn)
    if found is None:
        schema.metadata.create_all(conn)
        _write_version(conn, SCHEMA_VERSION)
        return 0
    if found > SCHEMA_VERSION:
        raise too_new(where, found)
    if found < SCHEMA_VERSION and steps is None:
        raise too_old(where, found)
    for version in range(found, SCHEMA_VERSION):
        (steps or {})[version](conn)
        _write_version(conn, version + 1)
    return found


def upgrade(path: str | os.PathLike[str], steps: Mapping[int, Step]) -> tuple[int, int]:
    """Upgrade the catalog at ``path`` to :data:`SCHEMA_VERSION` in place with
    ``steps``, under the create/upgrade lock (the write transaction; the version is
    read again under it, so processes upgrading at once upgrade it once).

    Returns ``(version found, version now)``. Raises :class:`CatalogError`
    when there is no file at ``path`` and :class:`SchemaVersionError` for a
    catalog newer than this library.
    """
    backend = backend_for(path)
    if backend.local_file is not None and not backend.local_file.is_file():
        raise CatalogError(f"no catalog at {path}")
    engine = backend.engine()
    try:
        with engine.begin() as conn:
            found = ensure_schema(conn, backend.display, steps)
    finally:
        engine.dispose()
    return found, SCHEMA_VERSION
