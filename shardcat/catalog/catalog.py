"""The :class:`Catalog`: one SQLite file that knows where every record lives."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import sqlite3
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, delete, select
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from shardcat.catalog import engine as engine_module
from shardcat.catalog import fields as field_store
from shardcat.catalog import reuse, schema
from shardcat.catalog.engine import (
    CHECKPOINT_BUSY_MS,
    cannot_create_shm,
    connect_readonly,
    fork_generation,
    locate,
    make_engine,
    open_error,
    unsaved_wal,
)
from shardcat.catalog.engine import checkpoint as wal_checkpoint
from shardcat.catalog.ingest import (
    DEFAULT_LEASE,
    DROPPED,
    DUPLICATE_POLICIES,
    IngestJob,
    ProvideEntries,
    ShardOutcome,
    catalog_error,
    raise_for_failures,
    run_ingest,
    stored_path,
    sync_shards,
)
from shardcat.catalog.query import DEFAULT_QUERY_TIMEOUT, QueryResult, attached, run_readonly
from shardcat.errors import CatalogError, SchemaVersionError
from shardcat.migrations import OLD_META, SCHEMA_VERSION, ensure_schema, read_version, too_new
from shardcat.readers.formats import detect_format, get_format

if TYPE_CHECKING:
    from shardcat.legacy import MigrationReport
    from shardcat.readers.reader import Reader

__all__ = ["Catalog", "DatasetInfo", "PathsLike", "open_catalogs", "resolve_paths"]

PathsLike = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
# Shard numbering at the end of a file stem: "-00003", "_00003-of-00016", ".7".
_SHARD_SUFFIX = re.compile(r"(?:[-_.]+of|[-_.]*\d+)+$")

# How long a reader's lookups may keep one read snapshot (see reader_connection).
SNAPSHOT_SECONDS = 1.0

# Every Catalog not yet closed (tests use it to catch leaked connections).
_open: weakref.WeakSet[Catalog] = weakref.WeakSet()


def open_catalogs() -> list[Catalog]:
    return [c for c in _open if not c.closed]


# The columns of a dataset row as dataset_row returns it.
_DATASET_COLUMNS = "id, name, format, key_rule, grouping, options, source, created_at"


def as_patterns(paths: PathsLike) -> list[str]:
    """``paths`` (one path or pattern, or several) as a list of strings."""
    if isinstance(paths, (str, os.PathLike)):
        return [os.fspath(paths)]
    return [os.fspath(p) for p in paths]


# Files that are never shards: catalogs (and their -wal/-shm), legacy index files
# (tfd-utils, MXNet/DALI, vahidk) and the lock and temporary files tfd-utils keeps
# beside its indexes.
_NOT_A_SHARD = re.compile(r"\.sqlite|\.(?:index|tar_index|idx|tfindex)(?:\.lock|\.tmp)?$")


def resolve_paths(paths: PathsLike) -> list[str]:
    """Absolute, sorted, unique shard files for a path, a glob, a directory or a list of them.

    A directory or a glob stands for its files except catalogs (``*.sqlite*``),
    legacy index files (``*.index``, ``*.tar_index``, ``*.idx``, ``*.tfindex``)
    and tfd-utils' ``.lock``/``.tmp`` files beside them; a file named
    explicitly is taken as it is.
    """
    found: set[str] = set()
    for pattern in as_patterns(paths):
        pattern = os.path.expanduser(pattern)
        if os.path.isdir(pattern):
            matches = [
                os.path.join(pattern, n)
                for n in os.listdir(pattern)
                if os.path.isfile(os.path.join(pattern, n)) and not _NOT_A_SHARD.search(n)
            ]
        elif os.path.exists(pattern):
            matches = [pattern]
        else:
            matches = [
                m
                for m in glob.glob(pattern, recursive=True)
                if os.path.isfile(m) and not _NOT_A_SHARD.search(os.path.basename(m))
            ]
        found.update(os.path.abspath(m) for m in matches)
    return sorted(found)


def default_dataset_name(files: Sequence[str]) -> str:
    """A SQL-friendly name for a shard set: the common stem prefix, or the directory name."""
    stems = [Path(f).name.split(".")[0] for f in files]
    # character-wise on purpose: "train-00001" and "train-00002" share "train-0000"
    prefix = _SHARD_SUFFIX.sub("", os.path.commonprefix(stems))  # noqa: RUF071
    base = prefix or Path(files[0]).parent.name or "dataset"
    slug = re.sub(r"[^A-Za-z0-9_]+", "_", base).strip("_") or "dataset"
    return slug if schema.is_dataset_name(slug) else f"d_{slug}"


def _check_name(name: str) -> None:
    if not schema.is_dataset_name(name):
        raise CatalogError(
            f"invalid dataset name {name!r}: use letters, digits and '_' (not starting "
            f"with a digit, nor with {schema.PREFIX} or sqlite_, the catalog's and "
            "SQLite's own names)"
        )


def _refuse_foreign(path: Path) -> None:
    """Refuse to turn a file that is not a catalog into one: anything but a missing or
    empty file, or a SQLite database holding ``catalog_meta``, is left untouched."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    uri = path.resolve().as_uri() + "?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.Error as exc:
        raise open_error(path, exc) from None
    if tables and not tables & {"shardcat_meta", "catalog_meta"}:  # (before version 4)
        raise CatalogError(
            f"{path} is a SQLite database but not a shardcat catalog: refusing to add the "
            "catalog's tables to it (give another catalog path)"
        )


