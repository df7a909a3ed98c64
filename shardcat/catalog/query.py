"""Read-only SQL over the catalog."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from shardcat.errors import CatalogError

__all__ = ["QueryResult", "run_readonly"]

# What a read-only statement may do (sqlite3 authorizer action codes).
_ALLOWED = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}


def _authorize(action: int, *_args: Any) -> int:
    return sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY


class QueryResult(list[tuple[Any, ...]]):
    """The rows of a query (a list of tuples) with ``columns``, their names."""

    def __init__(self, rows: list[tuple[Any, ...]], columns: list[str]) -> None:
        super().__init__(rows)
        self.columns = columns


def run_readonly(
    conn: sqlite3.Connection, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None
) -> QueryResult:
    """Run one SELECT on a read-only connection; anything else is refused.

    Two guards: the connection is opened read-only (``mode=ro`` and
    ``query_only``), and an authorizer denies every action but reading, so
    neither a write nor ``ATTACH`` nor a ``PRAGMA`` gets through.
    """
    conn.set_authorizer(_authorize)
    try:
        cursor = conn.execute(sql, params or ())
        rows = cursor.fetchall()
        columns = [d[0] for d in cursor.description or ()]
    except sqlite3.DatabaseError as exc:
        message = str(exc)
        if "not authorized" in message or "readonly" in message:
            message = "the catalog is read-only here: only SELECT statements are allowed"
        raise CatalogError(f"query failed: {message}") from None
    except (sqlite3.ProgrammingError, sqlite3.Warning) as exc:
        raise CatalogError(f"query failed: {exc}") from None
    finally:
        conn.set_authorizer(None)
    return QueryResult(rows, columns)
