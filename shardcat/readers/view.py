"""The dataset as a reader sees it in one read snapshot: its shards (their indexed
versions and files), its positions, and the sources open on its shard files.

:class:`DatasetView` is the base of :class:`~shardcat.readers.reader.Reader`:
every public call takes :meth:`DatasetView._conn` once (a read snapshot of the
store, with the shard list reloaded when the dataset's ``version`` moved),
maps positions to ``(shard, ordinal)`` with the layout the reader was opened
with (pinned until :meth:`refresh`), and opens a shard's source only for its
indexed version (:func:`~shardcat.sources.local.open_source`), from a pool
kept per process (:mod:`shardcat.sources.pool`).
"""

from __future__ import annotations

import bisect
import functools
import threading
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from shardcat.catalog import engine as _engine
from shardcat.catalog import lookup
from shardcat.catalog.deletes import DELETED_AT
from shardcat.catalog.handle import ReadHandle
from shardcat.catalog.lookup import ReadConnection
from shardcat.catalog.schema import tag_of
from shardcat.catalog.sync import DROPPED, absolute_path
from shardcat.errors import CatalogError, ShardcatError, StaleShardError
from shardcat.formats.registry import get_format
from shardcat.readers import hot
from shardcat.readers.hot import AGAIN, MISS
from shardcat.sources import pool as _pool
from shardcat.sources.local import FileSource, Identity, open_source
from shardcat.sources.pool import SourcePool
from shardcat.sources.rawio import Source

#: the dataset option holding the storage options of remote shards (without secrets)
STORAGE_OPTIONS = "storage_options"

__all__ = ["DatasetView", "Reindex", "cannot_reindex", "follows_reindex", "one_call"]

F = TypeVar("F", bound=Callable[..., Any])

# how far a batch's prefetched range reaches before and after a record's stored
# location: a tar member's header block, a TFRecord frame's header and CRC
_PREFETCH_BEFORE = 512
_PREFETCH_AFTER = 64


#: How a reader re-indexes its dataset (``rebuild_index``), given by whoever opened it
#: (the facade: :func:`shardcat.facade.catalog.rebuild`); called with the reader's
#: handle and dataset name. A module-level function, so that it pickles with the reader.
Reindex = Callable[[ReadHandle, str], None]


def cannot_reindex(handle: ReadHandle, dataset: str) -> None:
    """The :data:`Reindex` of a reader opened without one."""
    raise CatalogError(
        f"this reader of {dataset!r} cannot re-index it: open it through shardcat.Catalog "
        "(or a path-taking reader), or run `catalog ingest --rescan`"
    )


@dataclass(frozen=True)
class _Shard:
    id: int
    path: str
    first: int
    count: int
    compression: str | None
    generation: int
    identity: Identity


def _alone(method: F, *, again: bool) -> F:
    """``method`` as one public call of a reader: threads sharing the reader take
    turns (its shard list, sources and the snapshot a call reads are the call's
    until it ends), and a database failure reading the catalog comes out as a
    :class:`CatalogError` naming it (see ``Backend.damage_error``).
    ``again``: repeated once when a shard file turned out stale and the catalog has
    meanwhile committed a newer version of the dataset (the call read a snapshot from
    just before a re-index). One wrapper, one frame: it runs on every single read."""

    @functools.wraps(method)
    def wrapper(self: DatasetView, *args: Any, **kwargs: Any) -> Any:
        if self._lock_generation != _engine._fork_generation:
            self._new_lock()  # a forked child never waits on a parent thread's lock
        with self._lock:
            try:
                try:
                    return method(self, *args, **kwargs)
                except StaleShardError:
                    if not (again and self._moved_on()):
                        raise
                    return method(self, *args, **kwargs)
            except StaleShardError as exc:
                if self._tag is None or exc.path is None:
                    raise
                raise _pinned_stale(exc, self._tag) from None
            except ShardcatError:
                raise
            except Exception as exc:
                if not (_engine.database_failure(exc) or _damaged_rows(self, exc)):
                    raise
                raise self.catalog.damaged(exc) from None

    return wrapper  # type: ignore[return-value]


def _pinned_stale(exc: StaleShardError, tag: tuple[str, str]) -> StaleShardError:
    """A tag's shard file that no longer is the version the tag pinned: the error
    names the tag and the file (a re-ingest cannot bring that version back)."""
    dataset, name = tag
    what = str(exc).partition(";")[0]  # "<file> changed after it was indexed: <how>"
    return type(exc)(
        f"tag {name!r} of dataset {dataset!r} pins shard {exc.path} as it was when "
        f"tagged, and {what}: the tag cannot read that shard's records (put the file "
        f"back as it was, or untag {name!r})",
        exc.path,
    )


