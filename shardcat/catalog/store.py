"""The :class:`Store`: one SQLite catalog file, as SQL and nothing else.

It opens (creating or upgrading) the file, hands out the read-only connection
readers run their lookups on (one read snapshot per call), write
transactions, dataset rows and their descriptions, ``drop`` and
``checkpoint``; the ingest transactions it runs are in
:mod:`~shardcat.catalog.sync`, :mod:`~shardcat.catalog.claims` and
:mod:`~shardcat.catalog.commit`, the readers' statements in
:mod:`~shardcat.catalog.lookup`. It never opens a shard and knows no format:
:class:`shardcat.Catalog` (the facade) adds what needs them.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, delete
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from shardcat.catalog import datasets, deletes, schema, shares, tables
from shardcat.catalog import engine as engine_module
from shardcat.catalog import tags as tagging
from shardcat.catalog.backend import Backend, backend_for
from shardcat.catalog.commit import IngestJob, catalog_error
from shardcat.catalog.connections import FileWatch, ThreadConnections, next_serial
from shardcat.catalog.datasets import ROW_COLUMNS, DatasetInfo, DatasetPlan, DatasetRow, describe
from shardcat.catalog.deletes import Pick
from shardcat.catalog.engine import cannot_create_shm, fork_generation, reads_catalog, unsaved_wal
from shardcat.catalog.lookup import ReadConnection
from shardcat.catalog.query import DEFAULT_QUERY_MEMORY, DEFAULT_QUERY_TIMEOUT, Rows, check_limits
from shardcat.catalog.session import IngestSession
from shardcat.catalog.tags import TagInfo
from shardcat.catalog.versions import SCHEMA_VERSION, ensure_schema, read_version, too_new, too_old
from shardcat.errors import CatalogError, checkpoint_hint

__all__ = ["Store", "check_name", "open_catalogs"]

# How long a reader's lookups may keep one read snapshot (see reader_connection).
SNAPSHOT_SECONDS = 1.0

# Every Store not yet closed (tests use it to catch leaked connections).
_open: weakref.WeakSet[Store] = weakref.WeakSet()

S = TypeVar("S", bound="Store")


def open_catalogs() -> list[Store]:
    return [c for c in _open if not c.closed]


def _create_field_index(conn: Connection, dataset_id: int, name: str, field: str) -> bool:
    """:func:`tables.create_field_index` on rows the dataset owns (a dataset reading
    another's by reference copies them first: :mod:`~shardcat.catalog.shares`)."""
    shares.materialize(conn, dataset_id)
    return tables.create_field_index(conn, dataset_id, name, field)


def check_name(name: str) -> None:
    tagging.refuse_write(name, "ingest into")
    if not schema.is_dataset_name(name):
        raise CatalogError(
            f"invalid dataset name {name!r}: use letters, digits and '_' (not starting "
            f"with a digit, nor with {schema.PREFIX} or sqlite_, the catalog's and "
            f"SQLite's own names, nor {schema.OLD_META})"
        )


class Store:
    """One catalog file as SQL: datasets, shards, keys and byte offsets.

    ``Store(path)`` opens (creating when needed) the SQLite catalog at ``path``
    (None: ``$SHARDCAT_CATALOG``, then ``./shardcat.sqlite``); an older schema is
    refused: the opener (:mod:`shardcat.facade.opener`) upgrades it first.
    ``readonly=True`` opens it without ever creating, upgrading or changing a
    file (for catalogs on shared filesystems that one host indexed); in a
    read-only directory or mount, where SQLite cannot create the ``-shm`` file,
    it opens immutable when the main file holds every commit.
    ``immutable=True`` also promises SQLite that nobody writes it, so no locks
    are taken and the ``-wal`` file is not read: it refuses a catalog whose
    ``-wal`` holds commits not yet in the main file (see :meth:`checkpoint`), and
    reads fail with :class:`CatalogError` once the file is replaced or rewritten.
    Errors opening the file are :class:`CatalogError` naming it.

    ``Store("postgresql://host/db")`` (any ``postgresql://``/``postgres://`` URL,
    also in ``$SHARDCAT_CATALOG``) opens a catalog on a PostgreSQL server instead:
    the same tables, created when missing; see :mod:`~shardcat.catalog.postgres`.
    ``path`` is then the URL without its password (``location`` keeps it whole).
    What differs between the two is the store's ``backend``
    (:mod:`~shardcat.catalog.backend`), chosen here once.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        readonly: bool = False,
        immutable: bool = False,
    ) -> None:
        #: what differs between a SQLite file and a PostgreSQL server, chosen once
        self.backend: Backend = backend_for(path)
        #: what reopens this catalog (a file's path, or a server's whole URL)
        self.location = self.backend.location
        #: the catalog's name in messages (a file's path, a URL without its password)
        self.path: Path | str = self.backend.local_file or self.backend.display
        self.backend.check_mode(immutable=immutable)
        self.readonly = readonly or immutable
        self.immutable = immutable
        self.closed = False
        self._reads = ThreadConnections(self._open_reads)
        self._born = fork_generation()  # a forked child's copy never closes the WAL
        self._engine: Engine | None = None
        # an immutable catalog's file, checked to be the one opened
        self._watch = FileWatch(self._file(), str(self.path)) if immutable else None
        try:
            if self.readonly:
                self._open_readonly()
            else:
                self.backend.before_write()
                self._engine = self.backend.engine()
                version = self._open_schema(self._engine)
                if version is not None and version > SCHEMA_VERSION:
                    raise too_new(str(self.path), version)
        except BaseException as exc:
            self._reads.close()  # not registered in _open yet: close it here
            if self._watch is not None:
                self._watch.close()
            if self._engine is not None:
                self._engine.dispose()
            if isinstance(exc, SQLAlchemyError):
                raise self.backend.open_error(exc) from None
            raise
        _open.add(self)

    # -- plumbing --------------------------------------------------------------

    def _file(self) -> Path:
        """The SQLite file (only called on the paths a file catalog takes)."""
        if self.backend.local_file is None:
            raise CatalogError(f"{self.path} is not a local SQLite file")
        return self.backend.local_file

    def _open_readonly(self) -> None:
        """Check a catalog opened read-only: there, holding every commit, not newer or
        older."""
        file = self.backend.local_file
        if file is not None and not file.is_file():
            raise CatalogError(f"no catalog at {self.path}")
        unsaved = unsaved_wal(file) if file is not None and self.immutable else None
        if unsaved is not None:
            raise CatalogError(
                f"{self.path} has commits in {self.path}-wal that {unsaved} in the main file,",
                hint=checkpoint_hint(self.path, unseen=True),
            )
        version = self._read_version()
        if version is None:
            raise CatalogError(self.backend.no_catalog)
        if version > SCHEMA_VERSION:
            raise too_new(str(self.path), version)
        if version < SCHEMA_VERSION:
            raise too_old(str(self.path), version)

    def _open_schema(self, engine: Engine) -> int | None:
        """The schema version found, creating the schema in a new catalog.

        The version is read without the write lock (a deferred transaction): an
        open that changes nothing never waits for another process's ingest.
        Creating takes the lock; ``ensure_schema`` reads the version again under
        it. An older catalog is refused: the opener upgrades it first. Processes
        creating one new catalog at once may see "database is locked" without a
        busy wait: retried up to the busy timeout.
        """
        deadline = time.monotonic() + engine_module.BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                with engine.connect().execution_options(immediate=False) as conn:
                    with conn.begin():
                        version = read_version(conn)
                    if version is not None and version < SCHEMA_VERSION:
                        raise too_old(str(self.path), version)  # the opener upgrades it
                    if version is None:
                        conn.execution_options(immediate=True)
                        with conn.begin():
                            ensure_schema(conn, str(self.path))
                return version
            except DBAPIError as exc:
                if "locked" not in str(exc.orig) or time.monotonic() > deadline:
                    raise self.backend.open_error(exc) from None
                time.sleep(0.02)

    @property
    def directory(self) -> str:
        """Where relative shard paths start: the file's directory ("" for a server
        catalog, whose shard paths are all stored absolute)."""
        return self.backend.directory

    def _read_version(self) -> int | None:
        """The schema version the catalog records, read on the read-only connection
        (None: a database without one). Where SQLite cannot open a file read-only
        because it cannot create the ``-shm`` file (a read-only directory or mount)
        and the main file holds every commit, it is opened immutable instead:
        nothing can be writing it there."""
        file = self.backend.local_file
        try:
            try:
                return self.backend.read_version(self.reader_connection())
            except sqlite3.OperationalError as exc:
                if file is None or self.immutable or not cannot_create_shm(file, exc):
                    raise
                if unsaved_wal(file) is not None:
                    raise CatalogError(
                        f"cannot open {self.path} read-only: SQLite needs to create "
                        f"{self.path}-shm (the directory is read-only) to read the commits "
                        f"in {self.path}-wal;",
                        hint=checkpoint_hint(
                            self.path, before="checkpoint it where it is written "
                        ),
                    ) from None
                self._reads.close()
                self.immutable = True
                self._watch = FileWatch(file, str(self.path))
                return self.backend.read_version(self.reader_connection())
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # not a database, corrupt
            raise self.backend.open_error(exc) from None

    def reader_connection(self, *, snapshot: bool = False) -> ReadConnection:
        """This thread's read-only DBAPI connection (see
        :mod:`~shardcat.catalog.connections`: one per thread, reopened after fork).

        ``snapshot=True`` (the readers' per-record lookups) keeps a read
        transaction open for up to ``SNAPSHOT_SECONDS``: SQLite then skips its
        per-statement locking (~3 µs of a ~10 µs point query), and a reader sees
        other processes' commits at most that much later. Every other use ends
        the transaction first and sees the latest commit, as do lookups after
        this catalog's own ``ingest``/``drop``.
        """
        return self.read_snapshot()[0] if snapshot else self._latest()

    def read_snapshot(self) -> tuple[ReadConnection, int]:
        """This thread's connection in a read snapshot (see :meth:`reader_connection`)
        and the snapshot's number (unique in this process: a new number, a new snapshot)."""
        if self.closed:  # (_check_open, inlined: every read by key comes here)
            self._check_open()
        slot = self._reads.slot()
        conn = slot.conn
        now = time.monotonic()
        if now - slot.since > SNAPSHOT_SECONDS or not conn.in_transaction:
            if self._watch is not None:
                self._watch.unchanged()
            try:
                if conn.in_transaction:
                    conn.execute("COMMIT")
                conn.execute("BEGIN")
            except sqlite3.Error as exc:
                raise self.damaged(exc) from None
            slot.since = now
            slot.serial = next_serial()  # readers re-check their dataset's version
        if self._watch is not None:
            self._watch.not_rewritten()
        return conn, slot.serial

    def _latest(self) -> ReadConnection:
        """This thread's connection out of any read snapshot: it sees the latest commit."""
        self._check_open()
        conn = self._reads.slot().conn
        if self._watch is not None:
            self._watch.unchanged()
        try:
            if conn.in_transaction:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self.damaged(exc) from None
        return conn

    def _open_reads(self) -> ReadConnection:  # (for ThreadConnections)
        if self._watch is not None:
            self._watch.unchanged()
        return self.backend.read_connection(immutable=self.immutable)

    def damaged(self, exc: BaseException) -> CatalogError:
        """The error for a database failure reading the catalog (see
        ``Backend.damage_error``)."""
        return self.backend.damage_error(exc)

    @contextlib.contextmanager
    def read_transaction(self) -> Iterator[Connection]:
        """A SQLAlchemy connection in one read transaction: every statement on it sees
        the same moment of the catalog (a snapshot's rows, whatever writers commit
        meanwhile). On a catalog opened read-only it runs on read-only connections."""
        self.reader_connection()  # closed? an immutable file changed?
        own = None
        if self._engine is None:
            own = self.backend.read_engine(immutable=self.immutable)
        engine = self._engine or own
        assert engine is not None
        try:
            with (
                engine.connect().execution_options(**self.backend.read_options) as conn,
                conn.begin(),
            ):
                yield conn
        finally:
            if own is not None:
                own.dispose()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Any]:
        """A write transaction; a database failure (read-only file, disk full, I/O
        error) is a :class:`CatalogError` naming the catalog, nothing half-written."""
        try:
            with self._writer().begin() as conn:
                yield conn
        except SQLAlchemyError as exc:
            raise catalog_error(str(self.path), exc) from None

    def check_writable(self) -> None:
        """:class:`CatalogError` when this catalog is closed or was opened read-only."""
        self._writer()

    def _writer(self) -> Any:
        self._check_open()
        if self._engine is None:
            raise CatalogError(f"{self.path} was opened read-only")
        return self._engine

    def _check_open(self) -> None:
        if self.closed:
            raise CatalogError(f"catalog {self.path} is closed")

    @reads_catalog
    def dataset_row(self, name: str) -> DatasetRow:
        """A dataset's row; :class:`CatalogError` naming the known datasets when it is
        missing."""
        conn = self.reader_connection()
        row = conn.execute(
            f"SELECT {ROW_COLUMNS} FROM shardcat_datasets WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            known = [r[0] for r in conn.execute("SELECT name FROM shardcat_datasets ORDER BY name")]
            raise CatalogError(
                f"no dataset {name!r} in {self.path}"
                + (f" (it has: {', '.join(known)})" if known else " (it has no datasets yet)")
            )
        return DatasetRow.of(row)

    @reads_catalog
    def unused_name(self, base: str) -> str:
        """``base``, else ``base_2``, ``base_3``, ...: the first name no dataset has."""
        taken = {
            str(r[0]).lower()
            for r in self.reader_connection().execute("SELECT name FROM shardcat_datasets")
        }
        return schema.first_free(base, taken)

    @reads_catalog
    def datasets(self) -> list[DatasetInfo]:
        """Every dataset with its shard and record counts (tags are listed by
        :meth:`tags`; in a snapshot of a tag, the tag is a dataset of its own)."""
        conn = self.reader_connection()
        rows = conn.execute(
            f"SELECT {ROW_COLUMNS} FROM shardcat_datasets WHERE id NOT IN "
            "(SELECT pinned_id FROM shardcat_tags) ORDER BY name"
        )
        return [self._describe(DatasetRow.of(row)) for row in rows.fetchall()]

    @reads_catalog
    def info(self, name: str) -> DatasetInfo:
        """One dataset as :meth:`datasets` describes it (:class:`CatalogError`
        naming the known datasets when it is missing)."""
        return self._describe(self.dataset_row(name))

    def _describe(self, row: DatasetRow) -> DatasetInfo:
        conn = self.reader_connection()
        return describe(conn, row, self.backend.dialect.index_names_sql)

    def query_rows(
        self,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        attach: Mapping[str, str | os.PathLike[str]] | None = None,
        timeout: float | None = DEFAULT_QUERY_TIMEOUT,
        memory: int | None = DEFAULT_QUERY_MEMORY,
    ) -> contextlib.AbstractContextManager[Rows]:
        """One read-only SQL statement (see :mod:`shardcat.catalog.query`): yields the
        column names and the rows, fetched as they are iterated within the block."""
        check_limits(timeout, memory)
        self._check_open()
        return self.backend.query(
            self._latest, sql, params, attach=attach, timeout=timeout, memory=memory
        )

    def damage(self) -> list[str]:
        """What SQLite's ``quick_check`` finds damaged in the catalog file (none on a server)."""
        return self.backend.quick_check(self._latest())

    @reads_catalog
    def shard_states(self, name: str) -> dict[str, tuple[int, int, str, int]]:
        """Stored shard path -> (size, mtime_ns, state, records) of dataset ``name``."""
        rows = self.reader_connection().execute(
            "SELECT s.path, s.size, s.mtime_ns, s.state, s.num_records FROM shardcat_shards s "
            "JOIN shardcat_datasets d ON d.id = s.dataset_id WHERE d.name = ?",
            (name,),
        )
        return {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}

    @reads_catalog
    def stored_options(self, name: str) -> dict[str, Any] | None:
        """The options dataset ``name`` was ingested with; None when there is no such dataset."""
        sql = "SELECT options FROM shardcat_datasets WHERE name = ?"
        row = self.reader_connection().execute(sql, (name,)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    @reads_catalog
    def has_dataset(self, name: str) -> bool:
        sql = "SELECT 1 FROM shardcat_datasets WHERE name = ?"
        return self.reader_connection().execute(sql, (name,)).fetchone() is not None

    def ensure_dataset(self, plan: DatasetPlan) -> tuple[int, dict[str, Any], str]:
        """Create the dataset ``plan.name`` read with ``plan.rule`` (or check that it is
        read with it), store its options and source patterns, and make its shard rows
        match ``plan.files``, in one write transaction (see :class:`DatasetPlan`);
        returns its id, its options and its key rule."""
        check_name(plan.name)
        with self._transaction() as conn:
            return datasets.ensure(conn, plan)

    def ingest_session(self, job: IngestJob) -> IngestSession:
        """The session an ingest of ``job``'s dataset claims, commits and fails its
        shards through (:mod:`~shardcat.catalog.session`); :class:`CatalogError` on a
        catalog opened read-only or closed."""
        self.check_writable()
        if job.catalog != self.location:
            raise CatalogError(f"an ingest job of {job.catalog}, not of {self.path}")
        return IngestSession(job)

    def drop(self, name: str) -> None:
        """Remove a dataset, its shards' rows, its view and its tags (files on disk are
        untouched)."""
        tagging.refuse_write(name, "drop")
        row = self.dataset_row(name)
        dataset_id = row.id
        with self._transaction() as conn:
            for tag in tagging.listed(conn, dataset_id):
                tagging.unpin(conn, row, tag.name)
            shares.release(conn, dataset_id, None, own=False)  # its readers by reference copy
            tables.drop_dataset_objects(conn, dataset_id, name)
            # shards, records, members, seek points and field registry rows go with it
            # (ON DELETE CASCADE; the engine turns foreign keys on)
            conn.execute(delete(schema.datasets).where(schema.datasets.c.id == dataset_id))
        self.reader_connection()  # end any read snapshot
        self.checkpoint(wait=False)  # a finished writer leaves the main file complete

    def mark_deleted(self, name: str, pick: Pick, *, deleted: bool) -> int:
        """Soft-delete (``deleted``) or restore the records of dataset ``name`` that
        ``pick`` names (see :mod:`~shardcat.catalog.deletes`); returns how many
        changed. A ``where`` runs as a guarded query over the dataset's view (for
        a restore, over every record, deleted ones included)."""
        tagging.refuse_write(name, "delete records of" if deleted else "restore records of")
        row = self.dataset_row(name)
        if row.key_rule == "position":
            raise CatalogError(
                f"dataset {name!r} is keyed by position: its keys are positions, which a "
                "delete would move; soft deletes need a dataset keyed by a feature"
            )
        keys = None if pick.keys is None else [str(k) for k in pick.keys]
        if pick.where is not None:
            with self.read_transaction() as conn:
                view = tables.view_select(conn, row.id, live=deleted)
            sql = f"SELECT key FROM ({view}) v WHERE {pick.where}"
            with self.query_rows(sql, pick.params) as (_, rows):
                keys = [*(keys or ()), *(str(r[0]) for r in rows)]
        elif keys is None and deleted:
            raise CatalogError("say which records to delete: where= (SQL) or keys=")
        with self._transaction() as conn:
            if deleted:
                changed = deletes.mark(conn, row.id, name, keys or [])
            else:
                changed = deletes.unmark(conn, row.id, name, keys)
        self.reader_connection()  # end any read snapshot: see the change
        return changed

    def tag(self, dataset: str, name: str) -> TagInfo:
        """Pin dataset ``dataset`` as it is now as tag ``name``, read later as
        ``"<dataset>@<name>"`` (see :mod:`~shardcat.catalog.tags`)."""
        return self._change_tags(dataset, name, "tag", tagging.pin)

    def untag(self, dataset: str, name: str) -> TagInfo:
        """Remove tag ``name`` of ``dataset`` and the rows it pinned; returns what it was."""
        return self._change_tags(dataset, name, "untag", tagging.unpin)

    def _change_tags(
        self,
        dataset: str,
        name: str,
        doing: str,
        change: Callable[[Connection, DatasetRow, str], TagInfo],
    ) -> TagInfo:
        tagging.refuse_write(dataset, doing)
        row = self.dataset_row(dataset)
        with self._transaction() as conn:
            info = change(conn, row, name)
        self.reader_connection()  # end any read snapshot: see the change
        return info

    def tags(self, dataset: str | None = None) -> list[TagInfo]:
        """The tags of ``dataset`` (None: of every dataset), by dataset then name."""
        dataset_id = None if dataset is None else self.dataset_row(dataset).id
        with self.read_transaction() as conn:
            return tagging.listed(conn, dataset_id)

    def create_index(self, dataset: str, field: str) -> bool:
        """Index the SQL field ``field`` (its name in the dataset's view) of ``dataset``,
        so that filters and sorts on it (``WHERE label < 10``) read a range of the index
        instead of every record. Idempotent: False when it was indexed already. The
        index is kept current by every ingest of the dataset's records (which write
        it too) and goes with :meth:`drop`.
        :class:`CatalogError` for an unknown dataset or field (naming the known ones)
        and on a catalog opened read-only."""
        return self._field_index(dataset, field, _create_field_index)

    def drop_index(self, dataset: str, field: str) -> bool:
        """Drop the index :meth:`create_index` made; False when the field had none."""
        return self._field_index(dataset, field, tables.drop_field_index)

    def _field_index(
        self, dataset: str, field: str, change: Callable[[Connection, int, str, str], bool]
    ) -> bool:
        tagging.refuse_write(dataset, "change the indexes of")
        if self._engine is None and not self.closed:
            raise CatalogError(
                f"cannot change the indexes of {dataset!r}: {self.path} was opened read-only"
            )
        dataset_id = self.dataset_row(dataset).id
        with self._transaction() as conn:
            changed = change(conn, dataset_id, dataset, field)
        self.reader_connection()  # end any read snapshot: see the change
        return changed

    def checkpoint(self, *, wait: bool = True) -> bool:
        """Copy every commit from the ``-wal`` file back into the main file.

        Copies what no reader still needs, then empties the ``-wal`` file when no
        other process is reading or writing (``wait``: for up to half a second).
        Returns True when the main file now holds every commit, so that
        ``Catalog(path, immutable=True)`` (or a copy of the file alone) sees
        them all. ``ingest`` and ``drop`` call it when they finish, without
        waiting (readers of a training job never slow them down).
        """
        engine = self._writer()
        if self._reads.opened():
            self.reader_connection()  # end this thread's read snapshot: it pins the WAL
        return self.backend.checkpoint(engine, wait=wait)

    def close(self) -> None:
        """Close this process's connections (idempotent)."""
        if self.closed:
            return
        self._reads.close()
        if self._watch is not None:
            self._watch.close()
        if self._engine is not None:
            self._engine.dispose()
        if not self.readonly and self._born == fork_generation():
            self.backend.close_files()  # (SQLite: -wal and -shm go with the last connection)
        self.closed = True

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.location, "readonly": self.readonly, "immutable": self.immutable}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], readonly=state["readonly"], immutable=state["immutable"])  # type: ignore[misc]
