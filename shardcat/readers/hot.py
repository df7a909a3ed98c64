"""The native reads of TFRecord datasets (``shardcat.readers._hot``).

For a dataset keyed by a feature on a SQLite catalog, ``get_record``/
``get_feature``/``reader[key]`` look the key up, ``pread`` the payload, check the file and the
record (CRC32C of payload and key against the catalog's), and for
``get_feature`` take the feature's first value off the Example's wire, in one
call to C.

The lookup is a statement prepared once on the calling thread's own catalog
connection (the SQLite library Python's ``sqlite3`` module loaded), so it reads
the same snapshot as the rest of the call. The extension settles only the common,
correct case; anything else (a shard not opened yet, a changed file, a failed
check, an unusual Example, any SQLite error) comes back as ``AGAIN`` and the
reader does the whole read in Python, whose errors are the reference.

:data:`read_batch` does a whole batch (``get_many``, ``get_many_at``,
``get_dicts``, ``RecordDataset`` batches) in one call: each key or position looked
up through a statement prepared the same way, the payloads read in file order and
checked, the items (``to_dict`` of each Example, or of some of its features) built
straight off the wire (:mod:`shardcat.readers.batch`). Where the lookup cannot run
natively (a PostgreSQL catalog, a batch naming a soft-deleted key), :data:`read_rows`
reads and checks rows found in Python, and :data:`example_dict` builds an item from a
payload.

Measured and kept (``benchmarks/hotpath.py``; see ``benchmarks/HISTORY.md``);
``SHARDCAT_NATIVE=0`` turns it off (the pure-Python path is the tested fallback).
"""

from __future__ import annotations

import importlib
import os
import sqlite3
import sys
from types import ModuleType
from typing import Any

from shardcat.catalog.connections import before_close
from shardcat.sources.local import FileSource

__all__ = [
    "AGAIN",
    "MISS",
    "HotLookups",
    "available",
    "example_dict",
    "read",
    "read_batch",
    "read_rows",
]

_hot: ModuleType | None
try:
    _hot = importlib.import_module("shardcat.readers._hot")
except ImportError:  # no compiler at install time
    _hot = None

#: what the native read returns for a read it leaves to Python / for a missing key
AGAIN: object = getattr(_hot, "AGAIN", object())
MISS: object = getattr(_hot, "MISS", object())
#: read(lookup, key, sources, feature, verify): ``AGAIN``, ``MISS``, the payload
#: (``feature`` None) or the feature's first value (None: missing or empty)
read: Any = getattr(_hot, "get", None)
#: read_rows(rows, at, sources, file_type, verify, keyed, names): a batch's checked
#: TFRecord payloads in batch order, or ``AGAIN`` (see ``DatasetView._read_natively``)
read_rows: Any = getattr(_hot, "read_rows", None)
#: read_batch(lookup, items, layout, sources, verify, keyed, dicts, select): a batch
#: of keys or positions looked up, read and checked, as payloads or dicts; ``AGAIN``;
#: or ``(shard ids,)`` whose sources to open first (see ``readers/hot_batch.h``)
read_batch: Any = getattr(_hot, "read_batch", None)
#: example_dict(payload, select=None): ``Reader.to_dict`` of the Example (of the
#: features in the tuple ``select`` only), straight off the wire, or ``AGAIN`` (an
#: odd or malformed wire: decode it)
example_dict: Any = getattr(_hot, "example_dict", None)

# the sqlite3.Connection layout the extension reads (its sqlite3 * after the object head)
_KNOWN_PYTHONS = ((3, 8), (3, 13))


def available() -> bool:
    """Whether single reads by key go native: built, the same SQLite library as
    Python's ``sqlite3``, a known CPython, and not turned off (``SHARDCAT_NATIVE=0``)."""
    return (
        _hot is not None
        and os.environ.get("SHARDCAT_NATIVE", "1") != "0"
        and sys.implementation.name == "cpython"
        and _KNOWN_PYTHONS[0] <= sys.version_info[:2] <= _KNOWN_PYTHONS[1]
        and _hot.sqlite_version
        == sqlite3.sqlite_version_info[0] * 1_000_000
        + sqlite3.sqlite_version_info[1] * 1000
        + sqlite3.sqlite_version_info[2]
    )


class HotLookups:
    """One reader's prepared lookups, one per catalog connection it was called on
    (a connection is one thread's, in one process: a forked child's connections are
    new objects, so it never uses its parent's statements). Used under the reader's
    lock, on catalogs whose dialect has ``native_lookups``."""

    _KEEP = 8  # connections remembered (threads come and go)

    def __init__(self, sql: str) -> None:
        self.sql = sql
        self._by_conn: dict[Any, Any] = {}
        before_close(self)  # a statement must not outlive its connection's close

    def lookup(self, conn: Any) -> Any:
        """The lookup prepared on ``conn`` for :func:`read`; None: ``conn`` is not a
        ``sqlite3`` connection the extension can use (the Python path reads)."""
        found = self._by_conn.get(conn)
        return found if found is not None else self._prepare(conn)

    def _prepare(self, conn: Any) -> Any:
        if _hot is None:
            return None
        try:
            files = conn.execute("PRAGMA database_list").fetchall()
            filename = next((r[2] for r in files if r[1] == "main"), "")
            lookup = _hot.Lookup(conn, self.sql, FileSource, filename)
        except (ValueError, sqlite3.Error):  # closed, not sqlite3's, or does not prepare
            return None
        if len(self._by_conn) >= self._KEEP:
            self._by_conn.clear()
        self._by_conn[conn] = lookup
        return lookup

    def forget(self, conn: Any) -> None:
        """Finalize the statement prepared on ``conn`` (which is about to close)."""
        self._by_conn.pop(conn, None)

    def clear(self) -> None:
        """Finalize every statement (before their connections close: a statement
        left on a connection keeps its database open, and its ``-wal``/``-shm``
        files in place, after ``close``)."""
        self._by_conn.clear()
