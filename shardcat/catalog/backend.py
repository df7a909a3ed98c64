"""The catalog's backend: the one object, chosen once when a catalog is opened
(:func:`backend_for`), that holds every operation that differs between a SQLite
file (:mod:`~shardcat.catalog.sqlite`) and a PostgreSQL server
(:mod:`~shardcat.catalog.postgres`).

Two small interfaces:

- :class:`Backend`, one per catalog: where it is and how it is named in
  messages, what it can do (``local_file``: the catalog is this local file, else
  None; ``one_writer``: writers take turns), and how it opens (engine, read
  connection, read-only engine, schema version, errors), checks its damage,
  runs guarded read-only SQL and checkpoints;
- :class:`Dialect`, its ``dialect`` (found from any SQLAlchemy connection with
  :func:`dialect_of`): the SQL that differs. Statements are written once, with
  ``?`` placeholders, and run with :func:`run` (the backend prepares them for its
  driver); the readers' read connections take the same ``?`` text.

Nothing outside these three modules asks which database a catalog is on
(``tests/test_layers.py`` checks it): callers ask the backend what it can do.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Connection, CursorResult, Engine
from sqlalchemy.util.typing import TupleAny, Unpack

from shardcat.catalog.engine import locate
from shardcat.catalog.lookup import BatchItems, ReadConnection
from shardcat.catalog.names import ENV_VAR
from shardcat.catalog.postgres import DIALECT as POSTGRES
from shardcat.catalog.postgres import PostgresBackend, is_server_url
from shardcat.catalog.query import Rows
from shardcat.catalog.sqlite import DIALECT as SQLITE
from shardcat.catalog.sqlite import SQLiteBackend
from shardcat.errors import CatalogError

__all__ = [
    "Backend",
    "Dialect",
    "backend_for",
    "catalog_location",
    "dialect_of",
    "make_engine",
    "run",
]


class Dialect(Protocol):
    """The SQL that differs between the backends, for statements on a connection."""

    #: a text column keeps a NUL character (else such a value is not stored)
    text_holds_nul: bool
    #: a version is also written to the pre-version-4 marker table older builds read
    keeps_old_marker: bool
    #: its read connections are ``sqlite3`` connections the native single read
    #: (:mod:`shardcat.readers.hot`) may prepare its lookup on
    native_lookups: bool
    #: how a batch's JSON array parameter becomes rows (:mod:`~shardcat.catalog.lookup`)
    batch_items: BatchItems
    #: the names of a table's indexes (one ``?``: the table), on any connection
    index_names_sql: str
    #: what follows a records table's definition; what its ``shard_id`` references
    records_options: str
    shard_reference: str

    def prepare(self, sql: str) -> str:
        """``sql`` written with ``?`` placeholders, in the driver's style."""
        ...

    def any_of(self, column: str, values: Sequence[Any]) -> tuple[str, Any]:
        """``column`` is one of ``values``: the condition (one ``?`` placeholder) and its
        one parameter, however many values."""
        ...

    def insert_rows(
        self,
        conn: Connection,
        table: str,
        names: Sequence[str],
        columns: Sequence[Sequence[Any]],
        n: int,
    ) -> None:
        """Insert ``n`` rows given as one sequence per column, the fastest way the
        database takes them, within the connection's transaction."""
        ...

    def index_build(self, conn: Connection) -> contextlib.AbstractContextManager[None]:
        """Around building an index over a whole table (more sort memory)."""
        ...

    def keyed_commit(self, conn: Connection) -> None:
        """Before a commit inserts scattered keys into a key index."""
        ...

    def lock_wait(self, conn: Connection, seconds: float) -> None:
        """Wait at most ``seconds`` for the write lock on this (idle) connection."""
        ...


