"""The PostgreSQL backend: a catalog on a server, what differs from a SQLite file
(the interface: :mod:`~shardcat.catalog.backend`; :class:`PostgresBackend`,
:class:`PostgresDialect`).

The schema, the ingest's transactions and the readers' statements are the
same SQL (SQLAlchemy Core, or statement text written for both with ``?``
placeholders); this module holds the places where a server needs something else:

- **the URL**: ``postgresql://`` / ``postgres://`` / ``postgresql+psycopg://``
  (:func:`is_server_url`); the driver is psycopg 3 (the ``postgres`` extra).
  Messages show the URL without its password (:func:`display`).
- **writers** (:func:`on_begin`): every write transaction first takes
  one transaction-level advisory lock of the catalog's, so commits run one at a
  time, as SQLite's ``BEGIN IMMEDIATE`` makes them on a file (a commit
  recomputes the positions of every shard of its dataset: two at once could
  interleave). Scans run in parallel on every host; a commit holds the lock for
  its ``COPY`` and a few updates. Claims take no such lock: they lock the one
  shard row they take with ``FOR UPDATE SKIP LOCKED`` (see
  :mod:`~shardcat.catalog.claims`). Connections never cross ``fork``.
- **the readers' connection** (:class:`ServerConnection`): a psycopg
  connection behind the two calls the readers make of a ``sqlite3`` connection
  (``execute(sql, params)`` and ``in_transaction``). Statements are written
  with ``?`` placeholders and translated once; psycopg prepares a statement on
  the server after a few executions. A read snapshot is a ``REPEATABLE READ
  READ ONLY`` transaction, so the lookups within one snapshot agree, as on SQLite.
- **bulk rows** go through ``COPY ... FROM STDIN`` (:func:`copy_rows`).
- **read-only queries** (:func:`streamed`): one statement on its own
  connection, in a ``READ ONLY`` transaction with a ``statement_timeout`` it
  cannot lift, streamed to the client.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine import URL, make_url

from shardcat.catalog.engine import damage_reason, pooled_engine
from shardcat.catalog.lookup import BatchItems, ReadConnection
from shardcat.catalog.processes import interruption
from shardcat.catalog.query import Rows
from shardcat.errors import MORE_TIME, CatalogError

__all__ = [
    "DIALECT",
    "INSTALL_HINT",
    "PostgresBackend",
    "PostgresDialect",
    "ServerConnection",
    "copy_rows",
    "display",
    "is_server_url",
    "on_begin",
    "streamed",
]

INSTALL_HINT = "pip install 'shardcat[postgres]'"
_SCHEME = re.compile(r"^(postgresql|postgres)(\+[a-z0-9_]+)?://", re.IGNORECASE)
# How often a reader's lost connection is reopened, and the first pause between tries
# (doubling: about 3 s in all, a server restart's time).
RECONNECTS = 6
RECONNECT_PAUSE = 0.1
# The advisory lock every write transaction takes (an arbitrary 64-bit number: "shardcat").
WRITER_LOCK = 0x7368617264636174


def is_server_url(where: object) -> bool:
    """Whether ``where`` names a PostgreSQL catalog (else it is a SQLite file)."""
    return isinstance(where, str) and bool(_SCHEME.match(where))


def engine_url(where: str) -> URL:
    """The SQLAlchemy URL of a server catalog, with psycopg 3 as its driver."""
    match = _SCHEME.match(where)
    if match is None or (match.group(2) or "+psycopg").lower() != "+psycopg":
        raise CatalogError(
            f"catalog URL {display(where)}: only the psycopg (3) driver is supported, "
            "use postgresql:// or postgresql+psycopg://"
        )
    return make_url("postgresql+psycopg://" + where[match.end() :])


def display(where: str) -> str:
    """A catalog's name for messages: a URL without its password."""
    if not is_server_url(where):
        return where
    try:
        return make_url(where).render_as_string(hide_password=True)
    except Exception:  # a malformed URL: shown as given, minus what comes before '@'
        return where.split("@")[-1]


def psycopg_module() -> Any:
    try:
        import psycopg
    except ImportError:
        raise CatalogError(f"a PostgreSQL catalog needs psycopg 3: {INSTALL_HINT}") from None
    return psycopg


def connect_error(where: str, exc: BaseException) -> CatalogError:
    reason = str(getattr(exc, "orig", None) or exc).strip()
    return CatalogError(f"cannot open catalog {display(where)}: {reason}")


