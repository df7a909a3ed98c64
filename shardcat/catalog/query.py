"""Read-only SQL over the catalog."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from shardcat.catalog import schema
from shardcat.errors import CatalogError

__all__ = ["STORAGE_DB_NAME", "QueryResult", "attached", "run_readonly"]

# The SQLite file that shardcat keeps inside a storage directory (TensorBlob,
# TensorDB): ``attach`` accepts such a directory in place of the file.
STORAGE_DB_NAME = ".shardcat.sqlite"

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


def _attach_target(name: str, path: str | os.PathLike[str]) -> Path:
    if not schema.IDENTIFIER.match(name) or name.lower() in ("main", "temp"):
        raise CatalogError(
            f"invalid attach name {name!r}: use letters, digits and '_' (not main or temp)"
        )
    target = Path(path).expanduser()
    if target.is_dir():
        target = target / STORAGE_DB_NAME
    if not target.is_file():
        raise CatalogError(f"cannot attach {name!r}: no SQLite database at {target}")
    return target.resolve()


@contextlib.contextmanager
def attached(
    conn: sqlite3.Connection, attach: Mapping[str, str | os.PathLike[str]] | None
) -> Iterator[None]:
    """ATTACH each ``name -> path`` read-only for the duration of the block, then DETACH.

    ``path`` is a SQLite file, or a TensorBlob/TensorDB directory (its
    ``.shardcat.sqlite``). Attaching happens before :func:`run_readonly`
    installs its authorizer (which refuses ``ATTACH`` in the user's SQL), and
    every database is attached with ``mode=ro``: nothing can be written.
    """
    targets = {name: _attach_target(name, path) for name, path in (attach or {}).items()}
    done: list[str] = []
    try:
        for name, target in targets.items():
            try:
                conn.execute(f'ATTACH DATABASE ? AS "{name}"', (target.as_uri() + "?mode=ro",))
            except sqlite3.Error as exc:
                raise CatalogError(f"cannot attach {name!r} ({target}): {exc}") from None
            done.append(name)
        yield
    finally:
        for name in reversed(done):
            conn.execute(f'DETACH DATABASE "{name}"')
