"""SQL-backed readers: the catalog says where a record is, one ``pread`` fetches it.

A lookup by key is one indexed point query (a cached prepared statement on a
read-only DBAPI connection) plus one ``os.pread``. Batches are one query per
batch. Opening a reader loads the dataset's shard rows, never its records.

**Consistency.** Every public call works in one read snapshot of the catalog
(kept for up to ``SNAPSHOT_SECONDS`` across calls) and with the shard list of
that snapshot: when a snapshot begins, the dataset's ``version`` is compared
with the one the shard list was loaded at, and the list is reloaded when
another process committed since. A record's location is therefore always read
together with the indexed version (``generation`` and file identity) of its
shard, and bytes are read only from a file that is that version (see
:mod:`shardcat.readers.source`): a shard re-indexed while a reader runs is
seen as the old or the new version, never a mix, never missing. A file that
matches no indexed version raises :class:`StaleShardError`.

**Positions** (``get_record_at``, slices, and the keys of datasets keyed by
position) are those of the shard layout the reader opened with. A re-index
that moves them (a shard changed, added or removed) makes positional access
raise :class:`StaleShardError` until ``refresh()``: position keys are not
stable across re-ingest, and a reader never silently lets a position name
another record. Keys of keyed datasets stay valid.

**As tfd-utils.** ``reader.index`` is tfd-utils' ``{key: location}`` dict as
a read-only view of the catalog (:mod:`shardcat.readers.index`). A reader
opened on paths uses the dataset of those files with its own rule (key
feature, tar grouping), creating one when another rule reads them already
(:mod:`shardcat.catalog.reuse`). The drop-ins keep the last record of a
duplicate key (in shard path order, as tfd-utils' dict does when it indexes
the files in sorted order) and say so once: one warning when the open that
indexed them dropped some, and ``get_stats()["duplicates_dropped"]``.

**Processes.** After ``fork`` (DataLoader workers) the catalog connection and
every open file, decompressor and seek index are reopened in the child: the
pool of sources is keyed by fork generation, checked on every call.
"""

from __future__ import annotations

import bisect
import functools
import json
import operator
import os
import sqlite3
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from shardcat.catalog import engine as _engine
from shardcat.catalog.catalog import Catalog, PathsLike, resolve_paths
from shardcat.catalog.engine import locate
from shardcat.catalog.ingest import DROPPED, absolute_path
from shardcat.errors import (
    CatalogError,
    CorruptRecordError,
    KeyNotFoundError,
    ShardcatError,
    ShardIOError,
    StaleShardError,
)
from shardcat.readers.formats import get_format
from shardcat.readers.index import DatasetIndex
from shardcat.readers.source import CheckedSource, Identity, open_source, read_extents

__all__ = [
    "Reader",
    "RecordIOReader",
    "TFRecordRandomAccess",
    "TFRecordReader",
    "TarRandomAccess",
    "TarReader",
]

# Rows are (batch index, shard_id, ordinal, offset, length[, key]). CROSS JOIN makes
# SQLite loop over the batch and look each item up, instead of scanning the records.
_BY_KEY = (
    'SELECT 0, shard_id, ordinal, "offset", length FROM shardcat_records WHERE dataset_id = ? '
    "AND key = ?"
)
_MANY_BY_KEY = (
    'SELECT j.key, r.shard_id, r.ordinal, r."offset", r.length FROM json_each(?) j '
    "CROSS JOIN shardcat_records r ON r.dataset_id = ? AND r.key = j.value"
)
_MANY_BY_POSITION = (
    'SELECT j.key, r.shard_id, r.ordinal, r."offset", r.length, r.key FROM json_each(?) j '
    "CROSS JOIN shardcat_records r ON r.shard_id = json_extract(j.value, '$[0]') "
    "AND r.ordinal = json_extract(j.value, '$[1]')"
)
# Members of records (formats whose records have parts):
# (batch index, name, offset, length, extents).
_MEMBERS_AT = (
    'SELECT j.key, m.name, m."offset", m.length, m.extents FROM json_each(?) j '
    "CROSS JOIN shardcat_members m ON m.shard_id = json_extract(j.value, '$[0]') "
    "AND m.ordinal = json_extract(j.value, '$[1]') ORDER BY m.\"offset\""
)
_MEMBER_BY_KEY = (
    'SELECT r.shard_id, m."offset", m.length, m.extents FROM shardcat_records r JOIN '
    "shardcat_members m "
    "ON m.shard_id = r.shard_id AND m.ordinal = r.ordinal "
    "WHERE r.dataset_id = ? AND r.key = ? AND m.name = ?"
)
_SHARDS = (
    "SELECT id, path, first_position, num_records, compression, generation, "
    "size, mtime_ns, ino, ctime_ns, fingerprint FROM shardcat_shards "
    "WHERE dataset_id = ? AND generation IS NOT NULL ORDER BY path"
)
_VERSION = "SELECT version FROM shardcat_datasets WHERE id = ?"
_OPTIONS = "SELECT options FROM shardcat_datasets WHERE id = ?"
_SEEK_INDEX = (
    "SELECT i.data FROM shardcat_seek_indexes i JOIN shardcat_shards s ON s.id = i.shard_id "
    "WHERE i.shard_id = ? AND s.generation = ?"
)
Row = tuple[int, int, int, int, int]
_LOCATION = operator.itemgetter(1, 3)  # (shard_id, offset): read shards front to back
_KEYS_OF_SHARD = "SELECT key FROM shardcat_records WHERE shard_id = ? ORDER BY ordinal"

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class _Shard:
    id: int
    path: str
    first: int
    count: int
    compression: str | None
    generation: int
    identity: Identity