def on_begin(conn: Any) -> None:
    """Every write transaction but a claim first takes the writer lock (see the module
    docstring)."""
    options = conn.get_execution_options()
    if options.get("immediate", True) and not options.get("claim", False):
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({WRITER_LOCK})")


@functools.lru_cache(maxsize=512)
def translate(sql: str) -> str:
    """A statement written with ``?`` placeholders, in psycopg's ``%s`` style."""
    return sql.replace("%", "%%").replace("?", "%s")


_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def translate_named(sql: str) -> str:
    """A statement with ``:name`` placeholders (SQLite's) in psycopg's ``%(name)s``
    style (``::`` casts are left alone)."""
    return _NAMED.sub(r"%(\1)s", sql.replace("%", "%%"))


class ServerConnection:
    """The readers' read-only connection to a server catalog, shaped like the
    ``sqlite3`` connection they use on a file (``execute``, ``in_transaction``,
    ``close``).

    A lost connection (a server restart or failover, a killed backend) is
    reopened, up to ``RECONNECTS`` times with a doubling pause: a snapshot
    being begun or ended just begins on the new connection; a statement inside
    a snapshot fails as a :class:`CatalogError` (its snapshot is gone: a reader
    must not mix it with a newer one) and the next snapshot reconnects. Any
    other database error is a :class:`CatalogError` naming the catalog.
    """

    def __init__(self, where: str) -> None:
        self._psycopg = psycopg_module()
        self.where = where
        self._url = engine_url(where).set(drivername="postgresql")
        self._conn = self._connect()
        self._idle = self._psycopg.pq.TransactionStatus.IDLE
        self.pid = os.getpid()

    def _connect(self) -> Any:
        try:
            return self._psycopg.connect(
                self._url.render_as_string(hide_password=False),
                autocommit=True,
                options="-c default_transaction_read_only=on",
                client_encoding="utf8",
            )
        except self._psycopg.Error as exc:
            raise connect_error(self.where, exc) from None

    def _lost(self) -> bool:
        return bool(self._conn.closed or self._conn.broken)

    def _reconnect(self) -> None:
        """A new connection in place of a lost one (bounded retries with backoff)."""
        pause = RECONNECT_PAUSE
        for attempt in range(RECONNECTS):
            with contextlib.suppress(self._psycopg.Error):
                self._conn.close()
            try:
                self._conn = self._connect()
                return
            except CatalogError:
                if attempt == RECONNECTS - 1:
                    raise
                time.sleep(pause)
                pause *= 2

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Any:
        if sql == "BEGIN":
            sql = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        if self._lost():
            self._reconnect()
        try:
            if params:
                return self._conn.execute(translate(sql), params)
            return self._conn.execute(sql)
        except self._psycopg.Error as exc:
            if not self._lost():
                raise CatalogError(f"catalog {display(self.where)}: {str(exc).strip()}") from None
            if sql == "COMMIT":  # the snapshot it ends is gone with the connection
                return None
            if sql.startswith("BEGIN"):  # nothing read yet: begin on a new connection
                self._reconnect()
                return self._conn.execute(sql)
            raise CatalogError(
                f"lost the connection to catalog {display(self.where)} during a read "
                f"({str(exc).strip()}); the next read reconnects"
            ) from None

    @property
    def in_transaction(self) -> bool:
        return not self._lost() and self._conn.info.transaction_status != self._idle

    def close(self) -> None:
        if self.pid == os.getpid():
            self._conn.close()


def copy_rows(
    dbapi_conn: Any, table: str, columns: Sequence[str], rows: Sequence[tuple[Any, ...]]
) -> None:
    """``COPY table (columns) FROM STDIN`` of the rows, on the transaction's connection.
    A failure is raised as SQLAlchemy's error of that kind (a duplicate key: its
    ``IntegrityError``), as if SQLAlchemy had run the statement."""
    from sqlalchemy import exc as sql_exc

    psycopg = psycopg_module()
    cols = ", ".join(f'"{c}"' for c in columns)
    statement = f'COPY "{table}" ({cols}) FROM STDIN'
    try:
        with dbapi_conn.cursor() as cursor, cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row(row)
    except psycopg.IntegrityError as error:
        raise sql_exc.IntegrityError(statement, None, error) from None
    except psycopg.Error as error:
        raise sql_exc.DBAPIError(statement, None, error) from None


