"""The SQLite backend: a catalog in one local file (WAL mode).

What differs from a server catalog (the interface: :mod:`~shardcat.catalog.backend`):
statements keep their ``?`` placeholders, a batch's items come from ``json_each``,
bulk rows go in as multi-row ``INSERT ... VALUES`` statements (:func:`value_groups`),
writers take turns at ``BEGIN IMMEDIATE`` (one writer at a time), readers open the
file read-only (or immutable), read-only SQL runs under the authorizer of
:mod:`~shardcat.catalog.query`, and the file has a ``-wal`` to checkpoint and a
``quick_check`` to say what is damaged. The file plumbing underneath is
:mod:`~shardcat.catalog.engine`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from shardcat.catalog import engine as files
from shardcat.catalog import schema
from shardcat.catalog.lookup import BatchItems, ReadConnection
from shardcat.catalog.mounts import warn_if_network
from shardcat.catalog.query import Rows, streamed
from shardcat.errors import CatalogError

__all__ = ["DIALECT", "ROWS_PER_STATEMENT", "SQLiteBackend", "SQLiteDialect", "value_groups"]

# Rows per ``INSERT ... VALUES (...), (...)`` statement on SQLite, at most this many
# bound values each (SQLite's historical default limit, lower than any build's).
ROWS_PER_STATEMENT = 200
_MAX_VALUES = 999


def value_groups(
    columns: Sequence[Sequence[Any]], n: int
) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """``n`` rows given as one sequence per column, as multi-row ``VALUES`` statements.

    Returns ``(values, parameter sets)`` pairs, for an ``executemany`` of
    ``INSERT INTO t (...) VALUES <values> [ON CONFLICT ...]`` each: groups of up
    to :data:`ROWS_PER_STATEMENT` rows (at most ``_MAX_VALUES`` bound values),
    then one statement for the rest. Values are bound as they are. Shared by the
    catalog's SQLite inserts and the TensorDB ``rows`` mirror (plain ``sqlite3``).
    """
    width = len(columns)
    flat: list[Any] = [None] * (n * width)  # row after row, filled column by column
    for j, values in enumerate(columns):
        flat[j::width] = values
    one = "(" + ", ".join("?" * width) + ")"
    per = max(1, min(ROWS_PER_STATEMENT, _MAX_VALUES // width))
    full = n // per * per
    out: list[tuple[str, list[tuple[Any, ...]]]] = []
    if full:
        step = per * width
        groups = [tuple(flat[i : i + step]) for i in range(0, full * width, step)]
        out.append((", ".join([one] * per), groups))
    if full < n:
        out.append((", ".join([one] * (n - full)), [tuple(flat[full * width :])]))
    return out


# What a damaged SQLite file says (rather than a busy or missing one).
_DAMAGE = ("malformed", "not a database", "no such column", "no such table", "decode", "corrupt")
# While the key index of a whole dataset is built: SQLite's sorter may use this much
# memory (KiB; its default, 2 MiB, makes a 30M-key sort merge hundreds of runs) and
# helper threads.
_BUILD_CACHE_KIB = 256 * 1024
_BUILD_THREADS = 2
#: SQLite page cache (KiB) of a writer connection committing into an existing key
#: index (allocated as pages are touched; the default is 2 MiB): scattered keys dirty
#: a page of the index each, which in the default cache spill to the WAL before the
#: commit and are read back
COMMIT_CACHE_KIB = 64 * 1024


class SQLiteDialect:
    """The SQL of a SQLite catalog (see :class:`~shardcat.catalog.backend.Dialect`)."""

    text_holds_nul = True
    keeps_old_marker = True  # builds before schema version 4 read catalog_meta
    native_lookups = True  # sqlite3 read connections: readers.hot prepares on them
    batch_items = BatchItems(
        # CROSS JOIN: SQLite loops over the items, looking each up
        items="json_each(?) j",
        index="j.key",
        join="CROSS JOIN",
        key="j.value",
        at=("json_extract(j.value, '$[0]')", "json_extract(j.value, '$[1]')"),
    )
    index_names_sql = "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?"
    # records tables: no rowid (the primary key is the table), and the shard's rows
    # go with it
    records_options = " WITHOUT ROWID"
    shard_reference = "REFERENCES shardcat_shards (id) ON DELETE CASCADE"

    def prepare(self, sql: str) -> str:
        return sql

    def any_of(self, column: str, values: Sequence[Any]) -> tuple[str, Any]:
        return f"{column} IN (SELECT value FROM json_each(?))", json.dumps(list(values))

    def insert_rows(
        self,
        conn: Connection,
        table: str,
        names: Sequence[str],
        columns: Sequence[Sequence[Any]],
        n: int,
    ) -> None:
        quote = conn.dialect.identifier_preparer.quote
        head = f"INSERT INTO {quote(table)} ({', '.join(quote(c) for c in names)}) VALUES "
        for values, groups in value_groups(columns, n):
            conn.exec_driver_sql(head + values, groups if len(groups) > 1 else groups[0])

    @contextlib.contextmanager
    def index_build(self, conn: Connection) -> Iterator[None]:
        before = int(conn.exec_driver_sql("PRAGMA cache_size").scalar() or -2000)
        conn.exec_driver_sql(f"PRAGMA cache_size = -{_BUILD_CACHE_KIB}")
        conn.exec_driver_sql(f"PRAGMA threads = {_BUILD_THREADS}")
        try:
            yield
        finally:
            conn.exec_driver_sql(f"PRAGMA cache_size = {before}")
            conn.exec_driver_sql("PRAGMA threads = 0")

    def keyed_commit(self, conn: Connection) -> None:
        conn.exec_driver_sql(f"PRAGMA cache_size = -{COMMIT_CACHE_KIB}")

    def lock_wait(self, conn: Connection, seconds: float) -> None:
        # (on the DBAPI connection: a statement through SQLAlchemy would begin)
        conn.connection.driver_connection.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")  # type: ignore[union-attr]


DIALECT = SQLiteDialect()


def _on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see _on_begin)
    files.configure_writer(dbapi_conn)
    dbapi_conn.execute("PRAGMA foreign_keys = ON")


def _on_begin(conn: Any) -> None:
    # Writers take the write lock at BEGIN, so two writers never deadlock on
    # a lock upgrade; read-only work uses execution_options(immediate=False).
    immediate = conn.get_execution_options().get("immediate", True)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


class SQLiteBackend:
    """A catalog in the SQLite file ``file`` (see :class:`~shardcat.catalog.backend.Backend`)."""

    dialect = DIALECT
    one_writer = True
    read_options: Mapping[str, Any] = {"immediate": False}  # no write lock

    def __init__(self, file: Path) -> None:
        self.where: Path | str = file
        self.location = str(file)
        self.display = str(file)
        self.no_catalog = f"{file} is not a shardcat catalog (it records no schema version)"
        self.local_file: Path | None = file
        self.directory = str(file.parent)
        self._file = file

    def check_mode(self, *, immutable: bool) -> None:
        pass  # a file opens in every mode

    def before_write(self) -> None:
        """Refuse to turn a file that is not a catalog into one: anything but a missing
        or empty file, or a SQLite database holding ``catalog_meta``, is left
        untouched; warn when the file is on a network filesystem."""
        path = self._file
        if path.is_file() and path.stat().st_size > 0:
            uri = path.resolve().as_uri() + "?mode=ro"
            try:
                with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
                    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            except sqlite3.Error as exc:
                raise self.open_error(exc) from None
            if names and not names & {"shardcat_meta", schema.OLD_META}:  # (before version 4)
                raise CatalogError(
                    f"{path} is a SQLite database but not a shardcat catalog: refusing to add "
                    "the catalog's tables to it (give another catalog path)"
                )
        warn_if_network(path)

    def engine(self, *, keep_connection: bool = False) -> Engine:
        self._file.parent.mkdir(parents=True, exist_ok=True)
        engine = files.pooled_engine(
            f"sqlite+pysqlite:///{self._file}", keep_connection=keep_connection
        )
        event.listen(engine, "connect", _on_connect)
        event.listen(engine, "begin", _on_begin)
        return engine

    def read_connection(self, *, immutable: bool = False) -> ReadConnection:
        return files.connect_readonly(self._file, immutable=immutable)

    def read_engine(self, *, immutable: bool = False) -> Engine:
        """An engine on read-only connections (no pool), whose transactions are read
        transactions (one snapshot of the file each)."""
        file = self._file
        engine = create_engine(
            "sqlite+pysqlite://",
            creator=lambda: files.connect_readonly(file, immutable=immutable),
            poolclass=NullPool,
        )
        event.listen(engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN"))
        return engine

    def read_version(self, conn: ReadConnection) -> int | None:
        sql = "SELECT value FROM shardcat_meta WHERE name = 'schema_version'"
        try:
            row = conn.execute(sql).fetchone()
        except sqlite3.OperationalError as exc:
            if not str(exc).startswith("no such table"):
                raise
            try:  # a catalog older than version 4 kept it in catalog_meta
                row = conn.execute(sql.replace("shardcat_meta", schema.OLD_META)).fetchone()
            except sqlite3.OperationalError:
                return None
        return None if row is None else int(row[0])

    def open_error(self, exc: BaseException) -> CatalogError:
        return files.open_error(self._file, exc)

    def damage_error(self, exc: BaseException) -> CatalogError:
        reason = files.damage_reason(exc)
        message = f"cannot read catalog {self.display}: {reason}"
        if (
            not isinstance(exc, sqlite3.Error)
            or any(word in reason.lower() for word in _DAMAGE)
            or type(exc) is sqlite3.DatabaseError
        ):
            message += (
                f"; the file may be damaged: `catalog verify DATASET -c {self.display}` checks "
                "it (SQLite's quick_check) and says what is damaged; rebuild a damaged "
                "catalog by ingesting its shards into a new one"
            )
        return CatalogError(message)

    def quick_check(self, conn: ReadConnection) -> list[str]:
        return files.quick_check(conn)

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
        conn = reads()
        if not isinstance(conn, sqlite3.Connection):
            raise TypeError(f"a SQLite catalog reads through sqlite3, not {type(conn).__name__}")
        return streamed(conn, sql, params, attach=attach, timeout=timeout, memory=memory)

    def checkpoint(self, engine: Engine, *, wait: bool) -> bool:
        try:
            conn = engine.raw_connection()
            try:
                wait_ms = files.CHECKPOINT_BUSY_MS if wait else 0
                return files.checkpoint(conn.driver_connection, wait_ms)  # type: ignore[arg-type]
            finally:
                conn.close()
        except (DBAPIError, sqlite3.Error) as exc:
            raise CatalogError(f"cannot checkpoint {self.display}: {exc}") from None

    def close_files(self) -> None:
        files.close_wal(self._file)
