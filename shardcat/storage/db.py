"""TensorDB: tensorblob's row-aligned multi-field storage, with SQL over its rows."""

from __future__ import annotations

import io
import os
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from shardcat.catalog.query import QueryResult, run_readonly
from shardcat.catalog.sqlite import value_groups
from shardcat.errors import (
    CatalogError,
    DuplicateKeyError,
    KeyNotFoundError,
    StorageTypeError,
    StorageValueError,
)
from shardcat.storage.base import Chunk, Storage
from shardcat.storage.column import db_layout, parse_dtype, parse_shape
from shardcat.storage.meta import (
    CREATE_KEY_INDEX,
    KEY_INDEX,
    Metadata,
    create_index,
    index_name,
    quote,
)

__all__ = ["TensorColumn", "TensorDB"]

_NO_COLUMN = re.compile(r"no such column: (\S+)")
BULK_ROWS = 100_000  # appends this large rebuild the SQL indexes instead of updating them


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
    errors). As in :class:`TensorBlob`, ``write`` fills blocks and
    :meth:`flush`, :meth:`close`, :meth:`truncate` and :meth:`extend` commit:
    the row count, the block lists of every field, the keys and the SQL rows,
    in one transaction, so a killed writer leaves the rows of its last commit,
    all fields aligned and the SQL rows matching them. Beyond tensorblob:

    - a schema entry ``(dtype, shape, {"filter": True})`` (or ``{"index": True}``,
      which also builds a SQL index) mirrors that one-value-per-row field into
      the ``rows`` table, so :meth:`where` filters rows with SQL;
    - ``write(rows, keys=[...])`` gives rows string keys: :meth:`get` is one
      indexed lookup, and ``catalog query --attach emb=DIR`` joins them with a
      catalog dataset (``JOIN emb.rows e ON e.key = t.key``);
    - :meth:`column` and ``fields=`` read some fields only.

    Indexing and ``read`` see this object's unflushed writes. SQL reads
    (:meth:`where`, :meth:`query`, :meth:`get`, :meth:`position` and their
    batch forms) first flush them, so they see them too; other objects and
    processes see rows once they are committed.
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
        # what the next commit mirrors into SQL: rows [start, stop) written (noted
        # only with filterable fields) and the keys given since the last commit
        self._written: list[list[int]] = []
        self._pos_key: dict[int, str] = {}
        self._key_pos: dict[str, int] = {}
        columns = ["position", "key"] + [quote(f) for f in self.filterable]
        updates = ["key = coalesce(excluded.key, key)"]  # rows written without keys keep theirs
        updates += [f"{c} = excluded.{c}" for c in columns[2:]]
        self._upsert = (  # an INSERT's head and tail, its VALUES in between
            f"INSERT INTO rows ({', '.join(columns)}) VALUES ",
            f" ON CONFLICT (position) DO UPDATE SET {', '.join(updates)}",
        )

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
        return cls._open(filename, mode, max_cached_blocks, lambda: db_layout(schema, block_size))

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
            raise KeyNotFoundError(f"no field {unknown[0]!r} (fields: {', '.join(self._fields)})")
        return tuple(fields)

    def __getitem__(self, idx: Any) -> dict[str, torch.Tensor]:
        """``{field: rows}`` at an int, a slice or a batch of positions.

        As in tensorblob, anything else (a field name too) is a ``TypeError``;
        one field on its own is :meth:`column`.
        """
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
        number of rows once reshaped to rows as :meth:`TensorBlob.write` does
        (tensorblob's ``view(-1, *shape)``). ``keys`` gives each row a unique string key (kept on
        rows overwritten without keys); a key already used by another row, or
        twice in ``keys``, raises :class:`DuplicateKeyError` and nothing is
        written. Rows, keys and filterable values commit together at the next
        :meth:`flush`, :meth:`close`, :meth:`truncate` or :meth:`extend`.
        """
        self._check_writable()
        if not isinstance(rows, Mapping):
            raise StorageTypeError(
                f"Rows must be a dict mapping field names to tensors, got {type(rows).__name__!r}!"
            )
        missing = sorted(self._columns.keys() - rows.keys())
        extra = sorted(rows.keys() - self._columns.keys())
        if missing or extra:
            raise StorageValueError(
                "Dense writes require exactly the schema fields; "
                f"missing: {missing!r}, unexpected: {extra!r}"
            )
        data = {name: self._columns[name].as_rows(rows[name]) for name in self._fields}
        counts = {name: len(t) for name, t in data.items()}
        if len(set(counts.values())) != 1:
            raise StorageValueError(f"All fields must have the same row count; got: {counts!r}")
        n = next(iter(counts.values()))
        if keys is not None:
            keys = _check_keys(keys, n)
        if self._append:
            self._pos = self._length
        if n:
            pos = self._pos
            if keys is not None:
                self._check_new_keys(keys, range(pos, pos + n))
            self._write_rows(pos, n, data, keys)
            self._pos = pos + n
        return n

    def extend(self, other: Any, maintain_order: bool = False) -> None:
        """Append every row of ``other`` (same fields, dtypes and shapes) and commit.

        As :meth:`TensorBlob.extend`, for all fields at once (without
        ``maintain_order``, the block sizes must match); keys and filterable
        values come along (a key this database already has raises
        :class:`DuplicateKeyError`, nothing appended). ``other`` may be a
        ``tensorblob.TensorDB``.
        """
        other_schema = getattr(other, "schema", None)
        if not isinstance(other_schema, Mapping) or set(other_schema) != set(self.schema):
            raise StorageValueError("Schema fields must match to extend databases!")
        self._check_writable()  # before the fields, as tensorblob
        for name, (dtype, shape) in self.schema.items():
            spec = other_schema[name]
            if (parse_dtype(spec[0]), parse_shape(spec[1])) != (dtype, shape):
                raise StorageValueError(
                    f"field {name!r}: data types and shapes must match to extend"
                )
        self.flush()
        self.seek(0, io.SEEK_END)
        self._check_block_size(other, maintain_order)
        total = len(other)
        if total == 0:
            return
        other_keys = other._keys_below(total) if isinstance(other, TensorDB) else {}
        self._check_new_keys(list(other_keys.values()), range(0))

        def fetch(start: int, stop: int) -> Chunk:
            data = other[start:stop]
            keys = [other_keys.get(q) for q in range(start, stop)] if other_keys else None
            return start, {name: data[name] for name in self._fields}, keys

        self._extend(other, maintain_order, fetch, self._block_mirror(other, other_keys))

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
        self._sync()
        row = self._meta.conn.execute("SELECT position FROM rows WHERE key = ?", (key,)).fetchone()
        if row is not None:
            return int(row[0])
        if default is ...:
            raise KeyNotFoundError(f"no row with key {key!r} in {self.filename}")
        return default

    def positions(self, keys: Sequence[str]) -> list[int]:
        """Row positions of ``keys``, in order (one query per 500 keys)."""
        self._sync()
        keys = list(keys)
        found: dict[str, int] = dict(self._key_positions(keys))
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
        Unflushed writes of this object are flushed first.
        """
        self._sync()
        # no ORDER BY: SQLite would rather scan the table in position order than
        # use an index on the condition and sort; sorting here is linear when the
        # rows come out in order anyway
        result = self._run(f"SELECT position FROM rows WHERE ({condition})", params)
        positions = [row[0] for row in result]
        positions.sort()
        return positions

    def query(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> QueryResult:
        """Run one read-only SELECT over this database's ``rows`` table (flushing first)."""
        self._sync()
        return self._run(sql, params)

    def _run(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None) -> QueryResult:
        """:func:`run_readonly` on the ``rows`` table; a field that is not in SQL says so."""
        try:
            return run_readonly(self._meta.readonly_conn, sql, params)
        except CatalogError as exc:
            found = _NO_COLUMN.search(str(exc))
            name = None if found is None else found.group(1).rpartition(".")[2].strip('"`[]')
            if name not in self._columns or name in self.filterable:
                raise
            origin = (
                " (a database written by the tensorblob package has none)"
                if self._meta.imported_from == "tensorblob"
                else ""
            )
            raise CatalogError(
                f"field {name!r} is not in SQL: only fields declared filterable when the "
                "database was created are, with (dtype, shape, {'filter': True}) or "
                f"{{'index': True}} in its schema{origin}; to filter on it, copy the rows "
                "into a new TensorDB whose schema declares it: new.extend(db, maintain_order=True)"
            ) from None

    def _sync(self) -> None:
        """Before SQL reads: commit this object's unflushed writes, so the SQL rows show them."""
        self._check_closed()
        if self._dirty:
            self._commit()

    # -- the SQL mirror ------------------------------------------------------------------------

    def _check_new_keys(self, keys: Sequence[str], overwritten: range) -> None:
        """Refuse keys that rows outside ``overwritten`` have (committed or not)."""
        for key in keys:
            owner = self._key_pos.get(key)
            if owner is not None and owner not in overwritten:
                raise self._duplicate(key, owner)
        for key, owner in self._key_positions(keys):
            # a committed key is free again once its row has been given another one
            if owner not in overwritten and owner not in self._pos_key:
                raise self._duplicate(key, owner)

    def _key_positions(self, keys: Sequence[str]) -> Iterator[tuple[str, int]]:
        """``(key, position)`` of the SQL rows with one of ``keys`` (one query per 500 keys)."""
        conn = self._meta.conn
        for i in range(0, len(keys), 500):
            part = keys[i : i + 500]
            marks = ", ".join("?" * len(part))
            yield from conn.execute(f"SELECT key, position FROM rows WHERE key IN ({marks})", part)

    def _duplicate(self, key: str, owner: int) -> DuplicateKeyError:
        return DuplicateKeyError(
            f"key {key!r} is already the key of row {owner} in {self.filename}"
        )

    def _record(self, pos: int, n: int, keys: Sequence[str | None] | None) -> None:
        if self.filterable:
            written = self._written
            if written and written[-1][1] == pos:  # e.g. row-by-row appends
                written[-1][1] = pos + n
            else:
                written.append([pos, pos + n])
        if keys is not None:
            self._note_keys(zip(range(pos, pos + n), keys, strict=True))

    def _note_keys(self, items: Iterable[tuple[int, str | None]]) -> None:
        pos_key, key_pos = self._pos_key, self._key_pos
        for position, key in items:
            if key is None:
                continue
            old = pos_key.get(position)
            if old is not None and key_pos.get(old) == position:
                del key_pos[old]
            pos_key[position] = key
            key_pos[key] = position

    def _forget_mirror(self) -> None:
        self._written.clear()
        self._pos_key.clear()
        self._key_pos.clear()

    def _mirror(self, conn: sqlite3.Connection) -> None:
        """Upsert the rows written and the keys given since the last commit; drop rows past the end.

        Values are read back from the blocks, so they are the latest ones (a
        row written twice is mirrored once). Rows past the table's last one
        are inserted, the others upserted, both as multi-row ``VALUES``
        statements (:func:`~shardcat.catalog.sqlite.value_groups`, as the
        catalog's inserts). Keys of committed rows that get new ones are
        cleared first: keys may move between rows, and no intermediate state
        may repeat one. Readers see none of it before the commit (indexes
        dropped for a bulk append included).
        """
        length, committed, pos_key = self._length, self._meta.length, self._pos_key
        conn.executemany(
            "UPDATE rows SET key = NULL WHERE position = ?",
            [(p,) for p in pos_key if p < committed],
        )
        # a bulk append (at least as many rows as the table holds) fills the table
        # first and sorts each SQL index once, instead of inserting row by row into it
        # (the partial key index too when the new rows bring keys that would land all
        # over it; a file from before it has `key UNIQUE`, which cannot be dropped)
        bulk: list[tuple[str, str]] = []  # (index, its CREATE statement)
        if length - committed >= max(committed, BULK_ROWS):
            bulk = [(index_name(f), create_index(f)) for f in self._indexed]
            if pos_key and _has_index(conn, KEY_INDEX) and not self._keys_append(conn):
                bulk.append((KEY_INDEX, CREATE_KEY_INDEX))
        for index, _ in bulk:
            conn.execute(f"DROP INDEX {index}")
        if self.filterable:
            # rows from `top` on have no SQL row yet: a plain INSERT (no conflict
            # handling, the key column only when keys were given) instead of the upsert
            top = conn.execute("SELECT coalesce(max(position) + 1, 0) FROM rows").fetchone()[0]
            for start, stop in _union(self._written):
                stop = min(stop, length)
                if start < min(stop, top):
                    self._upsert_rows(conn, start, min(stop, top))
                if max(start, top) < stop:
                    self._insert_rows(conn, max(start, top), stop)
        else:
            items = [(p, k) for p, k in pos_key.items() if p < length]
            _execute_groups(conn, self._upsert, [[p for p, _ in items], [k for _, k in items]])
        conn.execute("DELETE FROM rows WHERE position >= ?", (length,))
        for _, statement in bulk:
            conn.execute(statement)

    def _keys_append(self, conn: sqlite3.Connection) -> bool:
        """Whether the keys given ascend with their rows, past every committed key.

        The key index then takes them at its end, one leaf after another, which
        costs less than rebuilding it (random keys cost 9x more than a rebuild).
        """
        top = "SELECT max(key) FROM rows WHERE key IS NOT NULL"  # from the key index
        previous_row, previous = -1, conn.execute(top).fetchone()[0]
        for row, key in self._pos_key.items():
            if row < previous_row or (previous is not None and key <= previous):
                return False
            previous_row, previous = row, key
        return True

    def _values(self, start: int, stop: int) -> list[list[Any]]:
        """The filterable fields' values of rows ``start ... stop`` (as Python numbers)."""
        return [self._columns[f].read(start, stop).reshape(-1).tolist() for f in self.filterable]

    def _upsert_rows(self, conn: sqlite3.Connection, start: int, stop: int) -> None:
        """Insert or update the SQL rows ``start ... stop`` (some of them exist)."""
        pos_key = self._pos_key
        positions = range(start, stop)
        keys = [pos_key.get(p) for p in positions] if pos_key else [None] * len(positions)
        _execute_groups(conn, self._upsert, [positions, keys, *self._values(start, stop)])

    def _insert_rows(self, conn: sqlite3.Connection, start: int, stop: int) -> None:
        """Insert the SQL rows ``start ... stop`` (none exists): no conflict handling.

        Values are bound as they are (floats exactly; a JSON array would go
        through SQLite's decimal parser), without the key column when none
        of these rows was given a key.
        """
        pos_key = self._pos_key
        positions = range(start, stop)
        columns = [quote(f) for f in self.filterable]
        keys = [pos_key.get(p) for p in positions] if pos_key else None
        if keys is not None and any(k is not None for k in keys):
            columns.insert(0, "key")
            values = [keys, *self._values(start, stop)]
        else:
            values = self._values(start, stop)
        head = f"INSERT INTO rows (position, {', '.join(columns)}) VALUES "
        _execute_groups(conn, (head, ""), [positions, *values])

    def _keys_below(self, length: int) -> dict[int, str]:
        self._sync()
        return dict(
            self._meta.conn.execute(
                "SELECT position, key FROM rows WHERE key IS NOT NULL AND position < ?", (length,)
            )
        )

    def _block_mirror(
        self, other: TensorDB, other_keys: dict[int, str]
    ) -> Callable[[sqlite3.Connection], None]:
        """The SQL side of :meth:`Storage._extend_blocks`: rows move as their blocks do.

        The returned ``work`` moves this database's tail rows in SQL and notes
        ``other``'s rows and keys at their new positions for :meth:`_mirror`.
        """
        bs = self.block_size
        length, other_length = len(self), len(other)
        full, other_full = (length // bs) * bs, (other_length // bs) * bs
        tail = length - full

        def mirror(conn: sqlite3.Connection) -> None:
            if tail and other_full:
                conn.execute(
                    "UPDATE rows SET position = -1 - (position + ?) WHERE position >= ?",
                    (other_full, full),
                )
                conn.execute("UPDATE rows SET position = -1 - position WHERE position < 0")
            # other's row q lands at full + q (full blocks), or after this database's tail
            self._note_keys(
                (full + q if q < other_full else q + full + tail, key)
                for q, key in other_keys.items()
            )
            if self.filterable:
                self._written.append([full, length + other_length])

        return mirror


def _execute_groups(
    conn: sqlite3.Connection, sql: tuple[str, str], columns: Sequence[Sequence[Any]]
) -> None:
    """Run ``head VALUES-list tail`` (``sql``, an ``INSERT``) over the rows of ``columns``."""
    n = len(columns[0])
    if n:
        head, tail = sql
        for values, groups in value_groups(columns, n):
            conn.executemany(head + values + tail, groups)


def _has_index(conn: sqlite3.Connection, name: str) -> bool:
    return (
        conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", (name,)
        ).fetchone()
        is not None
    )


def _union(spans: Iterable[Sequence[int]]) -> list[tuple[int, int]]:
    """Row ranges ``[start, stop)`` merged sorted and merged (a row may be written twice)."""
    merged: list[tuple[int, int]] = []
    for start, stop in sorted((a, b) for a, b in spans if a < b):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def _check_keys(keys: Sequence[str], n: int) -> list[str]:
    if isinstance(keys, str):
        raise StorageTypeError("keys must be a sequence of str, one per row (not one str)")
    keys = list(keys)
    if len(keys) != n:
        raise StorageValueError(f"{len(keys)} keys for {n} rows")
    for key in keys:
        if not isinstance(key, str):
            raise StorageTypeError(f"keys must be str, got {type(key).__name__!r}")
    if len(set(keys)) != n:
        seen: set[str] = set()
        for key in keys:
            if key in seen:
                raise DuplicateKeyError(f"key {key!r} appears twice in one write")
            seen.add(key)
    return keys