@contextlib.contextmanager
def streamed(
    where: str,
    sql: str,
    params: Sequence[Any] | Mapping[str, Any] | None,
    timeout: float | None,
    memory: int | None,
) -> Iterator[tuple[list[str], Iterator[tuple[Any, ...]]]]:
    """One statement, read-only, stopped after ``timeout`` seconds; yields the column
    names and the rows, streamed from the server as they are iterated. Parameters
    are written as on SQLite: ``?`` (a sequence) or ``:name`` (a mapping).

    What keeps it from writing or lifting its limits: its own connection, closed
    after it (nothing it sets or locks for the session outlives it), with
    ``default_transaction_read_only`` and ``statement_timeout`` set at connect;
    a ``READ ONLY`` transaction with ``SET LOCAL statement_timeout``; the
    extended query protocol, so the text is one statement (``SELECT 1; COMMIT;
    ...`` is refused by the server); and a cancel from this process when the
    time is up, whatever the statement changed. ``memory`` bounds ``work_mem``
    (per sort or hash on the server).
    """
    psycopg = psycopg_module()
    ms = 0 if timeout is None else max(1, int(timeout * 1000))
    settings = f"-c default_transaction_read_only=on -c statement_timeout={ms}"
    try:
        conn = psycopg.connect(
            engine_url(where).set(drivername="postgresql").render_as_string(hide_password=False),
            autocommit=True,
            options=settings,
            client_encoding="utf8",
        )
    except psycopg.Error as exc:
        raise connect_error(where, exc) from None
    timer = None if timeout is None else threading.Timer(timeout, _cancel, (conn,))
    started = time.monotonic()
    try:
        with _query_errors(psycopg, timeout, started):
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            conn.execute(f"SET LOCAL statement_timeout = {ms}")
            if memory is not None:
                conn.execute(f"SET LOCAL work_mem = '{max(64, min(memory // 4, 2**30) // 1024)}kB'")
            if timer is not None:
                timer.start()
            if isinstance(params, Mapping):
                sql, params = translate_named(sql), dict(params)
            elif params:
                sql, params = translate(sql), list(params)
            cursor = conn.cursor()
            rows = cursor.stream(sql, params or None, size=256)
            first = next(rows, None)  # the statement runs: its errors come now
            columns = [d.name for d in cursor.description or ()]
            yield columns, _rows(first, rows, psycopg, timeout, started)
    finally:
        if timer is not None:
            timer.cancel()
        conn.close()


def _rows(
    first: tuple[Any, ...] | None,
    rest: Iterator[Any],
    psycopg: Any,
    timeout: float | None,
    started: float,
) -> Iterator[tuple[Any, ...]]:
    if first is None:
        return
    yield tuple(first)
    with _query_errors(psycopg, timeout, started):
        for row in rest:
            yield tuple(row)


def _cancel(conn: Any) -> None:
    with contextlib.suppress(Exception):  # the query may have ended meanwhile
        conn.cancel_safe(timeout=5)


@contextlib.contextmanager
def _query_errors(psycopg: Any, timeout: float | None, started: float) -> Iterator[None]:
    """The server's errors of a query as :class:`CatalogError` (a cancel before the
    time limit is Ctrl-C: ``KeyboardInterrupt``)."""
    try:
        yield
    except psycopg.errors.QueryCanceled:
        if timeout is not None and time.monotonic() - started >= timeout * 0.9:
            raise CatalogError(
                f"query exceeded its time limit of {timeout:g} s;",
                hint=MORE_TIME,
            ) from None
        raise interruption() from None  # Ctrl-C, or SIGTERM/SIGHUP: what came
    except psycopg.errors.ReadOnlySqlTransaction:
        raise CatalogError(
            "query failed: the catalog is read-only here: only SELECT statements are allowed"
        ) from None
    except psycopg.Error as exc:
        message = str(exc).strip()
        if "multiple commands" in message:
            message = "only one statement may run at a time"
        raise CatalogError(f"query failed: {message}") from None


