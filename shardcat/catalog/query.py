"""Read-only SQL over the catalog: the authorizer, its function allow-list, the
time limit / Ctrl-C handling of a running statement and its memory limit."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from shardcat.catalog import schema
from shardcat.catalog.names import DEFAULT_QUERY_MEMORY, DEFAULT_QUERY_TIMEOUT
from shardcat.catalog.processes import interruption
from shardcat.errors import MORE_TIME, CatalogError, Hint

__all__ = [
    "ALLOWED_FUNCTIONS",
    "DEFAULT_QUERY_MEMORY",
    "DEFAULT_QUERY_TIMEOUT",
    "QueryResult",
    "Rows",
    "attached",
    "check_limits",
    "collect",
    "run_readonly",
    "streamed",
]


# SQLite's limit on the length of a string or blob (sqlite3.SQLITE_LIMIT_LENGTH)
_LENGTH = 0
# The progress handler (time limit, Ctrl-C) runs every this many VM instructions:
# well under a millisecond apart, and too rare to cost anything measurable.
_PROGRESS_STEPS = 10_000

# What a read-only statement may do (sqlite3 authorizer action codes); functions
# are checked by name against ALLOWED_FUNCTIONS. Everything else is denied:
# writes, ATTACH, PRAGMA (also the table-valued pragma_* functions), transactions.
_ALLOWED = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}

# SQLite's built-in scalar, aggregate, window, date/time, JSON and math functions
# (https://www.sqlite.org/lang_corefunc.html and the pages it links; names newer
# than the linked SQLite are harmless: they fail as "no such function"). Left out
# on purpose: load_extension, fts3_tokenizer (reads and writes raw pointers),
# sqlite_log, the FTS/R-tree helpers and any function an application registers.
# fmt: off
ALLOWED_FUNCTIONS = frozenset(
    {
        # core scalar
        "abs", "changes", "char", "coalesce", "concat", "concat_ws", "format", "glob",
        "hex", "if", "ifnull", "iif", "instr", "last_insert_rowid", "length", "like",
        "likelihood", "likely", "lower", "ltrim", "max", "min", "nullif", "octet_length",
        "printf", "quote", "random", "randomblob", "replace", "round", "rtrim", "sign",
        "soundex", "sqlite_compileoption_get", "sqlite_compileoption_used",
        "sqlite_offset", "sqlite_source_id", "sqlite_version", "substr", "substring",
        "total_changes", "trim", "typeof", "unhex", "unicode", "unistr", "unistr_quote",
        "unlikely", "upper", "zeroblob",
        # aggregate
        "avg", "count", "group_concat", "median", "percentile", "percentile_cont",
        "percentile_disc", "string_agg", "sum", "total",
        # window
        "cume_dist", "dense_rank", "first_value", "lag", "last_value", "lead",
        "nth_value", "ntile", "percent_rank", "rank", "row_number",
        # date and time
        "current_date", "current_time", "current_timestamp", "date", "datetime",
        "julianday", "strftime", "time", "timediff", "unixepoch",
        # JSON
        "->", "->>", "json", "json_array", "json_array_length", "json_error_position",
        "json_extract", "json_group_array", "json_group_object", "json_insert",
        "json_object", "json_patch", "json_pretty", "json_quote", "json_remove",
        "json_replace", "json_set", "json_type", "json_valid", "jsonb", "jsonb_array",
        "jsonb_extract", "jsonb_group_array", "jsonb_group_object", "jsonb_insert",
        "jsonb_object", "jsonb_patch", "jsonb_remove", "jsonb_replace", "jsonb_set",
        # math
        "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "ceil", "ceiling",
        "cos", "cosh", "degrees", "exp", "floor", "ln", "log", "log10", "log2", "mod",
        "pi", "pow", "power", "radians", "sin", "sinh", "sqrt", "tan", "tanh", "trunc",
    }
)
# fmt: on


class _Guard:
    """The authorizer and progress handler of one statement, and what they saw."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.denied_function: str | None = None
        self.timed_out = False
        self.interrupted: KeyboardInterrupt | None = None  # (SIGTERM's too: a subclass)

    def authorize(self, action: int, _arg1: Any, arg2: Any, *_rest: Any) -> int:
        try:
            if action == sqlite3.SQLITE_FUNCTION:  # arg2: the function's name
                if str(arg2).lower() in ALLOWED_FUNCTIONS:
                    return sqlite3.SQLITE_OK
                if self.denied_function is None:
                    self.denied_function = str(arg2)
                return sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY
        except KeyboardInterrupt as exc:  # sqlite3 would swallow it: remember it
            self.interrupted = exc
            return sqlite3.SQLITE_DENY

    def progress(self) -> int:
        # Ctrl-C raises KeyboardInterrupt in here (the only Python code that runs
        # while SQLite works); sqlite3 would swallow it, so it is remembered and
        # the statement stopped. Non-zero stops the statement ("interrupted").
        try:
            if self.deadline is not None and time.monotonic() > self.deadline:
                self.timed_out = True
                return 1
            return 0
        except KeyboardInterrupt as exc:
            self.interrupted = exc
            return 1