class Backend(Protocol):
    """One catalog's database: where it is, what it can do, how it opens."""

    @property
    def dialect(self) -> Dialect:
        """The SQL that differs (the same as :func:`dialect_of` its connections)."""
        ...

    #: what :func:`catalog_location` gives: the file (absolute), or the whole URL
    where: Path | str
    #: what reopens the catalog (a file's path, or a server's whole URL)
    location: str
    #: the catalog's name in messages (a file's path, a URL without its password)
    display: str
    #: what a read-only open says when the database holds no catalog
    no_catalog: str
    #: the catalog is this local file (None: it is not a file)
    local_file: Path | None
    #: where relative shard paths start ("": every shard path is stored absolute)
    directory: str
    #: writers take turns (one write transaction at a time, waited for at BEGIN)
    one_writer: bool
    #: the execution options of a read transaction (a snapshot that takes no lock)
    read_options: Mapping[str, Any]

    def check_mode(self, *, immutable: bool) -> None:
        """Refuse a mode the backend cannot open in (:class:`CatalogError`)."""
        ...

    def before_write(self) -> None:
        """Checks before opening the catalog to write (a file that is no catalog)."""
        ...

    def engine(self, *, keep_connection: bool = False) -> Engine:
        """A SQLAlchemy engine whose transactions write (see
        :func:`~shardcat.catalog.engine.pooled_engine`)."""
        ...

    def read_connection(self, *, immutable: bool = False) -> ReadConnection:
        """A new read-only DBAPI connection (the readers' lookups run on it)."""
        ...

    def read_engine(self, *, immutable: bool = False) -> Engine:
        """An engine for read transactions of a catalog opened read-only."""
        ...

    def read_version(self, conn: ReadConnection) -> int | None:
        """The schema version the catalog records (None: it records none)."""
        ...

    def open_error(self, exc: BaseException) -> CatalogError:
        """The error for a catalog that cannot be opened, naming it."""
        ...

    def damage_error(self, exc: BaseException) -> CatalogError:
        """The error for a database failure reading the catalog, naming it (and,
        where the reason says the file is damaged, what to run)."""
        ...

    def quick_check(self, conn: ReadConnection) -> list[str]:
        """What the database finds damaged (empty: nothing)."""
        ...

    def query(
        self,
        reads: Callable[[], ReadConnection],
        sql: str,
        params: Sequence[Any] | Mapping[str, Any] | None,
        *,
        attach: Mapping[str, str | os.PathLike[str]] | None,
        timeout: float | None,
        memory: int | None,
    ) -> contextlib.AbstractContextManager[Rows]:
        """One guarded read-only statement (``reads``: the catalog's read connection)."""
        ...

    def checkpoint(self, engine: Engine, *, wait: bool) -> bool:
        """Fold the write-ahead log into the database; True when it holds every commit."""
        ...

    def close_files(self) -> None:
        """What the last writer of this process leaves tidy when it closes."""
        ...


def catalog_location(explicit: str | os.PathLike[str] | None) -> Path | str:
    """:func:`~shardcat.catalog.engine.locate` for a catalog that may be on a server:
    a PostgreSQL URL (given, or in ``$SHARDCAT_CATALOG``) as it is, else the file,
    absolute."""
    given = os.environ.get(ENV_VAR) if explicit is None else explicit
    if is_server_url(given):
        return str(given)
    return locate(explicit).absolute()


def backend_for(where: str | os.PathLike[str] | None) -> Backend:
    """The backend of the catalog ``where`` names (see :func:`catalog_location`;
    nothing is opened yet)."""
    found = catalog_location(where)
    return PostgresBackend(found) if isinstance(found, str) else SQLiteBackend(found)


_DIALECTS: dict[str, Dialect] = {"sqlite": SQLITE, "postgresql": POSTGRES}


def dialect_of(conn: Connection) -> Dialect:
    """The :class:`Dialect` of a SQLAlchemy connection's backend."""
    return _DIALECTS[conn.dialect.name]


def run(conn: Connection, sql: str, params: Any = None) -> CursorResult[Unpack[TupleAny]]:
    """Run ``sql`` (``?`` placeholders; ``params`` a sequence, or a list of them for
    many rows) on ``conn``, prepared for its backend's driver."""
    dialect = _DIALECTS[conn.dialect.name]
    if params is None:
        return conn.exec_driver_sql(sql)
    return conn.exec_driver_sql(dialect.prepare(sql), params)


def make_engine(where: str | os.PathLike[str], *, keep_connection: bool = False) -> Engine:
    """A writing engine on the catalog ``where`` names (:meth:`Backend.engine`)."""
    return backend_for(where).engine(keep_connection=keep_connection)