def _damaged_rows(view: DatasetView, exc: Exception) -> bool:
    """Whether a type error came from rows of a damaged catalog (a location holding
    bytes where a number belongs): SQLite's quick_check says so. Only on that error
    path, never on a read that succeeds."""
    return isinstance(exc, (TypeError, OverflowError)) and bool(view.catalog.damage())


def one_call(method: F) -> F:
    """A public call of a reader, alone (see :func:`_alone`)."""
    return _alone(method, again=False)


def follows_reindex(method: F) -> F:
    """:func:`one_call`, repeated once after a re-index (see :func:`_alone`)."""
    return _alone(method, again=True)


class DatasetView:
    """A dataset's shards, positions and open sources for one reader (see the module
    docstring); the :class:`~shardcat.readers.reader.Reader` reads records through it."""

    # Readers opened on shard paths: each shard file -> its path as given (reader.index)
    names_as_given: dict[str, str] | None = None

    def __init__(
        self,
        catalog: ReadHandle,
        dataset: str,
        *,
        verify: bool = True,
        verify_crc: bool | None = None,
        file_pool_size: int = 1024,
        reindex: Reindex = cannot_reindex,
    ) -> None:
        #: the read-only handle on the store this reader reads (closed with the reader
        #: when the handle opened its store)
        self.catalog = catalog
        self.dataset = dataset
        #: ``(dataset, tag)`` when ``dataset`` names a tag (``train@v1``): read-only, pinned
        self._tag = tag_of(dataset)
        #: every read is checked (``verify``; ``verify_crc`` is its older name):
        #: see :class:`~shardcat.readers.reader.Reader`
        self.verify_reads = verify if verify_crc is None else verify_crc
        self._reindex = reindex
        self._pool = SourcePool(file_pool_size)
        self._shards: dict[int, _Shard] = {}
        self._serial = -1
        self._version: int | None = None
        self._pinned: tuple[tuple[int, ...], ...] | None = None
        self._positions_moved = False
        self.closed = False
        self._new_lock()
        #: Records dropped as duplicate keys by the ingest that returned this reader
        #: (:meth:`Catalog.ingest` sets it; 0 otherwise).
        self.indexed_duplicates = 0
        row = catalog.dataset_row(dataset)
        self._id: int = row.id
        self.format = row.format
        self.key_rule: str = row.key_rule
        # (DROPPED is bookkeeping, see get_stats, not a format option)
        self.options: dict[str, Any] = {k: v for k, v in row.options.items() if k != DROPPED}
        self._fmt = get_format(self.format)
        self._parts: bool = self._fmt.PARTS
        self._one_range: bool = self._fmt.ONE_RANGE
        self._by_position = self.key_rule == "position"
        #: records found by key with the shortest lookup (one range, no parts)
        self._plain_kind = self._one_range and not self._parts and not self._by_position
        self._plain = self._plain_kind  # ... and no soft deletes (see _load_deleted)
        examples = self.format == "tfrecord" and self.options.get("message") != "sequence_example"
        #: records as ``to_dict`` gives them straight off the wire (None: decode them)
        self.native_dicts = hot.example_dict if examples and hot.available() else None
        self._native_rows = self.native_dicts is not None  # batches read by hot.read_rows
        native = examples and catalog.backend.dialect.native_lookups and hot.available()
        #: the native single read by key (:mod:`shardcat.readers.hot`), where it applies
        self._hot_kind = self._plain_kind and native  # (_native checks soft deletes)
        #: ... and the native batch read by key or position (:mod:`shardcat.readers.batch`)
        self._hot_at_kind = self._one_range and not self._parts and native
        self._hot: hot.HotLookups | None = None
        self._hot_at: hot.HotLookups | None = None
        self._read_from(None)
        self._files_only = False  # every shard a plain local file (set with the shards)
        self.refresh()

    # Pickling (DataLoader with the spawn start method): the handle reopens the store.
    def __getstate__(self) -> dict[str, Any]:
        return {
            "catalog": self.catalog,
            "dataset": self.dataset,
            "verify": self.verify_reads,
            "pool": self._pool.size,
            "reindex": self._reindex,
            "files": getattr(self, "files", None),
            "names_as_given": self.names_as_given,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        DatasetView.__init__(
            self,
            state["catalog"],
            state["dataset"],
            verify=state["verify"],
            file_pool_size=state["pool"],
            reindex=state["reindex"],
        )
        if state["files"] is not None:
            self.files = state["files"]
        self.names_as_given = state.get("names_as_given")

    # -- snapshots, shards and files ---------------------------------------------

    @one_call
    def _exclusively(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` as one public call (see :func:`one_call`)."""
        return function(*args)

    def _keys_of(self, shard_id: int) -> list[str]:
        keys = lookup.keys_of_shard(self._conn(), self._sql, shard_id)
        return [k for k in keys if k not in self._deleted] if self._deleted else keys

    def _new_lock(self) -> None:
        self._lock = threading.RLock()
        self._lock_generation = _engine._fork_generation

    @one_call
    def refresh(self) -> None:
        """Follow the catalog to its latest version of the dataset, positions included
        (after a re-ingest moved them; see the module docstring)."""
        self._serial, self._version, self._pinned = -1, None, None
        self._positions_moved = False
        self.catalog.reader_connection()  # end any read snapshot: see the latest commit
        self._conn()
        self._pinned = self._layout()

    def _conn(self) -> ReadConnection:
        """The read snapshot for one call, with this reader's shard list matching it.

        Every public call takes it once and runs all its queries on it.
        """
        if self._pool.generation != _pool._generation:  # (inlined: every call)
            self._pool.for_this_process()  # a forked child never reads its parent's sources
        conn, serial = self.catalog.read_snapshot()
        if serial != self._serial:
            self._serial = serial
            version = lookup.dataset_version(conn, self._id)
            if version is None:
                raise CatalogError(f"dataset {self.dataset!r} was dropped from {self.catalog.path}")
            if version != self._version:
                self._load_shards(conn, version)
        return conn

    @property
    def verify_crc(self) -> bool:
        """Whether reads are checked (the older name of ``verify``)."""
        return self.verify_reads

    def _moved_on(self) -> bool:
        """Whether the catalog now holds a newer version of the dataset than the
        snapshot the current call read (see :func:`follows_reindex`)."""
        before = self._version
        self.catalog.reader_connection()  # end the snapshot
        self._conn()
        return self._version != before

    def _read_from(self, donor: int | None) -> None:
        """The statements over the records the dataset reads: its own, or ``donor``'s
        by reference (see :mod:`~shardcat.catalog.shares`; a copy of its own may
        replace them: the version moves, and :meth:`_load_shards` comes here again)."""
        self._donor = donor
        batch = self.catalog.backend.dialect.batch_items
        self._sql = lookup.statements(self._id, self._one_range, self._parts, batch, donor)
        self._at = self._sql.offset  # where a record row's location starts
        for held in (self._hot, self._hot_at):
            if held is not None:
                held.clear()
        self._hot = hot.HotLookups(self._sql.one) if self._hot_kind else None
        self._hot_at = hot.HotLookups(self._sql.one_at) if self._hot_at_kind else None

    def _load_shards(self, conn: ReadConnection, version: int) -> None:
        directory = self.catalog.directory
        rows = lookup.shards(conn, self._id)
        donor = rows[0][11] if rows else None  # (all its shards, or none: see _read_from)
        if donor != self._donor:
            self._read_from(donor)
        shards = {
            r[0]: _Shard(
                r[0], absolute_path(r[1], directory), r[2], r[3], r[4], r[5], Identity(*r[6:11])
            )
            for r in rows
        }
        self._pool.keep(
            {i: s.generation for i, s in shards.items()},
            {i: s.generation for i, s in self._shards.items()},
        )
        self._shards = shards
        self._order = list(shards.values())
        self._starts = [s.first for s in self._order]
        self._load_deleted(conn)
        self._len = sum(s.count for s in self._order) - len(self._dead)
        #: what the native batch read maps positions with (:data:`hot.read_batch`)
        self._layout_buffers = (
            array("q", self._starts),
            array("q", [s.id for s in self._order]),
            self._len,
            array("q", self._skip),
        )
        self._files_only = not any(s.compression or "://" in s.path for s in self._order)
        self._version = version
        if self._pinned is not None and self._layout() != self._pinned:
            self._positions_moved = True

    def _load_deleted(self, conn: ReadConnection) -> None:
        """The dataset's soft-deleted records (:mod:`shardcat.catalog.deletes`): their
        keys, and their stored positions in order (``_dead``). Positions skip them:
        position ``p`` is stored position ``p + bisect_right(_skip, p)``, where
        ``_skip[i]`` is ``_dead[i] - i`` (the live records before the i-th dead one).
        One query returning nothing for a dataset without deletes."""
        records = lookup.records_source(self._id, self._donor)
        rows = conn.execute(DELETED_AT.format(records=records), (self._id,)).fetchall()
        self._deleted = frozenset(str(r[2]) for r in rows)
        self._dead = sorted(self._shards[r[0]].first + r[1] for r in rows if r[0] in self._shards)
        self._skip = [d - i for i, d in enumerate(self._dead)]
        self._plain = self._plain_kind and not self._deleted

    def _layout(self) -> tuple[tuple[int, ...], ...]:
        """What positions depend on: each shard's version and place, the deleted ones."""
        shards = tuple((s.id, s.generation, s.first, s.count) for s in self._order)
        return (*shards, tuple(self._dead))

    def _source(self, shard_id: int) -> Source:
        source = self._pool.sources.get(shard_id)
        if source is None:
            shard = self._shards[shard_id]
            source = self._pool.add(
                shard_id,
                open_source(
                    shard.path,
                    shard.identity,
                    shard.compression,
                    lambda: self._seek_index(shard),
                    self.options.get(STORAGE_OPTIONS),
                ),
            )
        return source

    def _seek_index(self, shard: _Shard) -> bytes | None:
        """The stored seek points of a compressed shard's version (None: none stored)."""
        conn = self.catalog.reader_connection(snapshot=True)
        return lookup.seek_index(conn, shard.id, shard.generation)

    def _native(self, key: Any, feature: str | None) -> Any:
        """The native read by key (:mod:`shardcat.readers.hot`): ``AGAIN`` (left to the
        Python path), None (no such key), the payload or ``feature``'s first value.

        One call alone as :func:`one_call` makes it, without its wrapper (a third of
        the call's Python time): whatever is not the common case (a new process, an
        error of any kind) is ``AGAIN``, and the Python path, wrapped, does it again
        and raises what it raises."""
        if self._lock_generation != _engine._fork_generation:
            return AGAIN  # (the wrapped path takes a new lock)
        with self._lock:
            try:
                conn = self._conn()  # (first: it may change the statements, see _read_from)
            except Exception:
                return AGAIN
            lookup = self._hot.lookup(conn) if self._hot is not None else None
            if lookup is None or not self._files_only:
                return AGAIN
            key = key if type(key) is str else str(key)
            if key in self._deleted:  # (an empty set unless the dataset has soft deletes)
                return None
            got = hot.read(lookup, key, self._pool.sources, feature, self.verify_reads)
        return None if got is MISS else got

    def _read_natively(self, ordered: list[lookup.Row], names: Sequence[Any] | None) -> Any:
        """The payloads of a batch's rows (one range each, in file order; ``names``: as
        ``Reader._load``) read and checked in one native call, each shard's file
        checked once after; ``AGAIN`` where that does not apply or is not sure."""
        if not (self._native_rows and self._files_only):
            return AGAIN
        shards = {row[1] for row in ordered}
        for shard_id in shards:
            self._source(shard_id)
        keyed = not self._by_position
        got = hot.read_rows(
            ordered, self._at, self._pool.sources, FileSource, self.verify_reads, keyed, names
        )
        if got is not AGAIN:
            for shard_id in shards:  # one file check per shard covers its reads
                self._pool.sources[shard_id].check()
        return got

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
        if self._skip:  # soft-deleted records leave the position space
            position += bisect.bisect_right(self._skip, position)
        shard = self._order[bisect.bisect_right(self._starts, position) - 1]
        return shard, position - shard.first

    def shard_starts(self) -> list[int]:
        """The first position of each shard, in position order (a shard's records are
        positions ``starts[i]`` up to ``starts[i + 1]``): what shard-local samplers use."""
        return [s.first - bisect.bisect_left(self._dead, s.first) for s in self._order]

    def shard_bytes(self) -> list[int]:
        """The size of each shard file as indexed (compressed shards: the compressed
        file's), in position order: what a planner estimates a read's bytes from."""
        return [s.identity.size for s in self._order]

    def _row_at(self, conn: ReadConnection, position: int) -> lookup.Row:
        """The record row (key last) at one position: one point query."""
        shard, ordinal = self._shard_at(position)
        row: lookup.Row | None = conn.execute(self._sql.at, (shard.id, ordinal)).fetchone()
        if row is None:
            raise self._broken()
        return row

    def _broken(self) -> StaleShardError:
        """A position the shard list has but the snapshot's records lack: cannot happen
        within one snapshot, so the catalog changed under it (a broken catalog)."""
        return StaleShardError(
            f"dataset {self.dataset!r} changed since this reader opened: reopen it"
        )

    def _prefetch(self, ranges: Sequence[tuple[int, int, int]]) -> list[Source]:
        """Hand the sources that fetch ahead (remote shards: see
        :mod:`shardcat.sources.remote`) the ``(shard, offset, length)`` ranges a batch
        is about to read, widened by a frame's header/footer; local sources have no
        ``prefetch`` and are left alone. Returns the sources that took them (their
        ``check()`` ends the batch); their reads check each record's frame (TFRecord
        length and CRCs, the tar header before a member), which the prefetched bytes
        hold: bytes a server moved under a true Content-Range are an error."""
        by_shard: dict[int, list[tuple[int, int]]] = {}
        for shard_id, offset, length in ranges:
            by_shard.setdefault(shard_id, []).append(
                (offset - _PREFETCH_BEFORE, length + _PREFETCH_BEFORE + _PREFETCH_AFTER)
            )
        took = []
        for shard_id, spans in by_shard.items():
            source = self._source(shard_id)
            prefetch = getattr(source, "prefetch", None)
            if prefetch is not None:
                prefetch(spans)
                took.append(source)
        return took
