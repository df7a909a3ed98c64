"""TensorDB: tensorblob's row-aligned multi-field storage, with SQL over its rows."""

from __future__ import annotations

import io
import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import repeat
from pathlib import Path
from typing import Any

import torch

from shardcat.catalog.query import QueryResult, run_readonly
from shardcat.errors import DuplicateKeyError, KeyNotFoundError
from shardcat.storage.base import Chunk, Storage
from shardcat.storage.column import parse_dtype, parse_shape
from shardcat.storage.meta import FieldSpec, Layout, Metadata, create_index, index_name, quote

__all__ = ["TensorColumn", "TensorDB"]

_RESERVED = {"position", "key", "rowid", "oid", "_rowid_"}
BULK_ROWS = 100_000  # appends this large rebuild the SQL indexes instead of updating them
_SQL_OPTIONS = {"filter", "index"}


def _field_spec(name: Any, spec: Any) -> FieldSpec:
    if (
        not isinstance(name, str)
        or not name
        or name.startswith(".")
        or "/" in name
        or os.sep in name
        or (os.altsep and os.altsep in name)
        or "\0" in name
    ):
        raise ValueError(f"Invalid field name: {name!r}")
    if not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3):
        raise ValueError(f"field {name!r}: expected (dtype, shape) or (dtype, shape, options)")
    dtype, shape = parse_dtype(spec[0]), parse_shape(spec[1])
    options = dict(spec[2]) if len(spec) == 3 else {}
    unknown = set(options) - _SQL_OPTIONS
    if unknown:
        raise ValueError(
            f"field {name!r}: unknown options {sorted(unknown)}; use 'filter' or 'index'"
        )
    sql = "index" if options.get("index") else "filter" if options.get("filter") else None
    if sql is not None:
        if shape not in ((), (1,)):
            raise ValueError(
                f"field {name!r} has rows of shape {shape}: only fields with one value "
                "per row (shape () or (1,)) can be filtered with SQL"
            )
        if name.lower() in _RESERVED:
            raise ValueError(f"field {name!r} cannot be filterable: the name is taken in SQL")
    return FieldSpec(name, dtype, shape, name, sql)


def _layout(schema: Any, block_size: int) -> Layout:
    if schema is None:
        raise ValueError("Argument ``schema`` is required for new database!")
    if not isinstance(schema, Mapping) or not schema:
        raise ValueError("Schema must be a non-empty dict mapping field names to (dtype, shape)!")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    fields = tuple(_field_spec(name, spec) for name, spec in schema.items())
    lowered = [f.name.lower() for f in fields if f.sql]
    if len(set(lowered)) != len(lowered):
        raise ValueError("filterable field names must differ in more than letter case")
    return Layout("db", block_size, fields)


class TensorColumn:
    """One field of a :class:`TensorDB`, read on its own (only its blocks are touched)."""

    def __init__(self, db: TensorDB, name: str) -> None:
        self._db = db
        self.name = name
        column = db._columns[name]
        self.dtype: str = column.dtype_name
        self.shape: tuple[int, ...] = column.shape

    def __len__(self) -> int:
        return len(self._db)

    def __getitem__(self, idx: Any) -> torch.Tensor:
        return self._db._select(idx, (self.name,))[self.name]

    @property
    def mapped_blocks(self) -> int:
        return self._db._columns[self.name].mapped_blocks

    def __repr__(self) -> str:
        return f"TensorColumn({self.name!r}, dtype={self.dtype}, shape={self.shape})"