class PostgresDialect:
    """The SQL of a PostgreSQL catalog (see :class:`~shardcat.catalog.backend.Dialect`)."""

    text_holds_nul = False  # PostgreSQL text cannot hold NUL
    keeps_old_marker = False  # no build before schema version 4 ran on a server
    native_lookups = False  # no sqlite3 connection to prepare on
    batch_items = BatchItems(
        items="jsonb_array_elements(CAST(? AS jsonb)) WITH ORDINALITY j(value, n)",
        index="j.n - 1",
        join="JOIN",
        key="j.value #>> '{}'",
        at=("CAST(j.value ->> 0 AS INTEGER)", "CAST(j.value ->> 1 AS BIGINT)"),
    )
    index_names_sql = (
        "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = ?"
    )
    # no foreign key from a records table: its check is a trigger per row, which made
    # COPY 3x slower (0.63 s against 0.18-0.21 s for 100k rows); the store deletes a
    # shard's records itself before the shard's row (sync.clear_shards)
    records_options = ""
    shard_reference = ""

    def prepare(self, sql: str) -> str:
        return translate(sql)

    def any_of(self, column: str, values: Sequence[Any]) -> tuple[str, Any]:
        return f"{column} = ANY(?)", list(values)

    def insert_rows(
        self,
        conn: Connection,
        table: str,
        names: Sequence[str],
        columns: Sequence[Sequence[Any]],
        n: int,
    ) -> None:
        copy_rows(conn.connection.driver_connection, table, names, list(zip(*columns, strict=True)))

    @contextlib.contextmanager
    def index_build(self, conn: Connection) -> Iterator[None]:
        yield  # the server sorts with its own maintenance_work_mem

    def keyed_commit(self, conn: Connection) -> None:
        pass  # the server's shared buffers hold the index pages

    def lock_wait(self, conn: Connection, seconds: float) -> None:
        pass  # claims lock rows (FOR UPDATE SKIP LOCKED): nothing to wait for


DIALECT = PostgresDialect()


class PostgresBackend:
    """A catalog on the PostgreSQL server ``url`` names (see
    :class:`~shardcat.catalog.backend.Backend`)."""

    dialect = DIALECT
    one_writer = False  # writers take the advisory lock per commit only (on_begin)
    read_options: Mapping[str, Any] = {
        "immediate": False,  # nor the writer lock
        "isolation_level": "REPEATABLE READ",
        "postgresql_readonly": True,
    }
    local_file: Path | None = None
    directory = ""  # shard paths are stored absolute

    def __init__(self, url: str) -> None:
        self.where: Path | str = url
        self.location = url
        self.display = display(url)
        self.no_catalog = f"no catalog at {self.display} (it has no shardcat tables)"

    def check_mode(self, *, immutable: bool) -> None:
        if immutable:
            raise CatalogError(
                f"immutable=True is for SQLite files; {self.display} is a server "
                "(write a snapshot for readers that must not touch it: `catalog snapshot`)"
            )

    def before_write(self) -> None:
        pass  # the server says what it refuses

    def engine(self, *, keep_connection: bool = False) -> Engine:
        psycopg_module()  # the install hint when psycopg is missing
        # text comes back as str whatever the server database's encoding
        engine = pooled_engine(
            engine_url(self.location),
            keep_connection=keep_connection,
            connect_args={"client_encoding": "utf8"},
        )
        event.listen(engine, "begin", on_begin)
        return engine

    def read_connection(self, *, immutable: bool = False) -> ReadConnection:
        return ServerConnection(self.location)

    def read_engine(self, *, immutable: bool = False) -> Engine:
        return self.engine()

    def read_version(self, conn: ReadConnection) -> int | None:
        found = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = ?",
            ("shardcat_meta",),
        ).fetchone()[0]
        sql = "SELECT value FROM shardcat_meta WHERE name = 'schema_version'"
        row = conn.execute(sql).fetchone() if found else None
        return None if row is None else int(row[0])

    def open_error(self, exc: BaseException) -> CatalogError:
        return connect_error(self.location, exc)

    def damage_error(self, exc: BaseException) -> CatalogError:
        return CatalogError(f"cannot read catalog {self.display}: {damage_reason(exc)}")

    def quick_check(self, conn: ReadConnection) -> list[str]:
        return []  # the server checks its own pages

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
        if attach:
            raise CatalogError(
                f"attach= is for SQLite catalogs; {self.display} is a server catalog"
            )
        return streamed(self.location, sql, params, timeout, memory)

    def checkpoint(self, engine: Engine, *, wait: bool) -> bool:
        return True  # the server keeps its own log

    def close_files(self) -> None:
        pass