def _follows_reindex(method: F) -> F:
    """Repeat a call once when a shard file turned out stale and the catalog has
    meanwhile committed a newer version of the dataset (the call read a snapshot
    from just before a re-index)."""

    @functools.wraps(method)
    def wrapper(self: Reader, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except StaleShardError:
            if not self._moved_on():
                raise
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _batch_query(
    conn: sqlite3.Connection, sql: str, items: Sequence[Any], params: tuple[Any, ...]
) -> list[tuple[Any, ...]]:
    """Run a ``json_each`` batch query over ``items`` looked up in sorted order (B-tree
    locality: 2-3x faster than random order); each row's first column is the index
    of its item in ``items``."""
    order = sorted(range(len(items)), key=items.__getitem__)
    rows = conn.execute(sql, (json.dumps([items[i] for i in order]), *params)).fetchall()
    return [(order[r[0]], *r[1:]) for r in rows]


class Reader:
    """Random access to one dataset of a catalog (any container format).

    Keys are strings. ``reader[key]`` raises ``KeyError`` for a missing key;
    ``get_record``/``get_feature`` return None instead (as tfd-utils does).
    Bytes are those the catalog indexed or a :class:`ShardcatError`, never
    others (see the module docstring for re-indexing and forked workers).
    """

    def __init__(
        self,
        catalog: Catalog,
        dataset: str,
        *,
        verify_crc: bool = False,
        file_pool_size: int = 1024,
        owns_catalog: bool = False,
    ) -> None:
        self.catalog = catalog
        self.dataset = dataset
        self.verify_crc = verify_crc
        self._owns_catalog = owns_catalog
        self._pool_size = max(1, file_pool_size)
        self._sources: dict[int, CheckedSource] = {}
        self._pool_generation = _engine.fork_generation()
        self._shards: dict[int, _Shard] = {}
        self._serial = -1
        self._version: int | None = None
        self._pinned: tuple[tuple[int, int, int, int], ...] | None = None
        self._positions_moved = False
        self.closed = False
        #: Records dropped as duplicate keys by the ingest that returned this reader
        #: (:meth:`Catalog.ingest` sets it; 0 otherwise).
        self.indexed_duplicates = 0
        row = catalog.dataset_row(dataset)
        self._id: int = row[0]
        self.format = row[2]
        self.key_rule: str = row[3]
        self.options: dict[str, Any] = json.loads(row[5])
        self.options.pop(DROPPED, None)  # bookkeeping (see get_stats), not a format option
        self._patterns: list[str] = json.loads(row[6])
        self._fmt = get_format(self.format)
        self._parts: bool = self._fmt.PARTS
        self._by_position = self.key_rule == "position"
        self.refresh()

    # -- snapshots, shards and files ---------------------------------------------

    def refresh(self) -> None:
        """Follow the catalog to its latest version of the dataset, positions included
        (after a re-ingest moved them; see the module docstring)."""
        self._serial, self._version, self._pinned = -1, None, None
        self._positions_moved = False
        self.catalog.reader_connection()  # end any read snapshot: see the latest commit
        self._conn()
        self._pinned = self._layout()

    def _conn(self) -> sqlite3.Connection:
        """The read snapshot for one call, with this reader's shard list matching it.

        Every public call takes it once and runs all its queries on it.
        """
        if self._pool_generation != _engine._fork_generation:
            # a forked child: the parent's files and decompressors are never touched
            self._sources, self._pool_generation = {}, _engine._fork_generation
        catalog = self.catalog
        conn = catalog.reader_connection(snapshot=True)
        if catalog.snapshot_serial != self._serial:
            self._serial = catalog.snapshot_serial
            row = conn.execute(_VERSION, (self._id,)).fetchone()
            if row is None:
                raise CatalogError(f"dataset {self.dataset!r} was dropped from {catalog.path}")
            if row[0] != self._version:
                self._load_shards(conn, row[0])
        return conn

    def _moved_on(self) -> bool:
        """Whether the catalog now holds a newer version of the dataset than the
        snapshot the current call read (see :func:`_follows_reindex`)."""
        before = self._version
        self.catalog.reader_connection()  # end the snapshot
        self._conn()
        return self._version != before

    def _load_shards(self, conn: sqlite3.Connection, version: int) -> None:
        directory = self.catalog.directory
        shards = {
            r[0]: _Shard(
                r[0], absolute_path(r[1], directory), r[2], r[3], r[4], r[5], Identity(*r[6:])
            )
            for r in conn.execute(_SHARDS, (self._id,))
        }
        for shard_id in list(self._sources):  # files of versions that are gone
            old, new = self._shards.get(shard_id), shards.get(shard_id)
            if old is None or new is None or old.generation != new.generation:
                self._sources.pop(shard_id).close()
        self._shards = shards
        self._order = list(shards.values())
        self._starts = [s.first for s in self._order]
        self._len = sum(s.count for s in self._order)
        self._version = version
        if self._pinned is not None and self._layout() != self._pinned:
            self._positions_moved = True

    def _layout(self) -> tuple[tuple[int, int, int, int], ...]:
        return tuple((s.id, s.generation, s.first, s.count) for s in self._order)

    def _source(self, shard_id: int) -> CheckedSource:
        source = self._sources.get(shard_id)
        if source is not None:
            return source
        shard = self._shards[shard_id]
        source = open_source(
            shard.path, shard.identity, shard.compression, lambda: self._seek_index(shard)
        )
        if len(self._sources) >= self._pool_size:
            oldest = next(iter(self._sources))
            self._sources.pop(oldest).close()
        self._sources[shard_id] = source
        return source

    def _seek_index(self, shard: _Shard) -> bytes | None:
        """The stored seek points of a compressed shard's version (None: none stored)."""
        row = (
            self.catalog.reader_connection(snapshot=True)
            .execute(_SEEK_INDEX, (shard.id, shard.generation))
            .fetchone()
        )
        return None if row is None else bytes(row[0])

    def _read(
        self,
        shard_id: int,
        offset: int,
        length: int,
        extents: str | None = None,
        verify: bool | None = None,
    ) -> bytes:
        source = self._sources.get(shard_id) or self._source(shard_id)
        path = self._shards[shard_id].path
        try:
            if extents is not None:  # a member stored in pieces (sparse tar members)
                return read_extents(source, path, json.loads(extents))
            return self._fmt.read(
                source, path, offset, length, self.verify_crc if verify is None else verify
            )
        except OSError as exc:  # EIO and the like (our own errors are not OSErrors here)
            if isinstance(exc, ShardcatError):
                raise
            raise ShardIOError(f"{path}: cannot read at byte {offset}: {exc}", path) from None

    def _failed(self, exc: Exception, shard_id: int, offset: int) -> ShardcatError:
        """The error for a record that could not be read or decoded: the file checked
        first (bytes that changed under the read are a stale shard, not a corrupt one),
        then the format's or the system's error as a :class:`ShardcatError`."""
        source = self._sources.get(shard_id)
        if source is not None:
            source.check()
        if isinstance(exc, ShardcatError):
            return exc
        path = self._shards[shard_id].path
        if isinstance(exc, OSError):
            return ShardIOError(f"{path}: cannot read at byte {offset}: {exc}", path)
        return CorruptRecordError(path, offset, f"cannot decode the record: {exc}")

    # -- locating records ------------------------------------------------------

    def _position_of_key(self, key: str) -> int | None:
        try:
            position = int(key)
        except ValueError:
            return None
        return position if 0 <= position < self._len and str(position) == key else None

    def _shard_at(self, position: int) -> tuple[_Shard, int]:
        if self._positions_moved:
            raise StaleShardError(
                f"dataset {self.dataset!r} changed since this reader opened: a re-index "
                "moved its positions (positions and position keys are not stable across "
                "re-ingest); call reader.refresh() or reopen the reader"
            )
        if not -self._len <= position < self._len:
            raise IndexError(f"position {position} out of range for {self._len} records")
        position %= self._len
        shard = self._order[bisect.bisect_right(self._starts, position) - 1]
        return shard, position - shard.first

    def _locate(self, conn: sqlite3.Connection, key: Any) -> Row | None:
        key = str(key)
        if self._by_position:
            position = self._position_of_key(key)
            if position is None:
                return None
            return self._rows_at(conn, [position])[0][:5]
        row = conn.execute(_BY_KEY, (self._id, key)).fetchone()
        return None if row is None else row[:5]

    def _rows_at(self, conn: sqlite3.Connection, positions: Sequence[int]) -> list[tuple[Any, ...]]:
        """Record rows (with the key last) for positions, in the order given; one query."""
        pairs = []
        for position in positions:
            shard, ordinal = self._shard_at(position)
            pairs.append((shard.id, ordinal))
        rows = _batch_query(conn, _MANY_BY_POSITION, pairs, ())
        if len(rows) != len(pairs):  # cannot happen within one snapshot: a broken catalog
            raise StaleShardError(
                f"dataset {self.dataset!r} changed since this reader opened: reopen it"
            )
        return rows

    # -- records -----------------------------------------------------------------

    @_follows_reindex
    def get_raw(self, key: Any) -> Any:
        """The record's bytes as stored (``{member: bytes}`` for tar), or None."""
        conn = self._conn()
        row = self._locate(conn, key)
        return None if row is None else self._load(conn, [row], raw=True)[0]

    @_follows_reindex
    def get_record(self, key: Any) -> Any:
        """The decoded record (a ``tf.train.Example`` for TFRecord), or None."""
        conn = self._conn()
        row = self._locate(conn, key)
        if row is None:
            return None
        if self._parts:
            return self._load_parts(conn, [row])[0]
        try:
            return self._fmt.decode(self._read(row[1], row[3], row[4]), self.options)
        except Exception as exc:  # bad bytes for the format, or a failed read
            raise self._failed(exc, row[1], row[3]) from None

    def get_feature(self, key: Any, feature_name: str) -> Any:
        """The first value of one feature, or None when the key or feature is missing.

        For formats whose records have parts (tar) only that member is read.
        """
        if self._parts and not self._by_position:
            return self._member(key, feature_name)
        record = self.get_record(key)
        if record is None:
            return None
        values = self._fmt.feature_list(record, feature_name)
        return values[0] if values else None

    @_follows_reindex
    def _member(self, key: Any, feature_name: str) -> bytes | None:
        row = self._conn().execute(_MEMBER_BY_KEY, (self._id, str(key), feature_name))
        found = row.fetchone()
        return None if found is None else self._read(*found)

    def get_feature_list(self, key: Any, feature_name: str) -> list[Any] | None:
        """All values of one feature, or None when the key or feature is missing."""
        record = self.get_record(key)
        if record is None:
            return None
        values = self._fmt.feature_list(record, feature_name)
        return list(values) if values else None  # empty -> None, as tfd-utils

    @_follows_reindex
    def get_many(self, keys: Sequence[Any], *, raw: bool = False) -> list[Any]:
        """Records for ``keys`` in the same order, found with one query.

        Raises :class:`KeyNotFoundError` (a ``KeyError``) naming missing keys.
        Shards are read in offset order, whatever the order of ``keys``.
        """
        keys = [str(k) for k in keys]
        if self._by_position:
            positions = [self._position_of_key(k) for k in keys]
            missing = [k for k, p in zip(keys, positions, strict=True) if p is None]
            if missing:
                raise KeyNotFoundError(self._missing_message(missing))
            return self.get_many_at([p for p in positions if p is not None], raw=raw)
        conn = self._conn()
        rows = _batch_query(conn, _MANY_BY_KEY, keys, (self._id,))
        if len(rows) != len(keys):
            found = {r[0] for r in rows}
            raise KeyNotFoundError(
                self._missing_message([k for i, k in enumerate(keys) if i not in found])
            )
        return self._load(conn, rows, raw)

    def get_record_at(self, position: int, *, raw: bool = False) -> Any:
        """The record at ``position`` (0..len-1, negative counts from the end)."""
        return self.get_many_at([position], raw=raw)[0]

    def key_at(self, position: int) -> str:
        conn = self._conn()
        shard, ordinal = self._shard_at(position)
        if self._by_position:
            return str(shard.first + ordinal)
        return str(self._rows_at(conn, [position])[0][5])

    @_follows_reindex
    def get_many_at(self, positions: Sequence[int] | slice, *, raw: bool = False) -> list[Any]:
        """Records at ``positions`` (a sequence or a slice), one query for the batch."""
        conn = self._conn()
        if isinstance(positions, slice):
            positions = range(*positions.indices(self._len))
        return self._load(conn, self._rows_at(conn, positions), raw)

    def _load(
        self, conn: sqlite3.Connection, rows: Sequence[Sequence[Any]], raw: bool
    ) -> list[Any]:
        """Read and decode the records of ``rows`` (in batch order), in file order."""
        if self._parts:
            return self._load_parts(conn, rows)
        out: list[Any] = [None] * len(rows)
        read, decode, options, verify = (
            self._fmt.read,
            self._fmt.decode,
            self.options,
            self.verify_crc,
        )
        shards = self._shards
        touched: dict[int, tuple[CheckedSource, Any, str]] = {}
        for row in sorted(rows, key=_LOCATION):
            shard_id = row[1]
            opened = touched.get(shard_id)
            if opened is None:
                source = self._sources.get(shard_id) or self._source(shard_id)
                opened = touched[shard_id] = (source, source.unchecked, shards[shard_id].path)
            try:
                data = read(opened[1], opened[2], row[3], row[4], verify)
                out[row[0]] = data if raw else decode(data, options)
            except Exception as exc:  # bad bytes for the format, or a failed read
                raise self._failed(exc, shard_id, row[3]) from None
        for source, _, _ in touched.values():  # one file check per shard covers its reads
            source.check()
        return out

    def _load_parts(
        self, conn: sqlite3.Connection, rows: Sequence[Sequence[Any]]
    ) -> list[dict[str, bytes]]:
        """Samples of ``rows`` (in batch order: ``row[0]`` is each row's place)."""
        members = conn.execute(_MEMBERS_AT, (json.dumps([(r[1], r[2]) for r in rows]),))
        out: list[dict[str, bytes]] = [{} for _ in rows]
        for index, name, offset, length, extents in members.fetchall():
            row = rows[index]
            out[row[0]][name] = self._read(row[1], offset, length, extents)
        return out

    def _missing_message(self, missing: list[str]) -> str:
        shown = ", ".join(repr(k) for k in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        return f"{len(missing)} key(s) not in dataset {self.dataset!r}: {shown}{more}"

    # -- keys and SQL ------------------------------------------------------------

    def iter_keys(self) -> Iterator[str]:
        """Every key in position order, streamed shard by shard (no full list)."""
        if self._by_position:
            yield from (str(p) for p in range(self._len))
            return
        conn = self._conn()
        for shard in list(self._order):
            # one shard's keys at a time: lookups between two keys may renew the snapshot
            for (key,) in conn.execute(_KEYS_OF_SHARD, (shard.id,)).fetchall():
                yield key

    def get_keys(self) -> list[str]:
        """Every key in position order (a list; prefer ``iter_keys`` for huge datasets)."""
        return list(self.iter_keys())

    def where(
        self, predicate: str, params: Sequence[Any] | dict[str, Any] | None = None
    ) -> list[str]:
        """Keys of the records matching a SQL predicate over the dataset's view.

        ``reader.where("label = 3 AND score > 0.5")``; use ``?`` placeholders
        with ``params`` for values. Keys come back in position order.
        """
        rows = self.catalog.query(
            f'SELECT key FROM "{self.dataset}" WHERE {predicate} ORDER BY position', params
        )
        return [r[0] for r in rows]

    def contains_key(self, key: Any) -> bool:
        return self._locate(self._conn(), key) is not None

    def get_stats(self) -> dict[str, Any]:
        """Counts as tfd-utils reports them, plus the catalog and dataset names and
        ``duplicates_dropped``: the records of the shards that the dataset does not
        serve because another record has the same key (``on_duplicate``)."""
        conn = self._conn()
        options = json.loads(conn.execute(_OPTIONS, (self._id,)).fetchone()[0])
        dropped = options.get(DROPPED)
        return {
            "total_records": self._len,
            "total_files": len(self._order),
            "records_per_file": {os.path.basename(s.path): s.count for s in self._order},
            "index_file": str(self.catalog.path),
            "dataset": self.dataset,
            "format": self.format,
            "key_rule": self.key_rule,
            "duplicates_dropped": sum(dropped.values()) if isinstance(dropped, dict) else 0,
        }

    @property
    def index(self) -> DatasetIndex:
        """tfd-utils' ``{key: location}`` index as a read-only view of the catalog:
        point lookups are one query, iteration is streamed (see
        :mod:`shardcat.readers.index`)."""
        return DatasetIndex(self)

    def features(self, record: Any) -> dict[str, list[Any]]:
        """A decoded record as ``{feature: [values]}``."""
        return self._fmt.features(record)

    def to_dict(self, record: Any) -> dict[str, Any]:
        """A decoded record as ``{feature: value}``: single values unwrapped, others lists."""
        return {k: v[0] if len(v) == 1 else v for k, v in self._fmt.features(record).items()}

    def describe(self) -> dict[str, str]:
        """Feature name -> type, read off the first record."""
        if not self._len:
            return {}
        return self._fmt.describe(self.get_record_at(0))

    def verify(
        self, progress: Callable[[int, int], None] | None = None
    ) -> list[CorruptRecordError]:
        """Re-read every record checking framing and checksums; one error per bad record
        (a shard whose file is not the indexed version is one error at byte 0)."""
        problems: list[CorruptRecordError] = []
        self.catalog.reader_connection()  # see the latest commit
        conn = self._conn()
        done = 0
        for shard in list(self._order):
            try:
                self._source(shard.id)
            except ShardcatError as exc:  # stale, missing or unreadable file
                problems.append(CorruptRecordError(shard.path, 0, str(exc)))
                done += shard.count
                continue
            columns = '"offset", length, extents' if self._parts else '"offset", length, NULL'
            table = "shardcat_members" if self._parts else "shardcat_records"
            rows = conn.execute(
                f'SELECT {columns} FROM {table} WHERE shard_id = ? ORDER BY "offset"', (shard.id,)
            ).fetchall()
            for offset, length, extents in rows:
                try:
                    self._read(shard.id, offset, length, extents, verify=True)
                except CorruptRecordError as exc:
                    problems.append(exc)
                except StaleShardError as exc:  # the file is not the indexed version
                    problems.append(CorruptRecordError(shard.path, 0, str(exc)))
                    break
                if not self._parts:  # rows are members for tar: count records per shard
                    done += 1
                    if progress is not None and done % 1000 == 0:
                        progress(done, self._len)
            if self._parts:
                done += shard.count
                if progress is not None:
                    progress(done, self._len)
        if progress is not None:
            progress(done, self._len)
        return problems

    def rebuild_index(self) -> None:
        """Re-index every shard of this dataset from its source patterns."""
        sources = [absolute_path(p, self.catalog.directory) for p in self._patterns]
        self.catalog.ingest(
            sources, self.dataset, format=self.format, options=self.options, rescan=True
        ).close()
        self.refresh()

    # -- protocol ----------------------------------------------------------------

    def __len__(self) -> int:
        return self._len

    def __contains__(self, key: Any) -> bool:
        return self.contains_key(key)

    def __getitem__(self, key: Any) -> Any:
        record = self.get_record(key)
        if record is None:
            raise KeyNotFoundError(f"key {str(key)!r} not in dataset {self.dataset!r}")
        return record

    def __iter__(self) -> Iterator[str]:
        return self.iter_keys()

    def _close_fds(self) -> None:
        if self._pool_generation == _engine._fork_generation:  # never the parent's files
            for source in self._sources.values():
                source.close()
        self._sources = {}

    def close(self) -> None:
        """Close file descriptors (and the catalog, when this reader opened it)."""
        if self.closed:
            return
        self._close_fds()
        if self._owns_catalog:
            self.catalog.close()
        self.closed = True

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dataset={self.dataset!r}, records={self._len})"

    @property
    def index_file(self) -> str:
        """The catalog file (tfd-utils' name for where the index lives)."""
        return str(self.catalog.path)

    def _open_paths(
        self,
        paths: PathsLike,
        format: str,
        *,
        index_file: str | os.PathLike[str] | None,
        dataset: str | None,
        readonly: bool,
        workers: int | None,
        options: dict[str, Any],
        on_duplicate: str,
        verify_crc: bool,
        file_pool_size: int,
    ) -> None:
        """What every path-taking reader does: find the catalog (location rule),
        index new or changed shards unless ``readonly``, name the dataset, open it."""
        files = resolve_paths(paths)
        if not files:
            raise CatalogError(f"No {get_format(format).TITLE} files found for path: {paths}")
        shard_dir = os.path.commonpath([str(Path(f).parent) for f in files])
        if index_file is not None:  # a tfd-utils pickle: imported once into a catalog beside it
            from shardcat.legacy import catalog_for_legacy_index

            index_file = catalog_for_legacy_index(
                index_file,
                paths,
                format,
                options=options,
                readonly=readonly,
                workers=workers,
                on_duplicate=on_duplicate,
            )
        catalog = Catalog(locate(index_file, shard_dir), readonly=readonly)
        dropped = 0
        try:
            if readonly:
                name = dataset or catalog.find_dataset(paths, format=format, options=options)
            else:
                with catalog.ingest(
                    paths,
                    dataset,
                    format=format,
                    options=options,
                    workers=workers,
                    on_duplicate=on_duplicate,
                ) as indexed:
                    name, dropped = indexed.dataset, indexed.indexed_duplicates
            if name is None:
                raise CatalogError(
                    f"{catalog.path} has no dataset for {paths!r}; index it first "
                    "(catalog ingest) or open without readonly=True"
                )
            Reader.__init__(
                self,
                catalog,
                name,
                verify_crc=verify_crc,
                file_pool_size=file_pool_size,
                owns_catalog=True,
            )
        except BaseException:
            catalog.close()
            raise
        self.files = files
        if dropped:
            warnings.warn(
                f"{dropped} duplicate record{'s' if dropped > 1 else ''} in dataset "
                f"{self.dataset!r}: as tfd-utils, the reader keeps the last one of each key "
                "(in shard path order); get_stats()['duplicates_dropped'] counts them",
                UserWarning,
                stacklevel=3,
            )

    # Pickling (DataLoader with the spawn start method): reopen by name.
    def __getstate__(self) -> dict[str, Any]:
        return {
            "catalog": self.catalog.path,
            "readonly": self.catalog.readonly,
            "immutable": self.catalog.immutable,
            "dataset": self.dataset,
            "verify_crc": self.verify_crc,
            "pool": self._pool_size,
            "files": getattr(self, "files", None),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        catalog = Catalog(
            state["catalog"], readonly=state["readonly"], immutable=state["immutable"]
        )
        Reader.__init__(
            self,
            catalog,
            state["dataset"],
            verify_crc=state["verify_crc"],
            file_pool_size=state["pool"],
            owns_catalog=True,
        )
        if state["files"] is not None:
            self.files = state["files"]


class TFRecordReader(Reader):
    """tfd-utils' ``TFRecordRandomAccess``, backed by the catalog.

    Takes a path, a glob or a list of them. The shards are indexed into the
    catalog on first use (``index_file`` is the catalog file; by default
    ``$SHARDCAT_CATALOG`` or ``shardcat.sqlite`` beside the shards) and only
    changed shards are re-indexed later. ``max_workers`` bounds the indexing
    processes. ``progress_interval``, ``use_pread`` and
    ``eager_open_workers`` are accepted for compatibility: reads always use
    ``os.pread``. ``index`` is tfd-utils' ``{key: {file, offset, length}}``
    as a read-only view of the catalog. Files indexed already under another
    key feature get a dataset of their own (``<name>_by_<feature>``). A key
    that several records share keeps the last one, as tfd-utils does (a
    warning says how many were dropped; ``get_stats()["duplicates_dropped"]``).
    New: ``dataset`` names the dataset, ``key_by_position`` keys records
    ``"0".."n-1"``, ``on_duplicate`` (``"last"``, ``"first"`` or ``"error"``),
    ``verify_crc`` checks CRCs on every read, ``readonly`` never writes the
    catalog (it must be indexed already).
    """

    def __init__(
        self,
        tfrecord_path: PathsLike,
        key_feature_name: str = "key",
        index_file: str | os.PathLike[str] | None = None,
        progress_interval: int = 1024,
        max_workers: int | None = None,
        use_multiprocessing: bool = True,
        file_pool_size: int = 100,
        use_pread: bool = False,
        eager_open_workers: int = 64,
        *,
        dataset: str | None = None,
        key_by_position: bool = False,
        on_duplicate: str = "last",
        verify_crc: bool = False,
        readonly: bool = False,
    ) -> None:
        del progress_interval, use_pread, eager_open_workers  # tfd-utils knobs with no effect here
        self.key_feature_name = key_feature_name
        self._open_paths(
            tfrecord_path,
            "tfrecord",
            index_file=index_file,
            dataset=dataset,
            readonly=readonly,
            workers=max_workers if use_multiprocessing else 1,
            options={"key": None if key_by_position else key_feature_name},
            on_duplicate=on_duplicate,
            verify_crc=verify_crc,
            file_pool_size=file_pool_size,
        )

    @property
    def tfrecord_files(self) -> list[str]:
        return self.files

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.key_feature_name = self.options.get("key") or "key"


class RecordIOReader(Reader):
    """MXNet RecordIO shards (``.rec``), backed by the catalog.

    Takes a path, a glob or a list of them; shards are indexed on first use
    as :class:`TFRecordReader` does (``index_file`` is the catalog file).
    ``get_record(key)`` returns the payload exactly as MXNet's
    ``MXIndexedRecordIO.read_idx`` does. Keys come from the ``.idx`` beside
    each ``.rec`` when the first one has it, else they are positions
    ``"0".."n-1"`` (``key_by_position=True`` forces that). ``header``: whether
    payloads start with an ``IRHeader`` (None: detected from the first
    record); its label(s), id and id2 become SQL fields and features.
    """

    def __init__(
        self,
        rec_path: PathsLike,
        index_file: str | os.PathLike[str] | None = None,
        max_workers: int | None = None,
        file_pool_size: int = 100,
        *,
        dataset: str | None = None,
        key_by_position: bool = False,
        header: bool | None = None,
        on_duplicate: str = "error",
        readonly: bool = False,
    ) -> None:
        options: dict[str, Any] = {"key": None if key_by_position else "key"}
        if header is not None:
            options["header"] = header
        self._open_paths(
            rec_path,
            "recordio",
            index_file=index_file,
            dataset=dataset,
            readonly=readonly,
            workers=max_workers,
            options=options,
            on_duplicate=on_duplicate,
            verify_crc=False,
            file_pool_size=file_pool_size,
        )

    @property
    def rec_files(self) -> list[str]:
        return self.files


class TarReader(Reader):
    """tfd-utils' ``TarRandomAccess``, backed by the catalog.

    Takes a ``.tar`` (or ``.tar.gz``/``.tar.bz2``/``.tar.xz``, detected by
    content) path, a glob or a list of them; indexed into the catalog on first
    use as :class:`TFRecordReader` does (``index_file`` is the catalog file).
    Records are samples ``{feature: bytes}``; ``get_feature`` reads only that
    member. ``grouping`` is ``"tfd"`` by default, so keys are tfd-utils' (the
    member path without its last suffix); ``"webdataset"`` splits at the
    first dot of the basename, as WebDataset and ``catalog ingest`` do.
    Archives indexed already with the other grouping get a dataset of their
    own (``<name>_tfd``, ``<name>_webdataset``). ``index`` is tfd-utils'
    ``{key: {feature: {file, member_name, data_offset, size}}}`` as a
    read-only view of the catalog. A stem found in several archives keeps the
    last archive's sample, as tfd-utils does (a warning says how many were
    dropped; ``get_stats()["duplicates_dropped"]``). ``progress_interval``
    and ``use_multiprocessing=False`` (one indexing process) are accepted for
    compatibility. New: ``dataset``, ``key_by_position``, ``on_duplicate``
    (``"last"``, ``"first"`` or ``"error"``), ``verify`` (check each
    member's tar header on read) and ``readonly``.
    """

    def __init__(
        self,
        tar_path: PathsLike,
        index_file: str | os.PathLike[str] | None = None,
        progress_interval: int = 1024,
        max_workers: int | None = None,
        use_multiprocessing: bool = True,
        file_pool_size: int = 20,
        *,
        dataset: str | None = None,
        grouping: str = "tfd",
        key_by_position: bool = False,
        on_duplicate: str = "last",
        verify: bool = False,
        readonly: bool = False,
    ) -> None:
        del progress_interval  # tfd-utils knob with no effect here
        self._open_paths(
            tar_path,
            "tar",
            index_file=index_file,
            dataset=dataset,
            readonly=readonly,
            workers=max_workers if use_multiprocessing else 1,
            options={"key": None if key_by_position else "key", "grouping": grouping},
            on_duplicate=on_duplicate,
            verify_crc=verify,
            file_pool_size=file_pool_size,
        )

    @property
    def tar_files(self) -> list[str]:
        return self.files

    def get_feature_list(self, key: Any, feature_name: str) -> list[Any] | None:
        """``[bytes]`` of one member (only that member is read), or None."""
        value = self.get_feature(key, feature_name)
        return None if value is None else [value]


TFRecordRandomAccess = TFRecordReader
TarRandomAccess = TarReader
