"""The :class:`Reader`: the store says where a record is (:mod:`shardcat.catalog.lookup`),
a source fetches its bytes (:mod:`shardcat.sources.local`), its format decodes them.

A lookup by key or by position is one indexed point query (a cached prepared
statement on a read-only DBAPI connection) plus one ``os.pread``. Batches are
one query per batch. Opening a reader loads the dataset's shard rows, never
its records. The path-taking drop-ins for tfd-utils users
(``TFRecordRandomAccess``, ...) are in :mod:`shardcat.facade.dropin`.

**Consistency.** Every public call works in one read snapshot of the catalog
(kept for up to ``SNAPSHOT_SECONDS`` across calls) and with the shard list of
that snapshot: when a snapshot begins, the dataset's ``version`` is compared
with the one the shard list was loaded at, and the list is reloaded when
another process committed since. A record's location is therefore always read
together with the indexed version (``generation`` and file identity) of its
shard, and bytes are read only from a file that is that version (see
:mod:`shardcat.sources.local`): a shard re-indexed while a reader runs is
seen as the old or the new version, never a mix, never missing. A file that
matches no indexed version raises :class:`StaleShardError`.

**Checks.** Every read compares the bytes it hands back with the catalog's
check of the record (or tar member), its CRC32C mixed with the key's, in the
native extension (:mod:`shardcat.formats.checks`), with the key it asked for
(reads by position: the row's): a mismatch is a :class:`CorruptRecordError`
naming shard, byte offset and key. Rows without a stored check (indexed before
schema version 7, Parquet) are checked by the record's framing instead.
``verify=False`` trusts the bytes (``verify_crc`` is its older name).

**Positions** (``get_record_at``, slices, and the keys of datasets keyed by
position) are those of the shard layout the reader opened with. A re-index
that moves them (a shard changed, added or removed) makes positional access
raise :class:`StaleShardError` until ``refresh()``: position keys are not
stable across re-ingest, and a reader never silently lets a position name
another record. Keys of keyed datasets stay valid.

**On a server catalog** (PostgreSQL) every query is a network round trip, so
what costs one is worth knowing: ``get_record``/``get_feature``/``get_raw``/
``reader[key]``, ``get_record_at`` and ``key_at`` are one each; ``get_many``
and ``get_many_at`` (lists or slices) are one for the whole batch (plus one for
the members of tar records); ``where`` is one; ``iter_keys``/``get_keys`` are
one per shard, ``reader.index`` iterates in pages of a shard; a snapshot
renewal (at most every ``SNAPSHOT_SECONDS``) adds one or two. Batch what you
can: ``RecordDataset`` with a batch sampler fetches through ``get_many``.
Reads of the shards' bytes never touch the server.

**As tfd-utils.** ``reader.index`` is tfd-utils' ``{key: location}`` dict as
a read-only view of the catalog (:mod:`shardcat.readers.index`).

**Processes.** After ``fork`` (DataLoader workers) the catalog connection and
every open file, decompressor and seek index are reopened in the child: the
pool of sources (:mod:`shardcat.sources.pool`) is keyed by fork generation,
checked on every read.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from shardcat.catalog import lookup
from shardcat.catalog.bad_records import bad_records_of
from shardcat.catalog.lookup import ReadConnection
from shardcat.catalog.sync import DROPPED
from shardcat.errors import (
    CorruptRecordError,
    KeyNotFoundError,
    ShardcatError,
    ShardIOError,
    StaleShardError,
)
from shardcat.formats.base import Location
from shardcat.formats.checks import checked_chunks, crc32c, key_check, mismatch
from shardcat.readers import record_view
from shardcat.readers.batch import BatchReads
from shardcat.readers.hot import AGAIN
from shardcat.readers.index import DatasetIndex
from shardcat.readers.verify import extents_of, verify_records
from shardcat.readers.view import follows_reindex, one_call
from shardcat.sources.rawio import Source

__all__ = ["Reader"]


class Reader(BatchReads):
    """Random access to one dataset of a catalog (any container format).

    Keys are strings. ``reader[key]`` raises ``KeyError`` for a missing key;
    ``get_record``/``get_feature`` return None instead (as tfd-utils does).
    Bytes are those the catalog indexed or a :class:`ShardcatError`, never
    others (see the module docstring for re-indexing and forked workers).
    """

    def _fetch(
        self, source: Source, location: Location, crc: int | None, key: Any, frame: bool = False
    ) -> bytes:
        """One payload through ``source``; with ``verify`` (the reader's default), its
        bytes checked against the catalog's ``crc`` of the record, or by its framing
        when the catalog has none (``frame``: both, whatever ``verify``), else a
        :class:`CorruptRecordError` naming shard, offset and ``key``."""
        verify = frame or self.verify_reads
        data = self._fmt.read(source, location, verify and (frame or crc is None))
        if verify and crc is not None:
            got = crc32c(data)  # mixed with the key asked for (by position: the row's)
            got ^= 0 if self._by_position else key_check(key)
            if got != crc:
                raise mismatch(source.path, location.offset, key, crc, got)
        return data

    def _read(
        self, shard_id: int, location: Location, crc: int | None, key: Any, frame: bool = False
    ) -> bytes:
        source = self._source(shard_id)
        try:
            return self._fetch(source, location, crc, key, frame)
        except OSError as exc:  # EIO and the like (our own errors are not OSErrors here)
            if isinstance(exc, ShardcatError):
                raise
            path = self._shards[shard_id].path
            raise ShardIOError(
                f"{path}: cannot read at byte {location.offset}: {exc}", path
            ) from None

    def _failed(self, exc: Exception, shard_id: int, offset: int) -> ShardcatError:
        """The error for a record that could not be read or decoded: the file checked
        first (bytes that changed under the read are a stale shard, not a corrupt one),
        then the format's or the system's error as a :class:`ShardcatError`."""
        source = self._pool.sources.get(shard_id)
        if source is not None:
            source.check()
        if isinstance(exc, ShardcatError):
            return exc
        path = self._shards[shard_id].path
        if isinstance(exc, OSError):
            return ShardIOError(f"{path}: cannot read at byte {offset}: {exc}", path)
        return CorruptRecordError(path, offset, f"cannot decode the record: {exc}")

    def _locate(self, conn: ReadConnection, key: Any) -> lookup.Row | None:
        key = str(key)
        if self._by_position:
            position = self._position_of_key(key)
            return None if position is None else self._row_at(conn, position)
        if key in self._deleted:  # (an empty set unless the dataset has soft deletes)
            return None
        row: lookup.Row | None = conn.execute(self._sql.by_key, (key,)).fetchone()
        return row

    def _location(self, row: lookup.Row) -> Location:
        """The location of a record row (see :mod:`shardcat.catalog.lookup`)."""
        at = self._at
        if self._one_range:
            return Location(row[at], row[at + 1])
        extents = row[at + 3]
        return Location(
            row[at], row[at + 1], None if extents is None else extents_of(extents), row[at + 4]
        )

    def _name_of(self, row: lookup.Row) -> Any:
        """What errors call the record of a row that ends with its key (``at`` rows)."""
        if self._by_position:  # its key is a placeholder, #<shard id>:<ordinal>
            return str(self._shards[row[1]].first + int(str(row[-1]).rpartition(":")[2]))
        return row[-1]

    def _rows_at(self, conn: ReadConnection, positions: Sequence[int]) -> list[lookup.Row]:
        """Record rows (with the key last) for positions, in the order given; one query."""
        if len(positions) == 1:
            return [self._row_at(conn, positions[0])]
        pairs = []
        for position in positions:
            shard, ordinal = self._shard_at(position)
            pairs.append((shard.id, ordinal))
        rows = lookup.records_at(conn, self._sql, pairs)
        if len(rows) != len(pairs):  # cannot happen within one snapshot: a broken catalog
            raise StaleShardError(
                f"dataset {self.dataset!r} changed since this reader opened: reopen it"
            )
        return rows

    # -- records -----------------------------------------------------------------

    @follows_reindex
    def get_raw(self, key: Any) -> Any:
        """The record's bytes as stored (``{member: bytes}`` for tar), or None."""
        conn = self._conn()
        row = self._locate(conn, key)
        if row is None:
            return None
        key = str(key)
        if self._parts:
            return self._load_parts(conn, [row], [key])[0]
        return self._decoded(row, True, key)

    def get_record(self, key: Any) -> Any:
        """The decoded record (a ``tf.train.Example`` for TFRecord), or None."""
        if self._hot is not None:
            data = self._native(key, None)
            if data is None:
                return None
            if data is not AGAIN:
                try:
                    return self._fmt.decode(data, self.options)
                except Exception:
                    pass
        return self._get_record(key)

    @follows_reindex
    def _get_record(self, key: Any) -> Any:
        """:meth:`get_record` in Python (the reference)."""
        conn = self._conn()
        if self._plain:  # every single read by key: the shortest lookup, _decoded inlined
            found = conn.execute(self._sql.one, (str(key),)).fetchone()
            if found is None:
                return None
            shard_id, crc = found[0], found[3]
            try:
                source = self._pool.sources.get(shard_id) or self._source(shard_id)
                if crc is None or not self.verify_reads:  # unchecked, or framing only
                    data = self._fetch(source, Location(found[1], found[2]), crc, key)
                else:  # _fetch inlined: every checked read by key
                    data = self._fmt.read(source, Location(found[1], found[2]), False)
                    key = str(key)  # keyed: the check mixes the key asked for
                    got = crc32c(data) ^ key_check(key)
                    if got != crc:
                        raise mismatch(source.path, found[1], key, crc, got)
                return self._fmt.decode(data, self.options)
            except Exception as exc:  # bad bytes for the format, or a failed read
                raise self._failed(exc, shard_id, found[1]) from None
        row = self._locate(conn, key)
        if row is None:
            return None
        key = str(key)
        return (
            self._load_parts(conn, [row], [key])[0]
            if self._parts
            else self._decoded(row, False, key)
        )

    def _decoded(self, row: lookup.Row, raw: bool, key: Any) -> Any:
        """One record of a row (not a PARTS format): read, checked, decoded unless
        ``raw``; ``key`` names it in errors."""
        shard_id = row[1]
        try:
            data = self._fetch(
                self._pool.sources.get(shard_id) or self._source(shard_id),
                self._location(row),
                row[self._at + 2],
                key,
            )
            return data if raw else self._fmt.decode(data, self.options)
        except Exception as exc:  # bad bytes for the format, or a failed read
            raise self._failed(exc, shard_id, row[self._at]) from None

    def get_feature(self, key: Any, feature_name: str) -> Any:
        """The first value of one feature, or None when the key or feature is missing.

        For formats whose records have parts (tar) only that member is read.
        """
        if self._parts and not self._by_position:
            return self._member(key, feature_name)
        if self._hot is not None:
            value = self._native(key, feature_name)
            if value is not AGAIN:
                return value
        record = self._get_record(key)
        if record is None:
            return None
        values = self._fmt.feature_list(record, feature_name)
        return values[0] if values else None

    @follows_reindex
    def _member(self, key: Any, feature_name: str) -> bytes | None:
        if str(key) in self._deleted:
            return None
        found = lookup.member_by_key(self._conn(), self._sql, str(key), feature_name)
        if found is None:
            return None
        shard_id, offset, length, extents, crc = found
        return self._read(shard_id, Location(offset, length, extents_of(extents)), crc, str(key))

    @follows_reindex
    def member_chunks(self, key: Any, feature_name: str) -> Iterator[bytes] | None:
        """One member of a record made of parts (a tar sample keyed by name) in pieces
        of at most 1 MiB, read as they are consumed and checked as by
        :meth:`get_feature`; None when the key or member is missing or records have
        no parts. For members too large to hold: ``catalog get`` writes them so."""
        found = None
        if self._parts and not self._by_position and str(key) not in self._deleted:
            found = lookup.member_by_key(self._conn(), self._sql, str(key), feature_name)
        if found is None:
            return None
        shard_id, offset, length, extents, crc = found
        source = self._source(shard_id)
        by_crc = crc if self.verify_reads else None  # else framing only, if verifying
        location = Location(offset, length, extents_of(extents))
        framing = self.verify_reads and by_crc is None
        chunks = record_view.read_chunks(self._fmt, source, location, framing)
        return (
            chunks
            if by_crc is None
            else checked_chunks(chunks, by_crc ^ key_check(str(key)), source.path, offset, key)
        )

    def get_feature_list(self, key: Any, feature_name: str) -> list[Any] | None:
        """All values of one feature, or None when the key or feature is missing."""
        record = self.get_record(key)
        if record is None:
            return None
        values = self._fmt.feature_list(record, feature_name)
        return list(values) if values else None  # empty -> None, as tfd-utils

    @follows_reindex
    def get_many(self, keys: Sequence[Any], *, raw: bool = False) -> list[Any]:
        """Records for ``keys`` in the same order, found with one query.

        Raises :class:`KeyNotFoundError` (a ``KeyError``) naming missing keys.
        Shards are read in offset order, whatever the order of ``keys``.
        """
        keys = [str(k) for k in keys]
        if self._by_position:
            return self.get_many_at(self._positions_of(keys), raw=raw)
        conn = self._conn()
        got = self._native_records(conn, keys, True, raw)
        if got is not AGAIN:
            return got  # type: ignore[no-any-return]
        rows = lookup.records_by_key(conn, self._sql, keys)
        if self._deleted:
            rows = [r for r in rows if keys[r[0]] not in self._deleted]
        if len(rows) != len(keys):
            found = {r[0] for r in rows}
            raise KeyNotFoundError(
                self._missing_message([k for i, k in enumerate(keys) if i not in found])
            )
        return self._load(conn, rows, raw, keys)

    @follows_reindex
    def get_record_at(self, position: int, *, raw: bool = False) -> Any:
        """The record at ``position`` (0..len-1, negative counts from the end): one
        point query on (shard, ordinal) (the native batch read of one, where it applies)."""
        conn = self._conn()
        if self._hot_at is not None:
            got = self._native_records(conn, [position], False, raw)
            if got is not AGAIN:
                return got[0]
        shard, ordinal = self._shard_at(position)
        row = conn.execute(self._sql.at, (shard.id, ordinal)).fetchone()  # _row_at inlined
        if row is None:
            raise self._broken()
        name = self._name_of(row)
        return (
            self._load_parts(conn, [row], [name])[0]
            if self._parts
            else self._decoded(row, raw, name)
        )

    @one_call
    def key_at(self, position: int) -> str:
        conn = self._conn()
        shard, ordinal = self._shard_at(position)
        if self._by_position:
            return str(shard.first + ordinal)
        return str(self._row_at(conn, position)[-1])

    @follows_reindex
    def keys_at(self, positions: Sequence[int] | slice) -> list[str]:
        """The keys at ``positions`` (a sequence or a slice), one query for the batch
        (none for a dataset keyed by position)."""
        conn = self._conn()
        if isinstance(positions, slice):
            positions = range(*positions.indices(self._len))
        if self._by_position:
            return [str(s.first + o) for s, o in map(self._shard_at, positions)]
        keys = [""] * len(positions)
        for row in self._rows_at(conn, positions) if positions else ():
            keys[row[0]] = str(row[-1])  # row[0]: its place in the batch
        return keys

    @follows_reindex
    def get_many_at(self, positions: Sequence[int] | slice, *, raw: bool = False) -> list[Any]:
        """Records at ``positions`` (a sequence or a slice), one query for the batch."""
        conn = self._conn()
        if isinstance(positions, slice):
            positions = range(*positions.indices(self._len))
        positions = list(positions)
        got = self._native_records(conn, positions, False, raw)
        if got is not AGAIN:
            return got  # type: ignore[no-any-return]
        return self._load(conn, self._rows_at(conn, positions), raw, None)

    def _name(self, row: lookup.Row, names: Sequence[Any] | None) -> Any:
        """What errors call a batch row's record: ``names[row[0]]``, else (rows with
        the key last) :meth:`_name_of` the row."""
        return self._name_of(row) if names is None else names[row[0]]

    def _load(
        self,
        conn: ReadConnection,
        rows: Sequence[lookup.Row],
        raw: bool,
        names: Sequence[Any] | None,
    ) -> list[Any]:
        """Read, check and decode the records of ``rows`` (in batch order), in file
        order; :meth:`_name` names a row's record in errors.

        Reads go through each shard's ``unchecked`` source; one file check per
        shard at the end covers every read before it."""
        if self._parts:
            return self._load_parts(conn, rows, names)
        out: list[Any] = [None] * len(rows)
        read, decode, options, location, verify = (
            self._fmt.read,
            self._fmt.decode,
            self.options,
            self._location,
            self.verify_reads,
        )
        # one location for the batch when records are one range (formats never keep
        # the location they read: see Format.read); its fields are set per record
        plain = Location(0, 0) if self._one_range else None
        # shard -> (source, its unchecked, whether to check frames: a remote batch's
        # records without a stored check, whatever ``verify``, as the bytes of a
        # prefetched answer hold them)
        touched: dict[int, tuple[Source, Source, bool]] = {}
        at = self._at
        keyed = not self._by_position  # the stored check mixes the record's key
        ordered = sorted(rows, key=operator.itemgetter(1, at))  # shards front to back
        ahead = self._prefetch([(r[1], r[at], r[at + 1]) for r in ordered])
        got: Any = self._read_natively(ordered, names) if plain is not None and not ahead else AGAIN
        if got is not AGAIN:
            try:
                return got if raw else [decode(data, options) for data in got]
            except Exception:
                pass
        for row in ordered:
            shard_id = row[1]
            opened = touched.get(shard_id)
            if opened is None:
                source = self._source(shard_id)
                opened = touched[shard_id] = (source, source.unchecked, source in ahead)
            try:
                if plain is None:
                    where = location(row)
                else:
                    where = plain
                    where.offset, where.length = row[at], row[at + 1]
                crc = row[at + 2]  # _fetch inlined: every record of every batch
                data = read(opened[1], where, (verify or opened[2]) and crc is None)
                if verify and crc is not None:
                    got = crc32c(data)
                    if keyed:  # the key asked for, or (rows by position) the row's
                        got ^= key_check(row[-1] if names is None else names[row[0]])
                    if got != crc:
                        raise mismatch(opened[1].path, row[at], self._name(row, names), crc, got)
                out[row[0]] = data if raw else decode(data, options)
            except Exception as exc:  # bad bytes for the format, or a failed read
                raise self._failed(exc, shard_id, row[at]) from None
        for source, _, _ in touched.values():  # one file check per shard covers its reads
            source.check()
        return out

    def _load_parts(
        self, conn: ReadConnection, rows: Sequence[lookup.Row], names: Sequence[Any] | None
    ) -> list[dict[str, bytes]]:
        """Samples of ``rows`` (in batch order: ``row[0]`` is each row's place;
        :meth:`_name` names its record in errors)."""
        members = lookup.members_at(conn, self._sql, [(r[1], r[2]) for r in rows])
        ahead = (
            self._prefetch([(rows[m[0]][1], m[2], m[3]) for m in members])
            if len(members) > 1
            else []
        )
        out: list[dict[str, bytes]] = [{} for _ in rows]
        for index, name, offset, length, extents, crc in members:
            row = rows[index]
            where = Location(offset, length, extents_of(extents))
            framed = crc is None and self._source(row[1]) in ahead
            out[row[0]][name] = self._read(row[1], where, crc, self._name(row, names), framed)
        for source in ahead:  # ends their batch
            source.check()
        return out

    # -- keys and SQL ------------------------------------------------------------

    def iter_keys(self) -> Iterator[str]:
        """Every key in position order, streamed shard by shard (no full list)."""
        if self._by_position:
            yield from (str(p) for p in range(self._len))
            return
        for shard in list(self._order):
            # one shard's keys at a time: lookups between two keys may renew the snapshot
            yield from self._exclusively(self._keys_of, shard.id)

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

    @one_call
    def contains_key(self, key: Any) -> bool:
        return self._locate(self._conn(), key) is not None

    @one_call
    def get_stats(self) -> dict[str, Any]:
        """Counts as tfd-utils reports them, plus the catalog and dataset names,
        ``duplicates_dropped``: the records of the shards that the dataset does not
        serve because another record has the same key (``on_duplicate``), and
        ``bad_records_per_file``: the records an ingest set aside, per shard that has
        any (``on_bad_record="skip"``; they are not records of the dataset)."""
        dropped = lookup.dataset_options(self._conn(), self._id).get(DROPPED)
        bad: dict[str, int] = {}
        for found in bad_records_of(self._conn(), self._id):
            name = os.path.basename(found.shard)
            bad[name] = bad.get(name, 0) + 1
        return {
            "total_records": self._len,
            "total_files": len(self._order),
            "records_per_file": {os.path.basename(s.path): s.count for s in self._order},
            "index_file": str(self.catalog.path),
            "dataset": self.dataset,
            "format": self.format,
            "key_rule": self.key_rule,
            "duplicates_dropped": sum(dropped.values()) if isinstance(dropped, dict) else 0,
            "bad_records": sum(bad.values()),
            "bad_records_per_file": bad,
            "deleted_records": len(self._dead),
        }

    @property
    def index(self) -> DatasetIndex:
        """tfd-utils' ``{key: location}`` index as a read-only view of the catalog:
        point lookups are one query, iteration is streamed (see
        :mod:`shardcat.readers.index`); files named as the reader was given them."""
        return DatasetIndex(self, self.names_as_given)

    def describe(self) -> dict[str, str]:
        """Feature name -> type, read off the first record."""
        if not self._len:
            return {}
        return record_view.describe(self._fmt, self.get_record_at(0))

    @one_call
    def verify(
        self,
        progress: Callable[[int, int], None] | None = None,  # the Progress shape
    ) -> list[CorruptRecordError]:
        """Re-read every record checking framing, checksums and the catalog's check of
        each record (whatever ``verify``); one error per bad record (a shard whose
        file is not the indexed version is one error at byte 0)."""
        return verify_records(self, progress)

    def rebuild_index(self) -> None:
        """Re-index every shard of this dataset from its source patterns (through what
        opened this reader: :class:`shardcat.Catalog`, the path-taking readers)."""
        self._reindex(self.catalog, self.dataset)
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

    def close(self) -> None:
        """Close file descriptors (and the catalog, when this reader opened it)."""
        if self.closed:
            return
        self._pool.close()
        for name in ("_hot", "_hot_at"):  # (None too when __init__ failed before them)
            hot = getattr(self, name, None)
            if hot is not None:
                hot.clear()  # its statements, before their connections close
        self.catalog.close()  # (its store only when the handle opened it)
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
