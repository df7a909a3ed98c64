"""The store's read-only connections, one per thread of this process, and the check
that an immutable catalog's file is still the one opened (:class:`FileWatch`).

Any number of threads may share one :class:`~shardcat.catalog.store.Store`
(and the readers on it): each thread reads on its own connection, so a read
snapshot (a transaction) is never begun, ended or used by another thread.
Connections are keyed by process too: after ``fork`` the child opens its own
and never uses nor closes its parent's. Connections are keyed by the thread
object, not its id: the OS hands an ended thread's id to a new thread, which must
not inherit the ended thread's read snapshot. A thread that has ended leaves its
connection behind until the next thread opens one (it is closed then) or the
store closes.

Measured on the single read by key (one thread, page cache warm, a TFRecord
``get_record`` of about 6 µs on the shared 2-core test machine): finding this
thread's connection is ``threading.current_thread()`` and one dict lookup, about 0.1 µs; the
reader's lock around each call (:func:`~shardcat.readers.view.one_call`) about
0.3 µs (4 threads sharing one reader: about 1.3x the records/s of one thread).
A lock alone (one connection for every thread) could not cover the store's
other users: any caller of :meth:`Store.reader_connection` runs several
statements on it, and a query installs an authorizer on it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardcat.catalog import engine as _engine
from shardcat.errors import CatalogError

__all__ = ["FileWatch", "ThreadConnections", "next_serial"]

# Read snapshots are numbered across every thread and store of the process, so a
# reader can tell that the snapshot it sees now is not the one it loaded shards in.
_serials = itertools.count(1)


def next_serial() -> int:
    return next(_serials)


_forgetting: weakref.WeakSet[Any] = weakref.WeakSet()


def before_close(holder: Any) -> None:
    """Have ``holder.forget(conn)`` called before any read connection of this process
    closes (``holder`` held weakly): what holds statements prepared on a connection
    finalizes them then, or the database would stay open after ``close`` (SQLite
    keeps a connection with live statements, and its ``-wal``/``-shm``)."""
    _forgetting.add(holder)


def _close(conn: Any) -> None:
    for holder in list(_forgetting):
        holder.forget(conn)
    conn.close()


class Slot:
    """One thread's connection and its read snapshot: ``since`` (monotonic time it
    began) and ``serial`` (its number, 0: none begun yet)."""

    __slots__ = ("conn", "serial", "since")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.serial = 0
        self.since = 0.0


class ThreadConnections:
    """Read-only connections by thread, for this process (see the module docstring);
    ``opener`` (a method of the owner, held weakly: no cycle keeps an unclosed
    store alive) opens one."""

    def __init__(self, opener: Callable[[], Any]) -> None:
        self._opener = weakref.WeakMethod(opener)  # type: ignore[arg-type]
        self._slots: dict[threading.Thread, Slot] = {}
        self._generation = _engine._fork_generation
        self._lock = threading.Lock()

    def slot(self) -> Slot:
        """This thread's connection (opened on first use, and again after ``fork``)."""
        if self._generation != _engine._fork_generation:
            # the parent's connections: never used nor closed here
            self._slots, self._generation = {}, _engine._fork_generation
        found = self._slots.get(threading.current_thread())
        return self._open() if found is None else found

    def _open(self) -> Slot:
        opener = self._opener()
        if opener is None:
            raise CatalogError("the catalog of these connections is gone")
        conn = opener()
        with self._lock:
            for ended in [t for t in self._slots if not t.is_alive()]:
                _close(self._slots.pop(ended).conn)
            slot = self._slots[threading.current_thread()] = Slot(conn)
        return slot

    def opened(self) -> bool:
        """Whether any thread of this process has a connection open."""
        return self._generation == _engine._fork_generation and bool(self._slots)

    def close(self) -> None:
        """Close every thread's connection of this process (a forked child's inherited
        ones stay untouched)."""
        with self._lock:
            slots, self._slots = self._slots, {}
        if self._generation == _engine._fork_generation:
            for slot in slots.values():
                _close(slot.conn)


class FileWatch:
    """An immutable catalog's file, checked to be the file it was when opened.

    SQLite trusts an immutable file never to change, so it could return rows of
    another catalog, or of no consistent one: reads refuse to go on once it was
    replaced or rewritten in place (another device, inode, size, mtime or ctime).
    :meth:`unchanged` is one ``stat`` per read snapshot (at most every
    ``SNAPSHOT_SECONDS``), per other call and per new connection; within a
    snapshot, :meth:`not_rewritten` on every lookup.
    """

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.name = name
        # (device, inode, size, mtime, ctime) of the file when first checked
        self._identity: tuple[int, ...] | None = None
        self._fd: int | None = None  # that file, held open to fstat it cheaply

    def unchanged(self) -> None:
        now = _engine.file_identity(self.path)
        if self._identity is None and now is not None:
            self._identity = now
            with contextlib.suppress(OSError):
                self._fd = os.open(self.path, os.O_RDONLY)
        elif now != self._identity:
            raise self._changed("it is gone" if now is None else "replaced or rewritten")

    def not_rewritten(self) -> None:
        """The file SQLite reads, rewritten in place (size, mtime, ctime) since it was
        opened: one ``fstat`` (a fraction of a microsecond). (A file replaced by
        another is harmless until the next snapshot: SQLite keeps reading the old one.)"""
        if self._fd is None or self._identity is None:
            return
        st = os.fstat(self._fd)
        if (st.st_size, st.st_mtime_ns, st.st_ctime_ns) != self._identity[2:]:
            raise self._changed("rewritten in place")

    def _changed(self, how: str) -> CatalogError:
        return CatalogError(
            f"immutable catalog {self.name} changed since it was opened ({how}): "
            "reopen it (Catalog(path, immutable=True)) to read the new file"
        )

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # (a forked child's copy: its own to close)
            self._fd = None