class TensorDB(Storage):
    """Row-aligned fields, each a memory-mapped blob, with one committed row count.

    A drop-in for ``tensorblob.TensorDB`` (same ``open``, modes, methods and
    errors). The row count and the block lists of every field commit in one
    SQLite transaction: a killed writer leaves the rows of the last ``write``
    that returned, all fields aligned. Beyond tensorblob:

    - a schema entry ``(dtype, shape, {"filter": True})`` (or ``{"index": True}``,
      which also builds a SQL index) mirrors that one-value-per-row field into
      the ``rows`` table, so :meth:`where` filters rows with SQL;
    - ``write(rows, keys=[...])`` gives rows string keys: :meth:`get` is one
      indexed lookup, and ``catalog query --attach emb=DIR`` joins them with a
      catalog dataset (``JOIN emb.rows e ON e.key = t.key``);
    - :meth:`column` (or ``db["field"]``) and ``fields=`` read some fields only.
    """

    kind = "db"
    noun = "database"

    def __init__(
        self, path: Path, mode: str, meta: Metadata, max_cached_blocks: int | None
    ) -> None:
        super().__init__(path, mode, meta, max_cached_blocks)
        self.max_cached_blocks = max_cached_blocks  # type: ignore[assignment]  # as tensorblob
        self.schema: dict[str, tuple[str, tuple[int, ...]]] = {
            name: (c.dtype_name, c.shape) for name, c in self._columns.items()
        }
        self.filterable: tuple[str, ...] = tuple(f.name for f in meta.fields if f.sql)
        self._indexed = tuple(f.name for f in meta.fields if f.sql == "index")
        self._fields = tuple(self._columns)

    @classmethod
    def open(
        cls,
        filename: str | os.PathLike[str],
        mode: str = "r",
        *,
        schema: Mapping[str, Any] | None = None,
        block_size: int = 8192,
        max_cached_blocks: int | None = None,
    ) -> TensorDB:
        """Open (or create) the database directory ``filename``.

        ``schema`` maps field names to ``(dtype, shape)`` — or ``(dtype, shape,
        {"filter": True})`` / ``{"index": True}`` for fields :meth:`where` can
        filter on — and is required to create a database, ignored otherwise.
        Modes, ``block_size`` and ``max_cached_blocks`` (per field) as in
        :meth:`TensorBlob.open`.
        """
        return cls._open(filename, mode, max_cached_blocks, lambda: _layout(schema, block_size))

    @classmethod
    def unlink(cls, filename: str | os.PathLike[str]) -> bool:
        """Delete a database directory; True when it is gone (warns and returns False if not)."""
        return cls._unlink(filename)

    # -- reading ---------------------------------------------------------------------------

    def _field_names(self, fields: Sequence[str] | None) -> tuple[str, ...]:
        if fields is None:
            return self._fields
        if isinstance(fields, str):
            fields = (fields,)
        unknown = [f for f in fields if f not in self._columns]
        if unknown:
            raise KeyError(f"no field {unknown[0]!r} (fields: {', '.join(self._fields)})")
        return tuple(fields)

    def __getitem__(self, idx: Any) -> Any:
        """``{field: rows}`` at an int, a slice or a batch of positions; ``db["f"]``: a column."""
        if isinstance(idx, str):
            return self.column(idx)
        return self._select(idx, self._fields)

    def column(self, name: str) -> TensorColumn:
        """One field, indexable like a blob; reading it maps only that field's blocks."""
        self._field_names((name,))
        return TensorColumn(self, name)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        """Rows (``{field: tensor}``) from the current position to the end."""
        self._check_closed()
        return self._iter_rows(self._fields)

    def read(
        self, size: int | None = None, *, fields: Sequence[str] | None = None
    ) -> dict[str, torch.Tensor]:
        """Up to ``size`` rows (all when None) from the current position, which moves past them."""
        return self._read_at_position(size, self._field_names(fields))

    # -- writing ---------------------------------------------------------------------------

    def write(self, rows: Mapping[str, torch.Tensor], *, keys: Sequence[str] | None = None) -> int:
        """Write one row or a batch of rows of every field at the current position.

        Dense: ``rows`` has exactly the schema's fields, each with the same
        number of rows. ``keys`` gives each row a unique string key (kept on
        rows overwritten without keys). Everything — rows, keys, filterable
        values, the new length — commits in one transaction when this returns.
        """
        self._check_writable()
        if not isinstance(rows, Mapping):
            raise TypeError(
                f"Rows must be a dict mapping field names to tensors, got {type(rows).__name__!r}!"
            )
        missing = sorted(self._columns.keys() - rows.keys())
        extra = sorted(rows.keys() - self._columns.keys())
        if missing or extra:
            raise ValueError(
                "Dense writes require exactly the schema fields; "
                f"missing: {missing!r}, unexpected: {extra!r}"
            )
        data = {name: self._columns[name].as_rows(rows[name]) for name in self._fields}
        counts = {name: len(t) for name, t in data.items()}
        if len(set(counts.values())) != 1:
            raise ValueError(f"All fields must have the same row count; got: {counts!r}")
        n = next(iter(counts.values()))
        if keys is not None:
            keys = _check_keys(keys, n)
        if self._append:
            self._pos = len(self)
        if n:
            pos = self._pos
            self._commit_rows(pos + n, [(pos, data, keys)], transaction=self._mirror_needed(keys))
            self._pos = pos + n
        return n

    def extend(self, other: Any, maintain_order: bool = False) -> None:
        """Append every row of ``other`` (same fields, dtypes and shapes), in one commit.

        As :meth:`TensorBlob.extend`, for all fields at once; keys and
        filterable values come along. ``other`` may be a ``tensorblob.TensorDB``.
        """
        other_schema = getattr(other, "schema", None)
        if not isinstance(other_schema, Mapping) or set(other_schema) != set(self.schema):
            raise ValueError("Schema fields must match to extend databases!")
        for name, (dtype, shape) in self.schema.items():
            spec = other_schema[name]
            if (parse_dtype(spec[0]), parse_shape(spec[1])) != (dtype, shape):
                raise ValueError(f"field {name!r}: data types and shapes must match to extend")
        self._check_writable()
        self.seek(0, io.SEEK_END)
        total = len(other)
        if total == 0:
            return
        other_keys = other._keys_below(total) if isinstance(other, TensorDB) else {}
        if (
            isinstance(other, TensorDB)
            and other.block_size == self.block_size
            and (not maintain_order or len(self) % self.block_size == 0)
        ):
            self._extend_blocks(other, self._block_mirror(other, other_keys))
            self.seek(0, io.SEEK_END)
            return

        def fetch(start: int, stop: int) -> Chunk:
            data = other[start:stop]
            keys = [other_keys.get(q) for q in range(start, stop)] if other_keys else None
            return start, {name: data[name] for name in self._fields}, keys

        self._extend_rows(other, fetch)
        self.seek(0, io.SEEK_END)

    # -- keys and SQL ------------------------------------------------------------------------

    def get(self, key: str, default: Any = None, *, fields: Sequence[str] | None = None) -> Any:
        """The row (``{field: tensor}``) with this key, or ``default`` (one indexed lookup)."""
        position = self.position(key, None)
        if position is None:
            return default
        return self._select(position, self._field_names(fields))

    def get_many(
        self, keys: Sequence[str], *, fields: Sequence[str] | None = None
    ) -> dict[str, torch.Tensor]:
        """Rows for ``keys``, in that order (one query); ``KeyNotFoundError`` if one is missing."""
        return self._select(self.positions(keys), self._field_names(fields))

    def position(self, key: str, default: Any = ...) -> Any:
        """The row position of ``key`` (``KeyNotFoundError``, a ``KeyError``, if absent)."""
        self._check_closed()
        row = self._meta.conn.execute("SELECT position FROM rows WHERE key = ?", (key,)).fetchone()
        if row is not None:
            return int(row[0])
        if default is ...:
            raise KeyNotFoundError(f"no row with key {key!r} in {self.filename}")
        return default

    def positions(self, keys: Sequence[str]) -> list[int]:
        """Row positions of ``keys``, in order (one query per 500 keys)."""
        self._check_closed()
        keys = list(keys)
        found: dict[str, int] = {}
        conn = self._meta.conn
        for i in range(0, len(keys), 500):
            part = keys[i : i + 500]
            marks = ", ".join("?" * len(part))
            found.update(
                conn.execute(f"SELECT key, position FROM rows WHERE key IN ({marks})", part)
            )
        missing = [k for k in keys if k not in found]
        if missing:
            raise KeyNotFoundError(f"no row with key {missing[0]!r} in {self.filename}")
        return [found[k] for k in keys]

    def where(
        self, condition: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> list[int]:
        """Positions of the rows matching a SQL condition, in order: ``db.where("price > 100")``.

        The condition may use the filterable fields, ``key`` and ``position``;
        ``?`` placeholders take ``params``. Read-only: anything but reading
        is refused (:class:`CatalogError`). Rows follow with ``db[positions]``.
        """
        self._check_closed()
        # no ORDER BY: SQLite would rather scan the table in position order than
        # use an index on the condition and sort; sorting here is linear when the
        # rows come out in order anyway
        result = run_readonly(
            self._meta.readonly_conn, f"SELECT position FROM rows WHERE ({condition})", params
        )
        positions = [row[0] for row in result]
        positions.sort()
        return positions

    def query(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> QueryResult:
        """Run one read-only SELECT over this database's ``rows`` table."""
        self._check_closed()
        return run_readonly(self._meta.readonly_conn, sql, params)

    # -- the SQL mirror ------------------------------------------------------------------------

    def _mirror_needed(self, keys: Sequence[str | None] | None) -> bool:
        return bool(self.filterable) or keys is not None

    def _mirror(
        self,
        conn: sqlite3.Connection,
        pos: int,
        data: dict[str, torch.Tensor],
        keys: Sequence[str | None] | None,
    ) -> None:
        if not self._mirror_needed(keys):
            return
        n = len(data[self._fields[0]])
        values = [data[f].reshape(-1).tolist() for f in self.filterable]
        # a bulk append (at least as many rows as the table holds) fills the table
        # first and sorts each SQL index once, instead of inserting row by row into
        # it; all in the same transaction (at most once: later chunks of one commit
        # start past the committed length)
        bulk = self._indexed if pos == len(self) and n >= max(len(self), BULK_ROWS) else ()
        for field in bulk:
            conn.execute(f"DROP INDEX {index_name(field)}")
        self._upsert(conn, range(pos, pos + n), keys, values)
        for field in bulk:
            conn.execute(create_index(field))

    def _upsert(
        self,
        conn: sqlite3.Connection,
        positions: Sequence[int],
        keys: Sequence[str | None] | None,
        values: list[list[Any]],
    ) -> None:
        columns = ["position", "key"] + [quote(f) for f in self.filterable]
        updates = [f"{c} = excluded.{c}" for c in columns[2:]]
        if keys is not None:
            updates.append("key = excluded.key")
        conflict = f"DO UPDATE SET {', '.join(updates)}" if updates else "DO NOTHING"
        sql = (
            f"INSERT INTO rows ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
            f"ON CONFLICT (position) {conflict}"
        )
        rows = zip(positions, repeat(None) if keys is None else keys, *values, strict=False)
        try:
            conn.executemany(sql, rows)
        except sqlite3.IntegrityError:
            raise self._duplicate(conn, positions, keys or []) from None

    def _duplicate(
        self, conn: sqlite3.Connection, positions: Sequence[int], keys: Sequence[str | None]
    ) -> DuplicateKeyError:
        low, high = positions[0], positions[-1] + 1
        for key in keys:
            if key is None:
                continue
            row = conn.execute(
                "SELECT position FROM rows WHERE key = ? AND (position < ? OR position >= ?)",
                (key, low, high),
            ).fetchone()
            if row is not None:
                return DuplicateKeyError(
                    f"key {key!r} is already the key of row {row[0]} in {self.filename}"
                )
        return DuplicateKeyError(f"duplicate keys in a write to {self.filename}")

    def _mirror_truncate(self, conn: sqlite3.Connection, length: int) -> None:
        conn.execute("DELETE FROM rows WHERE position >= ?", (length,))

    def _keys_below(self, length: int) -> dict[int, str]:
        return dict(
            self._meta.conn.execute(
                "SELECT position, key FROM rows WHERE key IS NOT NULL AND position < ?", (length,)
            )
        )

    def _block_mirror(
        self, other: TensorDB, other_keys: dict[int, str]
    ) -> Callable[[sqlite3.Connection], None]:
        """The SQL side of :meth:`Storage._extend_blocks`: rows move as their blocks do."""
        bs = self.block_size
        length, other_length = len(self), len(other)
        full, other_full = (length // bs) * bs, (other_length // bs) * bs
        tail = length - full
        # other's row q lands at full + q (full blocks), or after this blob's tail
        moved = [full + q if q < other_full else q + full + tail for q in range(other_length)]
        values = [
            other._columns[f].read(0, other_length).reshape(-1).tolist() for f in self.filterable
        ]
        keys = [other_keys.get(q) for q in range(other_length)] if other_keys else None

        def mirror(conn: sqlite3.Connection) -> None:
            if tail and other_full:
                conn.execute(
                    "UPDATE rows SET position = -1 - (position + ?) WHERE position >= ?",
                    (other_full, full),
                )
                conn.execute("UPDATE rows SET position = -1 - position WHERE position < 0")
            if self._mirror_needed(keys):
                self._upsert(conn, moved, keys, values)

        return mirror


def _check_keys(keys: Sequence[str], n: int) -> list[str]:
    if isinstance(keys, str):
        raise TypeError("keys must be a sequence of str, one per row (not one str)")
    keys = list(keys)
    if len(keys) != n:
        raise ValueError(f"{len(keys)} keys for {n} rows")
    for key in keys:
        if not isinstance(key, str):
            raise TypeError(f"keys must be str, got {type(key).__name__!r}")
    if len(set(keys)) != n:
        seen: set[str] = set()
        for key in keys:
            if key in seen:
                raise DuplicateKeyError(f"key {key!r} appears twice in one write")
            seen.add(key)
    return keys