class QueryResult(list[tuple[Any, ...]]):
    """The rows of a query (a list of tuples) with ``columns``, their names."""

    def __init__(self, rows: list[tuple[Any, ...]], columns: list[str]) -> None:
        super().__init__(rows)
        self.columns = columns


#: a streamed result: the column names and the rows, fetched as they are iterated
Rows = tuple[list[str], Iterator[tuple[Any, ...]]]


def check_limits(timeout: float | None, memory: int | None) -> None:
    if timeout is not None and not timeout > 0:
        raise CatalogError(f"timeout must be a positive number of seconds or None, not {timeout}")
    if memory is not None and not memory > 0:
        raise CatalogError(f"memory must be a positive number of bytes or None, not {memory}")


def over_memory(memory: int) -> CatalogError:
    return CatalogError(
        f"query exceeded its memory limit of {memory / 2**20:g} MB;",
        hint=Hint.naming(
            "--memory/memory=",
            "--memory",
            before="pass ",
            after=" to allow more (--csv and --json stream rows: only one value must fit)",
        ),
    )


def over_time(timeout: float) -> CatalogError:
    return CatalogError(f"query exceeded its time limit of {timeout:g} s;", hint=MORE_TIME)


def _size(row: tuple[Any, ...]) -> int:
    """About what a fetched row costs in memory (CPython objects, 64-bit)."""
    return 56 + sum(
        49 + len(v) if isinstance(v, (str, bytes)) else 32 for v in row if v is not None
    )


def collect(rows: Iterator[tuple[Any, ...]], memory: int | None) -> list[tuple[Any, ...]]:
    """Every row of ``rows``, stopped with :class:`CatalogError` once they would hold
    more than ``memory`` bytes (None: no limit)."""
    if memory is None:
        return list(rows)
    out, used = [], 0
    for row in rows:
        used += _size(row)
        if used > memory:
            raise over_memory(memory)
        out.append(row)
    return out


@contextlib.contextmanager
def streamed(
    conn: sqlite3.Connection,
    sql: str,
    params: Sequence[Any] | Mapping[str, Any] | None = None,
    *,
    attach: Mapping[str, str | os.PathLike[str]] | None = None,
    timeout: float | None = DEFAULT_QUERY_TIMEOUT,
    memory: int | None = DEFAULT_QUERY_MEMORY,
) -> Iterator[Rows]:
    """Run one SELECT on a read-only connection; anything else is refused. Yields the
    column names and the rows, fetched as they are iterated.

    Two guards: the connection is opened read-only (``mode=ro`` and
    ``query_only``), and an authorizer denies every action but reading and
    calling the functions in :data:`ALLOWED_FUNCTIONS` (in views too), so
    neither a write nor ``ATTACH`` nor a ``PRAGMA`` nor ``fts3_tokenizer`` gets
    through. A statement still running after ``timeout`` seconds (None: no
    limit) is stopped with :class:`CatalogError`; Ctrl-C stops it with
    ``KeyboardInterrupt``. No value may be longer than ``memory`` bytes (SQLite's
    length limit: a string or blob built past it stops the statement; sorts and
    temporary tables spill to temporary files). ``attach``: see :func:`attached`.
    The connection is left as it was.
    """
    with attached(conn, attach), _guarded(conn, timeout, memory) as guard:
        try:
            cursor = conn.execute(sql, params or ())
        except sqlite3.Error as exc:
            raise _failed(guard, exc, memory) from None
        yield [d[0] for d in cursor.description or ()], _fetched(cursor, guard, memory)