class Keep:
    """Default of ``Catalog.ingest(key=...)``: keep the dataset's key rule (new: ``"key"``)."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP = Keep()


@dataclass(frozen=True)
class DatasetInfo:
    """A dataset as the catalog describes it."""

    name: str
    format: str
    key_rule: str
    grouping: str | None
    options: dict[str, Any]
    source: list[str]
    created_at: float
    shards: int
    ready_shards: int
    failed_shards: int
    records: int
    fields: dict[str, str]  # view column -> sql type

    @property
    def key_feature(self) -> str | None:
        return self.key_rule.partition(":")[2] if self.key_rule.startswith("feature:") else None


class Catalog:
    """One catalog file: datasets, shards, keys and byte offsets.

    ``Catalog(path)`` opens (creating or upgrading when needed) the SQLite
    catalog at ``path``; without a path, ``$SHARDCAT_CATALOG`` is used, then
    ``./shardcat.sqlite``; the write lock is only taken to create or upgrade.
    ``readonly=True`` opens it without ever creating, upgrading or changing a
    file (for catalogs on shared filesystems that one host indexed); in a
    read-only directory or mount, where SQLite cannot create the ``-shm`` file,
    it opens immutable when the main file holds every commit.
    ``immutable=True`` also promises SQLite that nobody writes it, so no locks
    are taken and the ``-wal`` file is not read: it refuses a catalog whose
    ``-wal`` holds commits not yet in the main file (see :meth:`checkpoint`).
    Errors opening the file are :class:`CatalogError` naming it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        readonly: bool = False,
        immutable: bool = False,
    ) -> None:
        self.path = locate(path).absolute()
        self.readonly = readonly or immutable
        self.immutable = immutable
        self.closed = False
        self._ro: sqlite3.Connection | None = None
        self._ro_generation = -1
        self._snapshot_at = 0.0
        self.snapshot_serial = 0  # counts the read snapshots begun (see reader_connection)
        self._engine: Engine | None = None
        try:
            if self.readonly:
                if not self.path.is_file():
                    raise CatalogError(f"no catalog at {self.path}")
                unsaved = unsaved_wal(self.path) if self.immutable else None
                if unsaved is not None:
                    raise CatalogError(
                        f"{self.path} has commits in {self.path}-wal that {unsaved} in the main "
                        "file, so immutable=True would not see them: open it with readonly=True "
                        "instead, or checkpoint it where it is written "
                        f"(`catalog checkpoint -c {self.path}`, Catalog.checkpoint())"
                    )
                version = self._read_version()
                if version is None:
                    raise CatalogError(
                        f"{self.path} is not a shardcat catalog (it records no schema version)"
                    )
                if version > SCHEMA_VERSION:
                    raise too_new(str(self.path), version)
                if version < SCHEMA_VERSION:
                    raise SchemaVersionError(
                        f"{self.path} has catalog schema version {version}, this shardcat "
                        f"writes version {SCHEMA_VERSION}: open it once without readonly=True "
                        "(or run `catalog migrate --upgrade`) to upgrade it"
                    )
            else:
                _refuse_foreign(self.path)
                self._engine = make_engine(self.path)
                version = self._open_schema(self._engine)
                if version is not None and version > SCHEMA_VERSION:
                    raise too_new(str(self.path), version)
        except BaseException:
            if self._ro is not None:  # not registered in _open yet: close it here
                self._ro.close()
                self._ro = None
            if self._engine is not None:
                self._engine.dispose()
            raise
        _open.add(self)

    # -- plumbing --------------------------------------------------------------

    def _open_schema(self, engine: Engine) -> int | None:
        """The schema version found, creating or upgrading the schema when needed.

        The version is read without the write lock (a deferred transaction): an
        open that changes nothing never waits for another process's ingest.
        Creating or upgrading takes the lock, and ``ensure_schema`` reads the
        version again under it. Processes creating one new catalog at once may
        see "database is locked" without a busy wait: retried up to the busy timeout.
        """
        deadline = time.monotonic() + engine_module.BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                with engine.connect().execution_options(immediate=False) as conn:
                    with conn.begin():
                        version = read_version(conn)
                    if version is None or version < SCHEMA_VERSION:
                        conn.execution_options(immediate=True)
                        with conn.begin():
                            ensure_schema(conn, str(self.path))
                return version
            except DBAPIError as exc:
                if "locked" not in str(exc.orig) or time.monotonic() > deadline:
                    raise open_error(self.path, exc) from None
                time.sleep(0.02)

    @property
    def directory(self) -> str:
        return str(self.path.parent)

    def _read_version(self) -> int | None:
        """The schema version the file records, read on the read-only connection
        (None: a SQLite database without one). Where SQLite cannot open it
        read-only because it cannot create the ``-shm`` file (a read-only
        directory or mount) and the main file holds every commit, it is opened
        immutable instead: nothing can be writing it there."""
        sql = "SELECT value FROM shardcat_meta WHERE name = 'schema_version'"
        try:
            try:
                row = self.reader_connection().execute(sql).fetchone()
            except sqlite3.OperationalError as exc:
                if self.immutable or not cannot_create_shm(self.path, exc):
                    raise
                if unsaved_wal(self.path) is not None:
                    raise CatalogError(
                        f"cannot open {self.path} read-only: SQLite needs to create "
                        f"{self.path}-shm (the directory is read-only) to read the commits "
                        f"in {self.path}-wal; checkpoint it where it is written "
                        f"(`catalog checkpoint -c {self.path}`, Catalog.checkpoint())"
                    ) from None
                if self._ro is not None:
                    self._ro.close()
                    self._ro = None
                self.immutable = True
                row = self.reader_connection().execute(sql).fetchone()
        except sqlite3.OperationalError as exc:
            if not str(exc).startswith("no such table"):
                raise open_error(self.path, exc) from None
            try:  # a catalog older than version 4 kept it in catalog_meta
                row = self.reader_connection().execute(sql.replace("shardcat_meta", OLD_META))
                row = row.fetchone()
            except sqlite3.OperationalError:
                return None
        except sqlite3.DatabaseError as exc:  # not a database, corrupt
            raise open_error(self.path, exc) from None
        return None if row is None else int(row[0])

    def reader_connection(self, *, snapshot: bool = False) -> sqlite3.Connection:
        """The read-only DBAPI connection of this process (reopened after fork).

        ``snapshot=True`` (the readers' per-record lookups) keeps a read
        transaction open for up to ``SNAPSHOT_SECONDS``: SQLite then skips its
        per-statement locking (~3 µs of a ~10 µs point query), and a reader sees
        other processes' commits at most that much later. Every other use ends
        the transaction first and sees the latest commit, as do lookups after
        this catalog's own ``ingest``/``drop``.
        """
        self._check_open()
        conn = self._ro
        if conn is None or self._ro_generation != fork_generation():
            # A connection inherited through fork is dropped, never used or closed here.
            conn = self._ro = connect_readonly(self.path, immutable=self.immutable)
            self._ro_generation = fork_generation()
        if snapshot:
            now = time.monotonic()
            if now - self._snapshot_at > SNAPSHOT_SECONDS or not conn.in_transaction:
                if conn.in_transaction:
                    conn.execute("COMMIT")
                conn.execute("BEGIN")
                self._snapshot_at = now
                self.snapshot_serial += 1  # readers re-check their dataset's version
        elif conn.in_transaction:
            conn.execute("COMMIT")
        return conn

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Any]:
        """A write transaction; a database failure (read-only file, disk full, I/O
        error) is a :class:`CatalogError` naming the catalog, nothing half-written."""
        try:
            with self._writer().begin() as conn:
                yield conn
        except SQLAlchemyError as exc:
            raise catalog_error(str(self.path), exc) from None

    def _writer(self) -> Any:
        self._check_open()
        if self._engine is None:
            raise CatalogError(f"{self.path} was opened read-only")
        return self._engine

    def _check_open(self) -> None:
        if self.closed:
            raise CatalogError(f"catalog {self.path} is closed")

    def dataset_row(self, name: str) -> Any:
        """``(id, name, format, key_rule, grouping, options JSON, source JSON, created_at)``
        of a dataset; :class:`CatalogError` naming the known datasets when it is missing."""
        conn = self.reader_connection()
        row = conn.execute(
            f"SELECT {_DATASET_COLUMNS} FROM shardcat_datasets WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            known = [r[0] for r in conn.execute("SELECT name FROM shardcat_datasets ORDER BY name")]
            raise CatalogError(
                f"no dataset {name!r} in {self.path}"
                + (f" (it has: {', '.join(known)})" if known else " (it has no datasets yet)")
            )
        return row

    def _unused_name(self, base: str) -> str:
        """``base``, else ``base_2``, ``base_3``, ...: the first name no dataset has."""
        taken = {
            str(r[0]).lower()
            for r in self.reader_connection().execute("SELECT name FROM shardcat_datasets")
        }
        return schema.first_free(base, taken)

    def normalized_source(self, paths: PathsLike) -> list[str]:
        """The patterns as stored: absolute, or relative to the catalog when below it."""
        return [
            stored_path(os.path.abspath(os.path.expanduser(p)), self.directory)
            for p in as_patterns(paths)
        ]

    def find_dataset(
        self,
        paths: PathsLike,
        *,
        format: str | None = None,
        key: str | Keep | None = KEEP,
        grouping: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> str | None:
        """The dataset these paths open, or None (see :mod:`shardcat.catalog.reuse`).

        Without ``format`` (nor the other arguments): the dataset ingested from
        these patterns, else the one whose shards are exactly the files they match
        (another spelling of the same glob), whatever its rule. With ``format``
        (``"auto"``: detected from the first file), only a dataset with the rule
        that ``ingest`` would use with these arguments.
        """
        return self._choose(paths, resolve_paths(paths), format, key, grouping, options)[0]

    def _rule(
        self,
        files: Sequence[str],
        format: str | None,
        key: str | Keep | None,
        grouping: str | None,
        options: Mapping[str, Any] | None,
        fields: bool | None = None,
    ) -> reuse.Rule:
        """The rule ingest reads ``files`` with: the format (None or ``"auto"``:
        detected from the first file's bytes), the options detected from the first
        file and the options given."""
        fmt_name = detect_format(files[0]) if format in (None, "auto") else str(format)
        explicit: dict[str, Any] = {
            **({} if isinstance(key, Keep) else {"key": key}),
            **({} if fields is None else {"fields": fields}),
            **({} if grouping is None else {"grouping": grouping}),
            **(options or {}),
        }
        explicit.pop(DROPPED, None)  # bookkeeping, never an option given
        return reuse.Rule(fmt_name, get_format(fmt_name).detect_options(files[0]), explicit)

    def _choose(
        self,
        paths: PathsLike,
        files: Sequence[str],
        format: str | None,
        key: str | Keep | None,
        grouping: str | None,
        options: Mapping[str, Any] | None,
    ) -> tuple[str | None, Sequence[Any] | None]:
        any_rule = format is None and isinstance(key, Keep) and grouping is None and not options
        rule = None if any_rule or not files else self._rule(files, format, key, grouping, options)
        wanted = {stored_path(f, self.directory) for f in files}
        return reuse.choose(self.reader_connection(), self.normalized_source(paths), wanted, rule)

    # -- public API ------------------------------------------------------------

    def ingest(
        self,
        paths: PathsLike,
        dataset: str | None = None,
        *,
        format: str | None = None,
        key: str | Keep | None = KEEP,
        fields: bool | None = None,
        grouping: str | None = None,
        options: Mapping[str, Any] | None = None,
        workers: int | None = None,
        on_duplicate: str = "error",
        rescan: bool = False,
        lease: float = DEFAULT_LEASE,
        progress: Callable[[ShardOutcome, int], None] | None = None,
        provided: Mapping[str, ProvideEntries] | None = None,
    ) -> Reader:
        """Index the shards matched by ``paths`` into ``dataset``; returns its reader.

        ``paths``: a file, directory, glob or list of them; the dataset's shard
        set becomes exactly these files (new ones are indexed, changed ones
        re-indexed, missing ones dropped, unchanged ones skipped).
        ``dataset``: its name; without one, the dataset these files were
        ingested into with the same rule (format, key rule, grouping), else a
        new one, named after the files or, when another rule already reads them,
        after that dataset (``train_by_id``, ``train_tfd``: see
        :mod:`shardcat.catalog.reuse`). A new dataset copies the rows of shards
        another dataset holds with the same rule instead of reading them.
        ``format``: detected from the first file's bytes when None or ``"auto"``.
        ``key``: the feature holding each record's key (TFRecord; ``"key"``
        unless the dataset was ingested with another); None keys records by
        position. ``fields``: extract scalar fields for SQL (default: as the
        dataset was ingested, else True). Options left out keep the values the
        dataset was ingested with.
        ``grouping``: how tar members form samples. ``options``: further
        format options (they override the arguments above).
        ``on_duplicate``: ``error`` (default), or keep the ``first``/``last``
        record in position order. ``rescan``: re-index unchanged shards too.
        ``provided`` maps absolute shard paths to functions giving their
        entries instead of a scan (``catalog migrate`` hands in verified legacy
        indexes this way; see :data:`~shardcat.catalog.ingest.ProvideEntries`).
        ``progress(outcome, total_shards)`` is called after every shard this
        process indexed. Other processes ingesting the same dataset at the
        same time share the work; every shard is indexed once.
        Raises :class:`IngestError` naming each shard that failed (the others
        are committed).
        """
        from shardcat.readers.reader import Reader

        engine = self._writer()
        if on_duplicate not in DUPLICATE_POLICIES:
            raise CatalogError(
                f"on_duplicate must be one of {', '.join(DUPLICATE_POLICIES)}, not {on_duplicate!r}"
            )
        files = resolve_paths(paths)
        if not files:
            raise CatalogError(f"no files match {as_patterns(paths)}")
        # Precedence: detected from the first shard < stored with the dataset < given here.
        rule = self._rule(files, format, key, grouping, options, fields)
        fmt_name = rule.format
        fmt = get_format(fmt_name)
        name = dataset
        if name is None:
            # Without a name: the dataset of these files with this rule, else a new one
            # (never another path set's dataset, never one with another rule).
            name, other = reuse.choose(
                self.reader_connection(),
                self.normalized_source(paths),
                {stored_path(f, self.directory) for f in files},
                rule,
            )
            if name is None:
                base = (
                    default_dataset_name(files)
                    if other is None
                    else reuse.variant_name(other, rule)
                )
                name = self._unused_name(base)
        _check_name(name)
        source = self.normalized_source(paths)
        # A new dataset may take options that only all its shards tell (RecordIO: .idx
        # keys that collide across shards); read outside the write lock, once.
        known = (
            self.reader_connection()
            .execute("SELECT 1 FROM shardcat_datasets WHERE name = ?", (name,))
            .fetchone()
        )
        per_dataset = getattr(fmt, "detect_dataset_options", None)
        first = {} if known or per_dataset is None else per_dataset(files, rule.explicit)
        with self._transaction() as conn:
            d = schema.datasets
            row = conn.execute(select(d).where(d.c.name == name)).one_or_none()
            stored = first if row is None else json.loads(row.options)
            opts: dict[str, Any] = rule.options(stored)
            key_rule = fmt.key_rule(opts)
            if row is None:
                dataset_id = conn.execute(
                    d.insert().values(
                        name=name,
                        format=fmt_name,
                        key_rule=key_rule,
                        grouping=opts.get("grouping"),
                        # an empty DROPPED table: its counts are complete from the start
                        options=json.dumps({**opts, DROPPED: {}}),
                        source=json.dumps(source),
                        created_at=time.time(),
                    )
                ).inserted_primary_key[0]
                field_store.create_field_table(conn, dataset_id)
                field_store.create_view(conn, dataset_id, name)
                if provided is None and not rescan:  # rows another dataset already holds
                    reuse.seed(conn, dataset_id, name, opts, files, self.directory)
            else:
                dataset_id = row.id
                if (row.format, row.key_rule, row.grouping) != (
                    fmt_name,
                    key_rule,
                    opts.get("grouping"),
                ):
                    raise CatalogError(
                        f"dataset {name!r} holds {row.format} records keyed by "
                        f"{row.key_rule}, not {fmt_name} keyed by {key_rule}"
                        + (f" (grouping {opts.get('grouping')})" if opts.get("grouping") else "")
                        + ": ingest into "
                        f"another dataset or drop it first (catalog drop {name})"
                    )
                kept = {**opts, DROPPED: stored[DROPPED]} if DROPPED in stored else opts
                if (row.options, row.source) != (json.dumps(kept), json.dumps(source)):
                    conn.execute(
                        d.update()
                        .where(d.c.id == dataset_id)
                        .values(options=json.dumps(kept), source=json.dumps(source))
                    )
                if stored.get("fields", True) != opts.get("fields", True):
                    rescan = True  # every shard gains (or loses) its field rows
                    field_store.create_view(conn, dataset_id, name)
            sync_shards(conn, dataset_id, files, self.directory, rescan)
        job = IngestJob(
            str(self.path),
            self.directory,
            dataset_id,
            name,
            fmt_name,
            opts,
            on_duplicate,
            lease,
        )
        n_workers = workers if workers is not None else min(len(files), os.cpu_count() or 1)
        callback = None if progress is None else (lambda o: progress(o, len(files)))
        by_stored = (
            None
            if provided is None
            else {stored_path(p, self.directory): f for p, f in provided.items()}
        )
        try:
            outcomes = run_ingest(engine, job, max(1, n_workers), callback, by_stored)
        except SQLAlchemyError as exc:  # claims and commits on a catalog that cannot be written
            raise catalog_error(str(self.path), exc) from None
        self.reader_connection()  # end any read snapshot: see what was just committed
        raise_for_failures(outcomes)
        self.checkpoint(wait=False)  # a finished writer leaves the main file complete
        reader = Reader(self, name)
        reader.indexed_duplicates = sum(o.duplicates for o in outcomes)
        return reader

    def migrate(self, paths: PathsLike, **options: Any) -> MigrationReport:
        """Import the legacy index files found for ``paths`` (tfd-utils pickles,
        MXNet/DALI ``.idx``, DALI/vahidk ``tfrecord2idx`` files) into this catalog,
        verifying each shard first; returns the report. Directories are walked
        (``max_depth``, ``pattern``); each legacy index becomes one dataset.
        ``options``: those of :func:`shardcat.legacy.migrate` (``dataset``,
        ``dry_run``, ``remap``, ``fields``, ``key``, ``sample``, ``workers``,
        ``max_depth``, ``pattern``, ...)."""
        from shardcat.legacy import migrate

        return migrate(paths, catalog=self, **options)

    def datasets(self) -> list[DatasetInfo]:
        """Every dataset with its shard and record counts."""
        conn = self.reader_connection()
        rows = conn.execute(
            f"SELECT {_DATASET_COLUMNS} FROM shardcat_datasets ORDER BY name"
        ).fetchall()
        return [self._describe(row) for row in rows]

    def info(self, name: str) -> DatasetInfo:
        """One dataset as :meth:`datasets` describes it (:class:`CatalogError`
        naming the known datasets when it is missing)."""
        return self._describe(self.dataset_row(name))

    def _describe(self, row: Sequence[Any]) -> DatasetInfo:
        conn = self.reader_connection()
        states = dict(
            conn.execute(
                "SELECT state, count(*) FROM shardcat_shards WHERE dataset_id = ? GROUP BY state",
                (row[0],),
            ).fetchall()
        )
        n = conn.execute(
            "SELECT coalesce(sum(num_records), 0) FROM shardcat_shards "
            "WHERE dataset_id = ? AND state = 'ready'",
            (row[0],),
        ).fetchone()[0]
        cols = dict(
            conn.execute(
                "SELECT column_name, sql_type FROM shardcat_fields WHERE dataset_id = ? "
                "ORDER BY idx",
                (row[0],),
            ).fetchall()
        )
        return DatasetInfo(
            name=row[1],
            format=row[2],
            key_rule=row[3],
            grouping=row[4],
            options=json.loads(row[5]),
            source=json.loads(row[6]),
            created_at=row[7],
            shards=sum(states.values()),
            ready_shards=states.get("ready", 0),
            failed_shards=states.get("failed", 0),
            records=int(n),
            fields=cols,
        )

    def dataset(self, name: str, *, verify_crc: bool = False) -> Reader:
        """A reader over the dataset ``name`` (no re-indexing happens)."""
        from shardcat.readers.reader import Reader

        return Reader(self, name, verify_crc=verify_crc)

    def query(
        self,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        attach: Mapping[str, str | os.PathLike[str]] | None = None,
        timeout: float | None = DEFAULT_QUERY_TIMEOUT,
    ) -> QueryResult:
        """Run one read-only SQL statement; rows as a list of tuples (``.columns`` names them).

        Every dataset is a view named after it (``key``, ``position``,
        ``shard`` and its scalar fields). Statements that would write, attach
        or change settings are refused with :class:`CatalogError`, and so are
        functions other than SQLite's built-in scalar, aggregate, window,
        date/time, JSON and math ones (see ``ALLOWED_FUNCTIONS``).
        ``timeout``: seconds the statement may run (default 60; None: no
        limit) before it stops with :class:`CatalogError`; Ctrl-C stops it with
        ``KeyboardInterrupt``. ``attach`` maps schema names to other SQLite
        files (or TensorDB directories), attached read-only for this statement only, e.g.
        ``attach={"emb": "emb.db"}`` for ``... JOIN emb.rows e ON e.key = t.key``.
        """
        conn = self.reader_connection()
        with attached(conn, attach):
            return run_readonly(conn, sql, params, timeout=timeout)

    def verify(self, name: str, progress: Callable[[int, int], None] | None = None) -> list[Any]:
        """Re-read every record of ``name`` checking framing and checksums.

        Returns a list of :class:`CorruptRecordError` (one per bad record or
        stale shard); an empty list means every byte checked out.
        """
        with self.dataset(name) as reader:
            return reader.verify(progress)

    def drop(self, name: str) -> None:
        """Remove a dataset, its shards' rows and its view (files on disk are untouched)."""
        dataset_id = self.dataset_row(name)[0]
        with self._transaction() as conn:
            field_store.drop_dataset_objects(conn, dataset_id, name)
            # shards, records, members, seek points and field registry rows go with it
            # (ON DELETE CASCADE; the engine turns foreign keys on)
            conn.execute(delete(schema.datasets).where(schema.datasets.c.id == dataset_id))
        self.reader_connection()  # end any read snapshot
        self.checkpoint(wait=False)  # a finished writer leaves the main file complete

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
        if self._ro is not None and self._ro_generation == fork_generation():
            self.reader_connection()  # end this process's read snapshot: it pins the WAL
        try:
            conn = engine.raw_connection()
            try:
                return wal_checkpoint(conn.driver_connection, CHECKPOINT_BUSY_MS if wait else 0)
            finally:
                conn.close()
        except (DBAPIError, sqlite3.Error) as exc:
            raise CatalogError(f"cannot checkpoint {self.path}: {exc}") from None

    def close(self) -> None:
        """Close this process's connections (idempotent)."""
        if self.closed:
            return
        if self._ro is not None and self._ro_generation == fork_generation():
            self._ro.close()
        self._ro = None
        if self._engine is not None:
            self._engine.dispose()
        self.closed = True

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Catalog({str(self.path)!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"path": str(self.path), "readonly": self.readonly, "immutable": self.immutable}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], readonly=state["readonly"], immutable=state["immutable"])  # type: ignore[misc]
