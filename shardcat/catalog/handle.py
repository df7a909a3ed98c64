"""The read-only handle a reader holds on the store: :class:`ReadHandle`.

A reader (:mod:`shardcat.readers`) needs little of the catalog: its dataset's
row, the read connection its lookups run on (one read snapshot per call), a
SQL query for ``where``, and how to name a damaged catalog. The handle offers
that and nothing that writes, so no reader can ingest, drop or change the
catalog it reads. It pickles as the catalog's location and mode: unpickled
(a DataLoader worker started with ``spawn``), it opens a store of its own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shardcat.catalog.backend import Backend
from shardcat.catalog.datasets import DatasetRow
from shardcat.catalog.lookup import ReadConnection
from shardcat.catalog.query import (
    DEFAULT_QUERY_MEMORY,
    DEFAULT_QUERY_TIMEOUT,
    QueryResult,
    collect,
)
from shardcat.catalog.store import Store
from shardcat.errors import CatalogError

__all__ = ["ReadHandle"]


class ReadHandle:
    """What a reader may do with a :class:`~shardcat.catalog.store.Store`: read.

    ``owned``: the handle opened its store (:meth:`open`) and :meth:`close` closes
    it; a handle on a store someone else opened (a :class:`shardcat.Catalog`'s)
    leaves it open.
    """

    def __init__(self, store: Store, *, owned: bool = False) -> None:
        self._store = store
        self.owned = owned

    @classmethod
    def open(
        cls, location: str | os.PathLike[str], *, readonly: bool = False, immutable: bool = False
    ) -> ReadHandle:
        """A handle on a store of its own, opened at ``location``."""
        return cls(Store(location, readonly=readonly, immutable=immutable), owned=True)

    # -- what the catalog is -------------------------------------------------------

    @property
    def path(self) -> Path | str:
        """The catalog's name in messages (a file's path, a URL without its password)."""
        return self._store.path

    @property
    def location(self) -> str:
        """What reopens the catalog (a file's path, a server's whole URL)."""
        return self._store.location

    @property
    def directory(self) -> str:
        """Where relative shard paths start (see :attr:`Store.directory`)."""
        return self._store.directory

    @property
    def backend(self) -> Backend:
        """What differs between a SQLite file and a PostgreSQL server (the readers'
        statements ask it)."""
        return self._store.backend

    @property
    def readonly(self) -> bool:
        return self._store.readonly

    @property
    def immutable(self) -> bool:
        return self._store.immutable

    @property
    def closed(self) -> bool:
        return self._store.closed

    # -- reads ---------------------------------------------------------------------

    def reader_connection(self, *, snapshot: bool = False) -> ReadConnection:
        """This thread's read-only connection (see :meth:`Store.reader_connection`)."""
        return self._store.reader_connection(snapshot=snapshot)

    def read_snapshot(self) -> tuple[ReadConnection, int]:
        """This thread's connection in a read snapshot and the snapshot's number."""
        return self._store.read_snapshot()

    def dataset_row(self, name: str) -> DatasetRow:
        """The dataset's row; :class:`CatalogError` naming the known ones when missing."""
        return self._store.dataset_row(name)

    def query(
        self,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        timeout: float | None = DEFAULT_QUERY_TIMEOUT,
        memory: int | None = DEFAULT_QUERY_MEMORY,
    ) -> QueryResult:
        """One read-only SQL statement, with the limits of
        :meth:`shardcat.Catalog.query` (``reader.where``)."""
        with self._store.query_rows(sql, params, timeout=timeout, memory=memory) as (cols, rows):
            return QueryResult(collect(rows, memory), cols)

    def damaged(self, exc: BaseException) -> CatalogError:
        """The error for a database failure reading the catalog."""
        return self._store.damaged(exc)

    def damage(self) -> list[str]:
        """What SQLite's ``quick_check`` finds damaged (see :meth:`Store.damage`)."""
        return self._store.damage()

    def close(self) -> None:
        """Close the store when this handle opened it (idempotent)."""
        if self.owned:
            self._store.close()

    def __reduce__(self) -> tuple[Any, ...]:
        store = self._store
        return (_reopen, (store.location, store.readonly, store.immutable))

    def __repr__(self) -> str:
        return f"ReadHandle({str(self.path)!r})"


def _reopen(location: str, readonly: bool, immutable: bool) -> ReadHandle:
    return ReadHandle.open(location, readonly=readonly, immutable=immutable)
