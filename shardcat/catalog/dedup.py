"""Dedup's SQL (``Catalog.dedup``, :mod:`shardcat.facade.dedup`): a dataset's live
records with their stored checks, streamed a page at a time
(:func:`live_records`), and :class:`Candidates`, where records are grouped by
content signature in SQL, on disk, and streamed back one group at a
time, so no step holds every record in memory.

The candidates live in a private temporary SQLite database (``sqlite3.connect("")``:
a file SQLite removes when it is closed), whatever database the catalog is on: a
read-only or immutable catalog, or a PostgreSQL one, is grouped the same way and
never written.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from shardcat.catalog import lookup
from shardcat.catalog.lookup import ReadConnection

__all__ = ["PAGE", "Candidates", "Page", "live_records"]

#: records fetched per query
PAGE = 10_000

_RECORDS = (
    "SELECT ordinal, key, crc FROM {table} r WHERE shard_id = ? AND ordinal >= ? "
    "AND NOT EXISTS (SELECT 1 FROM shardcat_deleted x WHERE x.dataset_id = ? AND x.key = r.key) "
    "ORDER BY ordinal LIMIT ?"
)
_MEMBERS = (
    "SELECT ordinal, name, crc FROM {members} m "
    "WHERE shard_id = ? AND ordinal >= ? AND ordinal <= ?"
)

#: a page of :func:`live_records`: ``(place, key, crc)`` or ``(place, key, members)``
Page = list[tuple[int, str, Any]]


def live_records(
    conn: Callable[[], ReadConnection], dataset_id: int, parts: bool
) -> Iterator[Page]:
    """Pages of the dataset's records that are not soft-deleted, in position order:
    ``(place, key, crc)`` (``place``: the position counting deleted records; ``key``
    as stored, a placeholder for datasets keyed by position; ``crc`` the stored
    check or None), or for formats whose records have parts ``(place, key,
    members)``, each member ``(name, crc)``. ``conn()`` gives the read connection
    for each query (the store's ``reader_connection``)."""
    donor = lookup.records_table_of(conn(), dataset_id)  # (rows read by reference)
    sql = _RECORDS.format(table=lookup.records_source(dataset_id, donor, by_shard=True))
    members_sql = _MEMBERS.format(members=lookup.members_source(dataset_id, donor))
    for shard in lookup.shards(conn(), dataset_id):
        shard_id, first = shard[0], shard[2]
        start = 0
        while True:
            rows = conn().execute(sql, (shard_id, start, dataset_id, PAGE)).fetchall()
            if not rows:
                break
            if parts:
                members = _members(conn(), members_sql, shard_id, rows[0][0], rows[-1][0])
                yield [(first + o, key, members.get(o, [])) for o, key, _ in rows]
            else:
                yield [(first + o, key, crc) for o, key, crc in rows]
            if len(rows) < PAGE:
                break
            start = rows[-1][0] + 1


def _members(
    conn: ReadConnection, sql: str, shard_id: int, first: int, last: int
) -> dict[int, list[tuple[str, Any]]]:
    found: dict[int, list[tuple[str, Any]]] = {}
    for ordinal, name, crc in conn.execute(sql, (shard_id, first, last)).fetchall():
        found.setdefault(ordinal, []).append((name, crc))
    return found


class Candidates:
    """Records by content signature: :meth:`add` ``(signature, dataset, place, key)``
    rows, then :meth:`groups` streams those sharing their signature with another
    (``dataset`` the index of the dataset as named, ``place`` its position counting
    deleted records), each group ordered by dataset then place."""

    def __init__(self) -> None:
        self._db = sqlite3.connect("")  # a temporary file, removed on close
        self._db.execute("PRAGMA journal_mode = OFF")
        self._db.execute("PRAGMA synchronous = OFF")
        self._db.execute(
            "CREATE TABLE c (sig INTEGER NOT NULL, ds INTEGER NOT NULL, "
            "place INTEGER NOT NULL, key TEXT NOT NULL)"
        )
        self._indexed = False

    def add(self, rows: Iterable[tuple[int, int, int, str]]) -> None:
        with self._db:
            self._db.executemany("INSERT INTO c VALUES (?, ?, ?, ?)", rows)

    def _index(self) -> None:
        if not self._indexed:
            self._db.execute("CREATE INDEX c_sig ON c (sig, ds, place)")
            self._indexed = True

    def count(self) -> int:
        """How many records share their signature with another."""
        self._index()
        sql = "SELECT sum(n) FROM (SELECT count(*) AS n FROM c GROUP BY sig HAVING n > 1)"
        return int(self._db.execute(sql).fetchone()[0] or 0)

    def groups(self) -> Iterator[list[tuple[int, int, str]]]:
        """``[(dataset, place, key), ...]`` per group of two or more."""
        self._index()
        rows = self._db.execute(
            "SELECT c.sig, c.ds, c.place, c.key FROM c JOIN "
            "(SELECT sig FROM c GROUP BY sig HAVING count(*) > 1) g "
            "ON c.sig = g.sig ORDER BY c.sig, c.ds, c.place"
        )
        current: int | None = None
        group: list[tuple[int, int, str]] = []
        for sig, ds, place, key in rows:
            if sig != current and group:
                yield group
                group = []
            current = sig
            group.append((ds, place, key))
        if group:
            yield group

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Candidates:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
