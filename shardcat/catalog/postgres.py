"""A catalog on a PostgreSQL server: what differs from a SQLite file.

The schema, the ingest's transactions and the readers' statements are the
same SQL (SQLAlchemy Core, or statement text written for both); this module
holds the few places where a server needs something else:

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
- **read-only queries** (:func:`run_readonly`): a ``READ ONLY`` transaction
  on a connection whose ``default_transaction_read_only`` is on, with a
  ``statement_timeout``, rolled back after the rows are read.
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.engine import URL, make_url

from shardcat.catalog.processes import interruption
from shardcat.errors import CatalogError

__all__ = [
    "INSTALL_HINT",
    "ServerConnection",
    "any_of",
    "copy_rows",
    "display",
    "driver_sql",
    "index_names",
    "is_server_url",
    "on_begin",
    "run_readonly",
]

INSTALL_HINT = "pip install 'shardcat[postgres]'"
_SCHEME = re.compile(r"^(postgresql|postgres)(\+[a-z0-9_]+)?://", re.IGNORECASE)
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
    ``close``)."""

    def __init__(self, where: str) -> None:
        psycopg = psycopg_module()
        url = engine_url(where)
        self.where = where
        try:
            self._conn = psycopg.connect(
                url.set(drivername="postgresql").render_as_string(hide_password=False),
                autocommit=True,
                options="-c default_transaction_read_only=on",
                client_encoding="utf8",
            )
        except psycopg.Error as exc:
            raise connect_error(where, exc) from None
        self._idle = psycopg.pq.TransactionStatus.IDLE
        self.pid = os.getpid()

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Any:
        if sql == "BEGIN":
            sql = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        if params:
            return self._conn.execute(translate(sql), params)
        return self._conn.execute(sql)

    @property
    def in_transaction(self) -> bool:
        return bool(self._conn.info.transaction_status != self._idle)

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


def index_names(conn: Any, table: str) -> set[str]:
    """The indexes on ``table`` (a SQLAlchemy connection to the server)."""
    rows = conn.exec_driver_sql(
        "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = %s",
        (table,),
    )
    return {r[0] for r in rows}


def run_readonly(
    conn: ServerConnection,
    sql: str,
    params: Sequence[Any] | Mapping[str, Any] | None,
    timeout: float | None,
) -> tuple[list[tuple[Any, ...]], list[str]]:
    """One statement in a read-only transaction, stopped after ``timeout`` seconds;
    ``(rows, column names)``. Parameters are written as on SQLite: ``?`` (a sequence)
    or ``:name`` (a mapping)."""
    psycopg = psycopg_module()
    raw = conn._conn
    if conn.in_transaction:
        raw.execute("COMMIT")
    started = time.monotonic()
    try:
        with raw.transaction(force_rollback=True):
            raw.execute("SET TRANSACTION READ ONLY")
            limit = 0 if timeout is None else max(1, int(timeout * 1000))
            raw.execute(f"SET LOCAL statement_timeout = {limit}")
            if isinstance(params, Mapping):
                cursor = raw.execute(translate_named(sql), dict(params))
            elif params:
                cursor = raw.execute(translate(sql), list(params))
            else:
                cursor = raw.execute(sql)
            rows = [tuple(r) for r in cursor.fetchall()] if cursor.description else []
            return rows, [d.name for d in cursor.description or ()]
    except psycopg.errors.QueryCanceled:
        if timeout is not None and time.monotonic() - started >= timeout * 0.9:
            raise CatalogError(
                f"query exceeded its time limit of {timeout:g} s; "
                "pass --timeout/timeout= to allow more"
            ) from None
        raise interruption() from None  # Ctrl-C, or SIGTERM/SIGHUP: what came
    except psycopg.errors.ReadOnlySqlTransaction:
        raise CatalogError(
            "query failed: the catalog is read-only here: only SELECT statements are allowed"
        ) from None
    except psycopg.Error as exc:
        raise CatalogError(f"query failed: {str(exc).strip()}") from None


def driver_sql(conn: Any, sql: str) -> str:
    """Statement text written with ``?`` placeholders, for ``conn.exec_driver_sql``."""
    return translate(sql) if conn.dialect.name == "postgresql" else sql


def any_of(conn: Any, column: str, values: Sequence[Any]) -> tuple[str, Any]:
    """``column`` is one of ``values``: the condition (one ``?`` placeholder) and its
    parameter, one parameter however many values (SQLite: a JSON array)."""
    if conn.dialect.name == "postgresql":
        return f"{column} = ANY(?)", list(values)
    return f"{column} IN (SELECT value FROM json_each(?))", json.dumps(list(values))
