"""``Reader.verify`` (``catalog verify``): every record of a dataset re-read, its
framing and checksums checked and its bytes compared with the catalog's check of
it (whatever the reader's ``verify``), one error per bad record naming shard,
byte offset and key. Soft-deleted records are not re-read (they are no records
of the dataset until restored).

A shard whose file is not the indexed version is one error at byte 0. Records
of a remote shard are fetched ahead in merged requests, ``_BATCH`` at a time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from shardcat.catalog import lookup
from shardcat.catalog.handle import ReadHandle
from shardcat.errors import CorruptRecordError, ShardcatError, StaleShardError, masked
from shardcat.formats.base import Location
from shardcat.readers.view import _Shard
from shardcat.sources.rawio import Source

__all__ = ["extents_of", "verify_records"]

# records of a remote shard that verify fetches ahead at a time
_BATCH = 4096


class Reader(Protocol):
    """What of a :class:`~shardcat.readers.reader.Reader` verifying uses."""

    catalog: ReadHandle
    _order: list[_Shard]
    _deleted: frozenset[str]
    _sql: lookup.RecordStatements
    _parts: bool

    def __len__(self) -> int: ...

    def _conn(self) -> lookup.ReadConnection: ...

    def _source(self, shard_id: int) -> Source: ...

    def _read(
        self, shard_id: int, location: Location, crc: int | None, key: Any, frame: bool = False
    ) -> bytes: ...

    def _prefetch(self, ranges: Sequence[tuple[int, int, int]]) -> list[Source]: ...


def _whole_shard(path: str, exc: ShardcatError) -> CorruptRecordError:
    """The problem of a shard that cannot be checked at all (byte 0), its error's
    text without the shard's name again (``x.tar: at byte 0: changed ...``, not
    ``x.tar: at byte 0: x.tar changed ...``)."""
    text, shown = str(exc), masked(path)
    if text.startswith(shown):
        text = text[len(shown) :].lstrip(": ")
    return CorruptRecordError(path, 0, text)


def _shard(reader: Reader, rows: list[lookup.Row], shard: _Shard) -> list[CorruptRecordError]:
    """The problems of one shard's ``rows`` (``(offset, length, extents, item, crc,
    key)``, of members for formats whose records have parts)."""
    problems: list[CorruptRecordError] = []
    ahead: list[Source] = []
    for n, (offset, length, extents, item, crc, key) in enumerate(rows):
        if n % _BATCH == 0:  # a remote shard: read ahead in merged requests
            for source in ahead:
                source.check()
            ahead = reader._prefetch([(shard.id, r[0], r[1]) for r in rows[n : n + _BATCH]])
        parts = extents_of(extents)
        try:
            reader._read(shard.id, Location(offset, length, parts, item), crc, key, frame=True)
        except CorruptRecordError as exc:
            if exc.key is None and key is not None:
                exc.key = str(key)
            problems.append(exc)
        except StaleShardError as exc:  # the file is not the indexed version
            problems.append(_whole_shard(shard.path, exc))
            break
    for source in ahead:  # ends the last batch
        source.check()
    return problems


def extents_of(text: str | None) -> tuple[tuple[int, int], ...] | None:
    """A stored location's extents (JSON ``[[offset, length], ...]``)."""
    return None if text is None else tuple((int(a), int(b)) for a, b in json.loads(text))


def verify_records(
    reader: Reader, progress: Callable[[int, int], None] | None = None
) -> list[CorruptRecordError]:
    """Every problem of the reader's dataset (see the module docstring);
    ``progress(done, total)`` after each shard."""
    problems: list[CorruptRecordError] = []
    reader.catalog.reader_connection()  # see the latest commit
    conn = reader._conn()
    done = 0
    for shard in list(reader._order):
        try:
            reader._source(shard.id)
        except ShardcatError as exc:  # stale, missing or unreadable file
            problems.append(_whole_shard(shard.path, exc))
        else:
            rows = lookup.records_of_shard(conn, reader._sql, shard.id, reader._parts)
            if reader._deleted:
                rows = [r for r in rows if r[5] not in reader._deleted]
            problems.extend(_shard(reader, rows, shard))
        done = min(done + shard.count, len(reader))  # (a shard's count has its deleted)
        if progress is not None:
            progress(done, len(reader))
    if progress is not None:
        progress(done, len(reader))
    return problems