@contextlib.contextmanager
def _guarded(
    conn: sqlite3.Connection, timeout: float | None, memory: int | None
) -> Iterator[_Guard]:
    """The authorizer, progress handler and length limit of one statement on ``conn``."""
    check_limits(timeout, memory)
    guard = _Guard(timeout)
    set_limit: Any = getattr(conn, "setlimit", None)  # (Python 3.11+)
    length = None if set_limit is None or memory is None else set_limit(_LENGTH, memory)
    conn.set_authorizer(guard.authorize)
    conn.set_progress_handler(guard.progress, _PROGRESS_STEPS)
    try:
        yield guard
    finally:
        conn.set_progress_handler(None, 0)
        conn.set_authorizer(None)
        if length is not None:
            set_limit(_LENGTH, length)


def _fetched(
    cursor: sqlite3.Cursor, guard: _Guard, memory: int | None
) -> Iterator[tuple[Any, ...]]:
    while True:
        try:
            rows = cursor.fetchmany(256)
        except sqlite3.Error as exc:
            raise _failed(guard, exc, memory) from None
        if not rows:
            return
        yield from rows


def run_readonly(
    conn: sqlite3.Connection,
    sql: str,
    params: Sequence[Any] | Mapping[str, Any] | None = None,
    *,
    timeout: float | None = DEFAULT_QUERY_TIMEOUT,
    memory: int | None = DEFAULT_QUERY_MEMORY,
) -> QueryResult:
    """:func:`streamed`, its rows collected: at most ``memory`` bytes of them."""
    with streamed(conn, sql, params, timeout=timeout, memory=memory) as (columns, rows):
        return QueryResult(collect(rows, memory), columns)


def _failed(guard: _Guard, exc: sqlite3.Error, memory: int | None) -> BaseException:
    if isinstance(exc, (sqlite3.ProgrammingError, sqlite3.Warning)):
        return CatalogError(f"query failed: {exc}")
    if memory is not None and isinstance(exc, sqlite3.DataError) and "too big" in str(exc):
        return over_memory(memory)
    if isinstance(exc, sqlite3.DatabaseError):
        return _query_error(guard, exc)
    return CatalogError(f"query failed: {exc}")


def _query_error(guard: _Guard, exc: sqlite3.DatabaseError) -> BaseException:
    message = str(exc)
    if guard.timed_out and guard.timeout is not None:
        return over_time(guard.timeout)
    if guard.interrupted is not None or message == "interrupted":
        # "interrupted" without a timeout: Ctrl-C came at the progress handler's
        # very first instruction, before its try, and sqlite3 swallowed it there.
        return guard.interrupted or interruption()
    if guard.denied_function is not None and "not authorized" in message:
        return CatalogError(
            f"query failed: function {guard.denied_function}() is not allowed in a "
            "read-only query (only SQLite's built-in scalar, aggregate, window, "
            "date/time, JSON and math functions are)"
        )
    if "not authorized" in message or "readonly" in message:
        message = "the catalog is read-only here: only SELECT statements are allowed"
    return CatalogError(f"query failed: {message}")


def _attach_target(name: str, path: str | os.PathLike[str]) -> Path:
    if not schema.IDENTIFIER.match(name) or name.lower() in ("main", "temp"):
        raise CatalogError(
            f"invalid attach name {name!r}: use letters, digits and '_' (not main or temp)"
        )
    target = Path(path).expanduser()
    if not target.is_file():
        raise CatalogError(f"cannot attach {name!r}: no SQLite database at {target}")
    return target.resolve()


@contextlib.contextmanager
def attached(
    conn: sqlite3.Connection, attach: Mapping[str, str | os.PathLike[str]] | None
) -> Iterator[None]:
    """ATTACH each ``name -> path`` read-only for the duration of the block, then DETACH.

    ``path`` is a SQLite file (the facade maps a TensorBlob/TensorDB directory to
    its own file first). Attaching happens before :func:`run_readonly`
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
