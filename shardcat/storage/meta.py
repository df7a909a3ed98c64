"""The SQLite metadata of a TensorBlob or TensorDB directory (no torch needed here).

A storage directory holds fixed-size block files (raw memory-mapped rows) and
one SQLite file, ``.shardcat.sqlite``, that says what they mean:

- ``storage_meta``: ``schema_version``, ``kind`` (``blob``/``db``),
  ``block_size``, ``created_at`` and, for converted directories,
  ``imported_from``.
- ``storage_fields``: one row per field (a TensorBlob has one, ``data``):
  dtype, shape (JSON), the sub-directory of its block files and whether its
  values are mirrored into SQL (``sql``: NULL, ``filter`` or ``index``).
- ``storage_state``: one row: the committed ``length`` (row count) and a
  ``version`` bumped by every commit (a second writer is detected, not
  silently interleaved).
- ``storage_blocks``: ``(field, idx) -> file``; block ``idx`` of a field holds
  rows ``idx * block_size ...``. There are always exactly
  ``ceil(length / block_size)`` blocks per field.
- ``storage_pending``: block files that may exist on disk without being
  referenced: reserved before a writer creates them (new blocks, and copies
  of committed blocks it is about to overwrite), or dropped by a commit and
  not yet deleted. A writable open deletes them (holding the writer lock, all
  of them; without ``flock``, those whose owner process is gone: exited, a
  zombie, its pid reused, or on another host; ``owner`` is
  ``host:pid:start-time``, :mod:`shardcat.catalog.processes`).
- ``rows`` (TensorDB only): ``position INTEGER PRIMARY KEY`` (so ``rowid`` is
  the row position), an optional unique ``key`` and one column per
  filterable field, so ``ATTACH``-ing the file lets SQL join rows with a
  catalog dataset. Keys are unique through the partial index ``rows_key``
  (``WHERE key IS NOT NULL``: rows without a key cost it nothing; SQLite
  uses it for ``key = ?``, ``key IN (...)`` and joins on ``key``). Files
  written before it have ``key TEXT UNIQUE`` instead (an index entry per
  row, NULLs included); both layouts are read and written alike.

Writers commit as tensorblob saves its ``.stat``: at ``flush``, ``close``,
``truncate`` and ``extend``. One transaction then commits the length, the
block lists of all fields and the ``rows`` mirror. Between commits, rows go
where no commit looks: past the committed length, into new blocks, or into
copies of the committed blocks whose rows they overwrite. A process killed at
any point leaves the rows of its last commit, all fields aligned.

One writer at a time: a writable open takes an exclusive ``flock`` on the
directory, held until it closes (:mod:`shardcat.storage.lock`; commits also
check ``version``, for filesystems without ``flock``). Converting a
tensorblob directory's JSON metadata into this file is
:mod:`shardcat.storage.convert`; a read-only open of such a directory builds
the same tables in memory instead (:meth:`Metadata.in_memory`).

The plain ``sqlite3`` module is used rather than SQLAlchemy Core (which owns
the catalog's schema): this file is SQLite-only by nature (it sits beside
local memory-mapped files, never on a server database), its schema is small
and fixed, and ``write(..., keys=...)`` looks its keys up on the hot path,
where one Core ``execute`` would cost more than the lookup itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from shardcat.catalog.engine import configure_writer, connect_readonly, fork_generation
from shardcat.catalog.processes import alive, owner_id
from shardcat.errors import SchemaVersionError, StaleWriterError, StorageValueError
from shardcat.storage import lock

__all__ = [
    "CREATE_KEY_INDEX",
    "KEY_INDEX",
    "META_FILE",
    "SCHEMA_VERSION",
    "FieldSpec",
    "Layout",
    "Metadata",
    "create_index",
    "index_name",
    "probe",
    "quote",
    "sql_file",
    "sql_type",
]

META_FILE = ".shardcat.sqlite"  # the metadata file in a storage directory
SCHEMA_VERSION = 1
KINDS = {"blob": "TensorBlob", "db": "TensorDB"}
BLOB_FIELD = "data"  # the one field of a TensorBlob
_BLOCK_NAME = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def sql_file(path: str | os.PathLike[str]) -> Path:
    """The SQLite file to open for ``path``: a storage directory's metadata file, else ``path``.

    A TensorBlob/TensorDB directory (any directory) maps to its
    ``.shardcat.sqlite``, so SQL can ``ATTACH`` a storage by its directory;
    any other path is returned as it is (``~`` expanded).
    """
    target = Path(path).expanduser()
    return target / META_FILE if target.is_dir() else target


def quote(name: str) -> str:
    """A SQL identifier for any field name."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class FieldSpec:
    """One field: canonical torch dtype name, row shape, block directory, SQL mirroring."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    directory: str = "."
    sql: str | None = None  # None, "filter" or "index"


@dataclass(frozen=True)
class Layout:
    """What is fixed when a storage is created."""

    kind: str
    block_size: int
    fields: tuple[FieldSpec, ...]


def sql_type(dtype: str) -> str:
    """The SQL column type mirroring a scalar field of torch dtype ``dtype``."""
    return "REAL" if "float" in dtype or dtype in ("half", "double") else "INTEGER"


def index_name(field: str) -> str:
    return quote("rows_" + field)


def create_index(field: str) -> str:
    """The SQL index of a field declared ``{"index": True}``."""
    return f"CREATE INDEX {index_name(field)} ON rows ({quote(field)})"


KEY_INDEX = "rows_key"  # no field index can have this name: "key" is no filterable field
CREATE_KEY_INDEX = f"CREATE UNIQUE INDEX {KEY_INDEX} ON rows (key) WHERE key IS NOT NULL"


def _ddl(layout: Layout) -> list[str]:
    statements = [
        "CREATE TABLE storage_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "CREATE TABLE storage_state (id INTEGER PRIMARY KEY CHECK (id = 0), "
        "length INTEGER NOT NULL, version INTEGER NOT NULL)",
        "CREATE TABLE storage_fields (name TEXT PRIMARY KEY, ord INTEGER NOT NULL UNIQUE, "
        "dtype TEXT NOT NULL, shape TEXT NOT NULL, directory TEXT NOT NULL, sql TEXT)",
        "CREATE TABLE storage_blocks (field TEXT NOT NULL REFERENCES storage_fields (name), "
        "idx INTEGER NOT NULL, file TEXT NOT NULL, PRIMARY KEY (field, idx), "
        "UNIQUE (field, file)) WITHOUT ROWID",
        "CREATE TABLE storage_pending (field TEXT NOT NULL, file TEXT NOT NULL, "
        "owner TEXT NOT NULL, PRIMARY KEY (field, file)) WITHOUT ROWID",
    ]
    if layout.kind == "db":
        columns = ["position INTEGER PRIMARY KEY", "key TEXT"]
        columns += [f"{quote(f.name)} {sql_type(f.dtype)}" for f in layout.fields if f.sql]
        statements.append(f"CREATE TABLE rows ({', '.join(columns)})")
        statements.append(CREATE_KEY_INDEX)
        statements += [create_index(f.name) for f in layout.fields if f.sql == "index"]
    return statements


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    configure_writer(conn)
    return conn


def _in_memory(fill: Callable[[sqlite3.Connection], None]) -> sqlite3.Connection:
    """A new in-memory database written by ``fill(conn)``, then read-only (``query_only``)."""
    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN")
    fill(conn)
    conn.execute("COMMIT")
    conn.execute("PRAGMA query_only = ON")
    return conn


def probe(directory: Path, *, ignore_metadata: bool = False) -> str:
    """What lives at ``directory``, from the file names alone.

    ``missing``; ``shardcat`` (a metadata file: :meth:`Metadata.load` tells
    whether its creation committed); ``tensorblob`` (a directory written by
    the tensorblob package); ``empty`` (nothing, or only an uncommitted
    metadata file when ``ignore_metadata``); or ``foreign``.
    """
    if not directory.exists():
        return "missing"
    if not directory.is_dir():
        raise NotADirectoryError(f"not a directory: {str(directory)!r}")
    if not ignore_metadata and (directory / META_FILE).is_file():
        return "shardcat"
    if (directory / ".conf").is_file():
        return "tensorblob"
    others = [n for n in os.listdir(directory) if not n.startswith(META_FILE)]
    return "foreign" if others else "empty"


class _Uncommitted(Exception):
    """The metadata file exists, but its creation never committed."""


def unlink(path: Path) -> None:
    """Delete ``path`` if it exists."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def unlink_meta_files(directory: Path) -> None:
    """Delete the metadata file of ``directory`` and its SQLite side files, if any."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        unlink(directory / (META_FILE + suffix))


class Metadata:
    """The open metadata of one storage directory (one SQLite connection)."""

    def __init__(
        self,
        directory: Path,
        *,
        writable: bool,
        conn: sqlite3.Connection | None = None,
        fill: Callable[[sqlite3.Connection], None] | None = None,
    ) -> None:
        self.directory = directory
        self.path = directory / META_FILE
        self.writable = writable
        # set: the metadata lives in memory, written by fill(conn) (a read in place)
        self._fill = fill
        self._conn = conn
        self._generation = -1 if conn is None else fork_generation()
        self._ro: sqlite3.Connection | None = None
        self._ro_generation = -1
        self._unlock: Callable[[], None] = lambda: None
        self.locked = False  # holds the directory's writer lock
        if writable:  # held until close (or until this object is garbage)
            fd = lock.acquire(directory)
            if fd is not None:
                self._unlock = weakref.finalize(self, lock.release, fd, fork_generation())
                self.locked = True
        conn = self.conn
        try:
            meta = dict(conn.execute("SELECT name, value FROM storage_meta").fetchall())
        except sqlite3.OperationalError as exc:
            self.close()
            if "no such table" in str(exc):
                raise _Uncommitted from None
            raise
        except sqlite3.DatabaseError as exc:
            self.close()
            raise StorageValueError(
                f"{self.path} is not shardcat storage metadata: {exc}"
            ) from None
        if "schema_version" not in meta:
            self.close()
            raise _Uncommitted
        version = int(meta["schema_version"])
        if version > SCHEMA_VERSION:
            self.close()
            raise SchemaVersionError(
                f"{self.path} has storage schema version {version}, but this shardcat only "
                f"knows versions up to {SCHEMA_VERSION}: upgrade shardcat "
                "(pip install -U shardcat) to open it"
            )
        self.kind: str = meta["kind"]
        self.block_size = int(meta["block_size"])
        self.imported_from: str | None = meta.get("imported_from")
        self.fields = tuple(
            FieldSpec(name, dtype, tuple(json.loads(shape)), directory_, sql)
            for name, dtype, shape, directory_, sql in conn.execute(
                "SELECT name, dtype, shape, directory, sql FROM storage_fields ORDER BY ord"
            )
        )
        # the committed row count, and the version it was committed with
        self.length, self.version = conn.execute(
            "SELECT length, version FROM storage_state WHERE id = 0"
        ).fetchone()
        if writable:
            self.collect_garbage()

    @classmethod
    def load(cls, directory: Path, *, writable: bool) -> Metadata | None:
        """The committed metadata in ``directory``, or None if its creation never committed."""
        try:
            return cls(directory, writable=writable)
        except _Uncommitted:
            return None

    @classmethod
    def in_memory(cls, directory: Path, fill: Callable[[sqlite3.Connection], None]) -> Metadata:
        """Read-only metadata of ``directory`` kept in memory, nothing written to disk:
        ``fill(conn)`` writes it into an empty in-memory database (each process builds
        its own). How a directory written by the tensorblob package is read in place."""
        return cls(directory, writable=False, fill=fill)

    # -- creation ----------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, layout: Layout) -> Metadata:
        """Create the metadata of a new, empty storage in ``directory`` (one transaction)."""
        directory.mkdir(parents=True, exist_ok=True)
        unlink_meta_files(directory)  # an uncommitted earlier attempt
        for spec in layout.fields:
            (directory / spec.directory).mkdir(parents=True, exist_ok=True)
        conn = _connect(directory / META_FILE)
        try:
            conn.execute("BEGIN IMMEDIATE")
            write_schema(conn, layout, length=0, extra={})
            conn.execute("COMMIT")
        except BaseException:
            conn.close()
            raise
        return cls(directory, writable=True, conn=conn)

    # -- connections ---------------------------------------------------------------

    @property
    def conn(self) -> sqlite3.Connection:
        """This process's connection (read-write when writable; reopened after fork)."""
        if self._conn is None or self._generation != fork_generation():
            # one inherited through fork is dropped, never used or closed here
            if self._fill is not None:
                self._conn = _in_memory(self._fill)
            else:
                self._conn = _connect(self.path) if self.writable else connect_readonly(self.path)
            self._generation = fork_generation()
        return self._conn

    @property
    def readonly_conn(self) -> sqlite3.Connection:
        """A connection that cannot write, for user SQL (``where``, ``query``)."""
        if self._fill is not None:  # in memory: the one connection, read-only already
            return self.conn
        if self._ro is None or self._ro_generation != fork_generation():
            self._ro = connect_readonly(self.path)
            self._ro_generation = fork_generation()
        return self._ro

    def close(self) -> None:
        for conn, generation in ((self._conn, self._generation), (self._ro, self._ro_generation)):
            if conn is not None and generation == fork_generation():
                conn.close()
        self._conn = self._ro = None
        self._unlock()

    # -- blocks --------------------------------------------------------------------

    def block_file(self, field: str, idx: int) -> str:
        row = self.conn.execute(
            "SELECT file FROM storage_blocks WHERE field = ? AND idx = ?", (field, idx)
        ).fetchone()
        if row is None:
            raise FileNotFoundError(f"{self.directory}: no block {idx} of field {field!r}")
        return str(row[0])

    def reserve(self, wanted: Mapping[str, int]) -> dict[str, list[str]]:
        """New block file names per field, recorded as pending before any file exists."""
        names = {field: [str(uuid.uuid4()) for _ in range(n)] for field, n in wanted.items()}
        rows = [(f, n, owner_id()) for f, ns in names.items() for n in ns]
        if rows:
            with self.transaction() as conn:
                conn.executemany(
                    "INSERT INTO storage_pending (field, file, owner) VALUES (?, ?, ?)", rows
                )
        return names

    def release(self, files: Sequence[tuple[str, str]], directories: Mapping[str, Path]) -> None:
        """Delete pending block files, and forget them.

        A file that a commit references stays: e.g. an interrupt that lands
        just after a commit makes the writer discard blocks that committed.
        """
        if not files:
            return
        for field, file in self._unreferenced(files):
            unlink(directories[field] / file)
        self._forget_pending(list(files))

    def collect_garbage(self) -> None:
        """Delete block files left by writers that are gone (reserved, or dropped, not deleted).

        With the writer lock held, that is every pending file: its writer was
        killed, or dropped without being closed.
        """
        if self.imported_from == "tensorblob":  # a conversion killed before its cleanup
            for spec in self.fields:
                for name in (".conf", ".stat"):
                    unlink(self.directory / spec.directory / name)
            for name in (".conf", ".stat"):
                unlink(self.directory / name)
        conn = self.conn
        pending = conn.execute("SELECT field, file, owner FROM storage_pending").fetchall()
        stale = [(f, n) for f, n, owner in pending if self.locked or not alive(owner)]
        if not stale:
            return
        directories = {spec.name: self.directory / spec.directory for spec in self.fields}
        orphans = [(f, n) for f, n in self._unreferenced(stale) if _BLOCK_NAME.match(n)]
        for field, file in orphans:
            unlink(directories[field] / file)
        self._forget_pending(stale)

    def _unreferenced(self, files: Iterable[tuple[str, str]]) -> Iterator[tuple[str, str]]:
        """The ``(field, file)`` pairs no row of ``storage_blocks`` has, lazily (one query each)."""
        conn = self.conn
        for field, file in files:
            if (
                conn.execute(
                    "SELECT 1 FROM storage_blocks WHERE field = ? AND file = ?", (field, file)
                ).fetchone()
                is None
            ):
                yield field, file

    def _forget_pending(self, files: Sequence[tuple[str, str]]) -> None:
        """Remove ``files`` from ``storage_pending`` (one transaction)."""
        with self.transaction() as conn:
            conn.executemany("DELETE FROM storage_pending WHERE field = ? AND file = ?", files)

    # -- transactions ----------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (joins a transaction already open)."""
        conn = self.conn
        if conn.in_transaction:
            yield conn
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def commit(
        self,
        length: int,
        added: Mapping[str, Sequence[tuple[int, str]]],
        cut: int | None,
        work: Callable[[sqlite3.Connection], None],
    ) -> list[tuple[str, str]]:
        """Commit a new row count and block lists in one transaction.

        Inside it, after checking that no other writer committed meanwhile,
        ``work(conn)`` runs (the SQL mirror), blocks ``idx >= cut`` of every
        field are dropped and ``added`` ``(idx, file)`` blocks referenced, in
        place of any block with the same ``idx``. Dropped files are recorded
        as pending and returned, for the caller to delete (:meth:`release`)
        after the commit.
        """
        conn = self.conn
        dropped: list[tuple[str, str]] = []
        with self.transaction():
            if (
                conn.execute(
                    "UPDATE storage_state SET length = ?, version = version + 1 "
                    "WHERE id = 0 AND version = ?",
                    (length, self.version),
                ).rowcount
                != 1
            ):
                raise self._stale()
            work(conn)
            if cut is not None:
                for spec in self.fields:  # one primary-key range per field
                    where = "FROM storage_blocks WHERE field = ? AND idx >= ?"
                    dropped += conn.execute(f"SELECT field, file {where}", (spec.name, cut))
                    conn.execute(f"DELETE {where}", (spec.name, cut))
            rows = [(f, i, n) for f, blocks in added.items() for i, n in blocks]
            for field, idx, _ in rows:  # replaced blocks (copied before being overwritten)
                dropped += conn.execute(
                    "SELECT field, file FROM storage_blocks WHERE field = ? AND idx = ?",
                    (field, idx),
                )
            conn.executemany(
                "INSERT OR REPLACE INTO storage_blocks (field, idx, file) VALUES (?, ?, ?)", rows
            )
            conn.executemany(
                "INSERT OR REPLACE INTO storage_pending (field, file, owner) VALUES (?, ?, ?)",
                [(f, n, owner_id()) for f, n in dropped],
            )
            conn.executemany(
                "DELETE FROM storage_pending WHERE field = ? AND file = ?",
                [(f, n) for f, _, n in rows],
            )
        self.length, self.version = length, self.version + 1
        return dropped

    def _stale(self) -> StaleWriterError:
        return StaleWriterError(
            f"{self.directory} was changed by another writer since it was opened here; "
            "reopen it (one writer at a time)"
        )


def write_schema(
    conn: sqlite3.Connection, layout: Layout, *, length: int, extra: Mapping[str, str]
) -> None:
    """Create the tables of ``layout`` and its first rows (inside the caller's transaction)."""
    for statement in _ddl(layout):
        conn.execute(statement)
    meta = {
        "schema_version": str(SCHEMA_VERSION),
        "kind": layout.kind,
        "block_size": str(layout.block_size),
        "created_at": repr(time.time()),
        **extra,
    }
    conn.executemany("INSERT INTO storage_meta (name, value) VALUES (?, ?)", meta.items())
    conn.executemany(
        "INSERT INTO storage_fields (name, ord, dtype, shape, directory, sql) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        [
            (f.name, i, f.dtype, json.dumps(list(f.shape)), f.directory, f.sql)
            for i, f in enumerate(layout.fields)
        ],
    )
    conn.execute("INSERT INTO storage_state (id, length, version) VALUES (0, ?, 0)", (length,))
