"""The facade: :class:`Catalog`, the one place that combines the store, the formats
and the sources.

A :class:`Catalog` holds a store (:class:`~shardcat.catalog.store.Store`, its
``store``: the SQLite file or server database, datasets, read connections,
ingest sessions) and adds what needs formats and files: ``ingest`` (resolve the
paths, detect the format, sync the shard rows, scan the pending shards in
workers and commit them through the store's ingest session:
:mod:`shardcat.facade.ingest`), ``dataset()`` (a
:class:`~shardcat.readers.reader.Reader` on a read-only handle of the store),
``verify`` and ``migrate`` (legacy index files: :mod:`shardcat.migrations.legacy`).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from shardcat.catalog import columnar, reuse
from shardcat.catalog import snapshot as snapshots
from shardcat.catalog.bad_records import SetAside, bad_records_of
from shardcat.catalog.claims import DEFAULT_LEASE
from shardcat.catalog.commit import IngestJob, catalog_error
from shardcat.catalog.datasets import DatasetInfo, DatasetPlan
from shardcat.catalog.deletes import Pick
from shardcat.catalog.handle import ReadHandle
from shardcat.catalog.processes import stopping_on_signals
from shardcat.catalog.query import (
    DEFAULT_QUERY_MEMORY,
    DEFAULT_QUERY_TIMEOUT,
    QueryResult,
    collect,
)
from shardcat.catalog.store import Store
from shardcat.catalog.sync import DROPPED, absolute_path, stored_path
from shardcat.errors import CatalogError
from shardcat.facade import dedup as dedups
from shardcat.facade import migrate as legacy_import
from shardcat.facade import opener
from shardcat.facade.dataset_options import detect_options, field_types
from shardcat.facade.ingest import ProvideEntries, Work, judge_files, raise_for_failures, run_ingest
from shardcat.facade.options import KEEP, IngestOptions, Keep, Progress
from shardcat.facade.ray_ingest import RayEngine
from shardcat.facade.remote_detect import dataset_wide_options, remote_rule, storage_options_kept
from shardcat.facade.tags import Tags
from shardcat.formats.registry import detect_format, get_format
from shardcat.migrations.legacy.report import MigrationReport
from shardcat.paths import PathsLike, as_patterns, default_dataset_name, resolve_paths
from shardcat.readers.reader import Reader
from shardcat.readers.view import STORAGE_OPTIONS
from shardcat.sources.remote import is_url
from shardcat.storage.meta import sql_file

__all__ = ["Catalog", "discard_if_empty", "migrate", "rebuild"]

Params = Sequence[Any] | Mapping[str, Any] | None
Keys = Sequence[str] | None


class Catalog(Tags):
    """One catalog: datasets, shards, keys and byte offsets, and what to do with
    them: :meth:`ingest`, :meth:`dataset`, :meth:`query`, :meth:`datasets`, :meth:`info`,
    :meth:`drop`, :meth:`delete`, :meth:`undelete`, :meth:`dedup`, :meth:`tag`, :meth:`verify`,
    :meth:`migrate`, :meth:`snapshot`, :meth:`checkpoint`, :meth:`close` (a context manager).

    ``Catalog(path, readonly=False, immutable=False)`` opens its store
    (:class:`~shardcat.catalog.store.Store`, kept as :attr:`store`) through the
    opener (:mod:`shardcat.facade.opener`, as every ``catalog`` command does):
    created or upgraded when needed; without a path ``$SHARDCAT_CATALOG``, then
    ``./shardcat.sqlite``; a ``postgresql://`` URL opens a server catalog;
    ``readonly`` never writes, ``immutable`` takes no locks at all.
    ``create=False``: a missing file is refused instead of created;
    ``make_dirs=False``: so is a missing directory. Errors opening it are
    :class:`CatalogError` naming it (and what to do, as its ``hint``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        readonly: bool = False,
        immutable: bool = False,
        create: bool = True,
        make_dirs: bool = True,
    ) -> None:
        def store(where: Path | str, mode: opener.Mode) -> Store:
            return Store(where, readonly=mode.readonly, immutable=mode.immutable)

        mode = opener.Mode.of(readonly=readonly, immutable=immutable)
        #: the store: SQL and nothing else (what the CLI and tools below the facade use)
        self.store = opener.open_with(store, path, mode, create=create, make_dirs=make_dirs)

    @property
    def path(self) -> Path | str:
        """The catalog's name in messages: a file's path, a URL without its password."""
        return self.store.path

    @property
    def location(self) -> str:
        """What reopens this catalog: a file's path, a server's whole URL."""
        return self.store.location

    @property
    def readonly(self) -> bool:
        return self.store.readonly

    @property
    def immutable(self) -> bool:
        return self.store.immutable

    @property
    def closed(self) -> bool:
        return self.store.closed

    def _normalized_source(self, paths: PathsLike) -> list[str]:
        """The patterns as stored: absolute, or relative to the catalog when below it."""
        directory = self.store.directory
        return [
            p if is_url(p) else stored_path(os.path.abspath(os.path.expanduser(p)), directory)
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
        opts = IngestOptions(format=format, key=key, grouping=grouping, options=dict(options or {}))
        return self._choose(paths, resolve_paths(paths), opts)[0]

    def _rule(
        self,
        files: Sequence[str],
        opts: IngestOptions,
        detected: Mapping[str, Any] | None = None,
    ) -> reuse.Rule:
        """The rule ingest reads ``files`` with: the format (None or ``"auto"``:
        detected from the first file's bytes), the options detected from the first
        file (``detected``: read off it already, nothing is read) and the options
        given."""
        explicit = opts.explicit()
        explicit.pop(DROPPED, None)  # bookkeeping, never an option given
        if detected is not None and opts.format not in (None, "auto"):
            name = str(opts.format)
            return reuse.Rule(name, dict(detected), explicit, get_format(name).key_rule)
        if is_url(files[0]):  # detected from a local copy of the object's first record
            name, found = remote_rule(files[0], opts.options.get(STORAGE_OPTIONS), opts.format)
            return reuse.Rule(name, found, explicit, get_format(name).key_rule)
        name = detect_format(files[0]) if opts.format in (None, "auto") else str(opts.format)
        fmt = get_format(name)
        return reuse.Rule(name, detect_options(fmt, files[0]), explicit, fmt.key_rule)

    def _choose(
        self, paths: PathsLike, files: Sequence[str], opts: IngestOptions
    ) -> tuple[str | None, Sequence[Any] | None]:
        any_rule = (
            opts.format is None
            and isinstance(opts.key, Keep)
            and opts.grouping is None
            and not opts.options
        )
        rule = None if any_rule or not files else self._rule(files, opts)
        wanted = {stored_path(f, self.store.directory) for f in files}
        conn = self.store.reader_connection()
        return reuse.choose(conn, self._normalized_source(paths), wanted, rule)

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
        on_bad_record: str = "raise",
        wait_timeout: float | None = None,
        progress: Progress | None = None,
        provided: Mapping[str, ProvideEntries] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        engine: str = "local",
        ray_address: str | None = None,
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
        ``on_bad_record``: ``raise`` (default: a damaged record fails its shard,
        whose other records are then not indexed) or ``skip``: every good record
        of a damaged (uncompressed) shard is indexed, each bad one set aside
        (:meth:`bad_records`); the scan resynchronises after damaged framing.
        These are one :class:`~shardcat.facade.options.IngestOptions`
        (:meth:`ingest_with` takes it as it is).
        ``provided`` maps absolute shard paths to functions giving their
        entries instead of a scan (``catalog migrate`` hands in verified legacy
        indexes this way; see :data:`~shardcat.facade.ingest.ProvideEntries`).
        ``progress(outcome, total_shards)`` is called after every shard this
        process indexed. Other processes ingesting the same dataset at the
        same time share the work; every shard is indexed once. A wait for
        shards that other live processes hold is named in a
        :class:`~shardcat.ShardcatWarning` and ends after ``wait_timeout``
        seconds with a :class:`CatalogError` (None: no limit).
        SIGTERM and SIGHUP (when this program leaves them at their default) stop
        the ingest as Ctrl-C does: the workers end, their shards are given back,
        and the process then exits with 128 + the signal number (143, 129).
        ``storage_options``: for URLs (``s3://``, ``https://``...: see
        :mod:`shardcat.sources.remote`), the fsspec options (``endpoint_url``,
        ``anon``...); stored with the dataset without secrets (keys, tokens,
        passwords), which this process keeps in memory only. ``engine="ray"``:
        Ray tasks at ``ray_address`` (:mod:`shardcat.facade.ray_ingest`). Raises
        :class:`IngestError` naming each shard that failed (the others committed).
        """
        if storage_options:
            options = {**(options or {}), STORAGE_OPTIONS: dict(storage_options)}
        opts = IngestOptions(
            format=format,
            key=key,
            fields=fields,
            grouping=grouping,
            options=dict(options or {}),
            workers=workers,
            on_duplicate=on_duplicate,
            rescan=rescan,
            lease=lease,
            on_bad_record=on_bad_record,
            wait_timeout=wait_timeout,
            engine=engine,
            ray_address=ray_address,
        )
        return self.ingest_with(paths, dataset, opts, progress=progress, provided=provided)

    def ingest_with(
        self,
        paths: PathsLike,
        dataset: str | None,
        opts: IngestOptions,
        *,
        progress: Progress | None = None,
        provided: Mapping[str, ProvideEntries] | None = None,
        detected: Mapping[str, Any] | None = None,
    ) -> Reader:
        """:meth:`ingest` with its options as one :class:`IngestOptions`.
        ``detected``: the options already read off the first shard (``migrate``
        has them), so none of its bytes are read again; used with ``opts.format``."""
        opts = storage_options_kept(paths, opts)
        self.store.check_writable()  # before any file is read
        remote_options = opts.options.get(STORAGE_OPTIONS)
        files = resolve_paths(paths, remote_options)
        if not files:
            raise CatalogError(f"no files match {as_patterns(paths)}")
        # Precedence: detected from the first shard < stored with the dataset < given here.
        rule = self._rule(files, opts, detected)
        name = dataset or self._name_for(paths, files, rule)
        new = not self.store.has_dataset(name)
        stats, same_file = judge_files(files, self.store.directory, remote_options)
        plan = DatasetPlan(
            name,
            rule,
            self._normalized_source(paths),
            stats,
            same_file,
            first=dataset_wide_options(get_format(rule.format), files, rule, remote_options)
            if new
            else {},
            rescan=opts.rescan,
            seed=provided is None and not opts.rescan,
        )
        job = self._job(plan, opts)
        workers = opts.workers if opts.workers is not None else min(len(files), os.cpu_count() or 1)
        work = Work(
            max(1, workers),
            None if progress is None else (lambda o: progress(o, len(files))),
            None
            if provided is None
            else {stored_path(p, self.store.directory): f for p, f in provided.items()},
            opts.wait_timeout,
            RayEngine(opts.ray_address) if opts.engine == "ray" else None,
        )
        try:
            with stopping_on_signals(), self.store.ingest_session(job) as session:
                outcomes = run_ingest(session, work)
        except SQLAlchemyError as exc:  # claims and commits on a catalog that cannot be written
            raise catalog_error(str(self.path), exc) from None
        self.store.reader_connection()  # end any read snapshot: see what was just committed
        if new and any(o.error for o in outcomes) and not self.info(name).ready_shards:
            self.drop(name)  # a first ingest that indexed nothing leaves no empty dataset
        raise_for_failures(outcomes)
        self.checkpoint(wait=False)  # a finished writer leaves the main file complete
        reader = self._reader(name)
        reader.indexed_duplicates = sum(o.duplicates for o in outcomes)
        return reader

    def _name_for(self, paths: PathsLike, files: Sequence[str], rule: reuse.Rule) -> str:
        """Without a dataset name: the dataset of these files with this rule, else a new
        one (never another path set's dataset, never one with another rule)."""
        wanted = {stored_path(f, self.store.directory) for f in files}
        conn = self.store.reader_connection()
        name, other = reuse.choose(conn, self._normalized_source(paths), wanted, rule)
        if name is not None:
            return name
        base = default_dataset_name(files) if other is None else reuse.variant_name(other, rule)
        return self.store.unused_name(base)

    def _job(self, plan: DatasetPlan, opts: IngestOptions) -> IngestJob:
        """Sync the dataset's rows to ``plan`` (one write transaction); the job its
        indexing processes are given."""
        dataset_id, dataset_options, key_rule = self.store.ensure_dataset(plan)
        fmt = get_format(plan.rule.format)
        return IngestJob(
            catalog=self.store.location,
            catalog_dir=self.store.directory,
            dataset_id=dataset_id,
            dataset_name=plan.name,
            format=plan.rule.format,
            options=dataset_options,
            key_rule=key_rule,
            field_types=field_types(fmt, dataset_options),
            on_duplicate=opts.on_duplicate,
            lease=opts.lease,
            one_range=fmt.ONE_RANGE,
            on_bad_record=opts.on_bad_record,
        )

    def migrate(
        self, paths: PathsLike, *, progress: Progress | None = None, **options: Any
    ) -> MigrationReport:
        """Import the legacy index files found for ``paths`` (tfd-utils pickles,
        MXNet/DALI ``.idx``, DALI/vahidk ``tfrecord2idx`` files) into this catalog,
        verifying each shard first; returns the report. Directories are walked
        (``max_depth``, ``pattern``); each legacy index becomes one dataset.
        ``options``: the fields of :class:`~shardcat.facade.migrate.MigrateOptions`
        (``dataset``, ``dry_run``, ``remap``, ``fields``, ``key``, ``sample``,
        ``workers``, ``max_depth``, ``pattern``, ...); ``progress(step, total)``
        as for :func:`shardcat.facade.migrate.migrate`."""
        opts = legacy_import.MigrateOptions(**options)
        return legacy_import.migrate(
            paths, opts, catalog=self, open_catalog=type(self), progress=progress
        )

    def dataset(self, name: str, *, verify: bool = True, verify_crc: bool | None = None) -> Reader:
        """A reader over the dataset ``name`` (no re-indexing happens). Every read is
        checked against the catalog; ``verify=False`` trusts the bytes (``verify_crc``
        is its older name)."""
        return self._reader(name, verify=verify, verify_crc=verify_crc)

    def _reader(self, name: str, **options: Any) -> Reader:
        """A reader of ``name`` on a read-only handle of this catalog's store, re-indexed
        by :func:`rebuild`."""
        return Reader(ReadHandle(self.store), name, reindex=rebuild, **options)

    def query(
        self,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        attach: Mapping[str, str | os.PathLike[str]] | None = None,
        timeout: float | None = DEFAULT_QUERY_TIMEOUT,
        memory: int | None = DEFAULT_QUERY_MEMORY,
        engine: str = "sqlite",
    ) -> QueryResult:
        """Run one read-only SQL statement; rows as a list of tuples (``.columns`` names them).

        Every dataset is a view named after it (``key``, ``position``,
        ``shard`` and its scalar fields). Statements that would write, attach
        or change settings are refused with :class:`CatalogError`, and so are
        functions other than SQLite's built-in scalar, aggregate, window,
        date/time, JSON and math ones (see ``ALLOWED_FUNCTIONS``).
        ``timeout``: seconds the statement may run (default 60; None: no
        limit) before it stops with :class:`CatalogError`; Ctrl-C stops it with
        ``KeyboardInterrupt``. ``memory``: bytes the rows may hold (default
        256 MiB; None: no limit), past which it stops with :class:`CatalogError`
        (:meth:`query_rows` streams rows instead). ``attach`` maps schema names to
        other SQLite files (or TensorDB directories), attached read-only for this
        statement only, e.g. ``attach={"emb": "emb.db"}`` for ``... JOIN emb.rows e
        ON e.key = t.key``. ``engine="duckdb"`` runs the statement with DuckDB over
        a columnar mirror of the datasets' views, rebuilt when the catalog changed
        (see :mod:`shardcat.catalog.columnar`; DuckDB's SQL, no ``attach``).
        """
        with self.query_rows(
            sql, params, attach=attach, timeout=timeout, memory=memory, engine=engine
        ) as (columns, rows):
            return QueryResult(collect(rows, memory), columns)

    @contextlib.contextmanager
    def query_rows(
        self,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        attach: Mapping[str, str | os.PathLike[str]] | None = None,
        timeout: float | None = DEFAULT_QUERY_TIMEOUT,
        memory: int | None = DEFAULT_QUERY_MEMORY,
        engine: str = "sqlite",
    ) -> Iterator[tuple[list[str], Iterator[tuple[Any, ...]]]]:
        """:meth:`query`, streamed: ``with cat.query_rows(sql) as (columns, rows):``
        iterates the rows as they are fetched, holding one at a time (``memory``
        then bounds any one value)."""
        if columnar.wants_duckdb(engine):
            if attach:
                raise CatalogError("attach= is for engine='sqlite'")
            store = self.store
            with columnar.streamed(store, sql, params, timeout=timeout, memory=memory) as result:
                yield result
            return
        files = None if attach is None else {k: sql_file(v) for k, v in attach.items()}
        with self.store.query_rows(
            sql, params, attach=files, timeout=timeout, memory=memory
        ) as result:
            yield result

    def snapshot(
        self,
        datasets: str | Sequence[str],
        path: str | os.PathLike[str],
        *,
        overwrite: bool = False,
    ) -> snapshots.SnapshotResult:
        """Write a self-contained SQLite catalog of ``datasets`` to ``path``, for readers
        opening it with ``Catalog(path, immutable=True)`` on any number of hosts.

        Atomic (a temporary file beside ``path``, renamed over it when complete);
        shard paths valid where it lies (relative to it when below its directory);
        shards never indexed (pending, failed) are left out and counted in the
        result. An existing ``path`` is refused unless ``overwrite``. See
        :mod:`shardcat.catalog.snapshot`."""
        names = [datasets] if isinstance(datasets, str) else list(datasets)
        return snapshots.take(self.store, names, path, overwrite=overwrite)

    def snapshot_info(self) -> snapshots.Provenance | None:
        """Which catalog this snapshot was taken of and when (None: not a snapshot)."""
        return snapshots.provenance(self.store.reader_connection())

    def bad_records(self, name: str) -> list[SetAside]:
        """The records of dataset ``name``'s shards that an ingest with
        ``on_bad_record="skip"`` set aside (by shard, then byte offset): each a
        :class:`~shardcat.catalog.bad_records.SetAside` (``shard``, the file's path;
        ``offset``, ``length``, ``reason``, ``key``). They are not records of the
        dataset: no key, position or sampler reaches them. A good re-index of
        their shard clears them."""
        dataset_id = self.store.dataset_row(name).id
        return [
            replace(found, shard=absolute_path(found.shard, self.store.directory))
            for found in bad_records_of(self.store.reader_connection(), dataset_id)
        ]

    def verify(
        self, name: str, progress: Progress | None = None, *, delete_bad: bool = False
    ) -> list[Any]:
        """Re-read every live record of ``name`` (framing, checksums, the catalog's check
        of each): one :class:`CorruptRecordError` per bad record or stale shard (``key``
        naming it); none when every byte checked out. Records set aside at ingest or
        soft-deleted are not re-read; ``delete_bad`` soft-deletes the bad ones."""
        if delete_bad:  # refused before any read: a read-only catalog, keys by position
            self.delete(name, keys=[])
        with self.dataset(name) as reader:
            problems = reader.verify(progress)
        if delete_bad:
            self.delete(name, keys=[p.key for p in problems if p.key is not None])
        return problems

    def dedup(
        self,
        dataset: str,
        across: Sequence[str] = (),
        *,
        mark: bool = False,
        progress: dedups.DedupProgress | None = None,
    ) -> dedups.DedupReport:
        """Exact duplicate records of ``dataset`` (and with the ``across`` datasets); ``mark``
        soft-deletes all but the first of each: see :mod:`shardcat.facade.dedup`."""
        return dedups.dedup(self, [dataset, *across], mark=mark, progress=progress)

    # -- the store's, as they are -------------------------------------------------

    def datasets(self) -> list[DatasetInfo]:
        """Every dataset with its shard and record counts."""
        return self.store.datasets()

    def info(self, name: str) -> DatasetInfo:
        """One dataset as :meth:`datasets` describes it (:class:`CatalogError`
        naming the known datasets when it is missing)."""
        return self.store.info(name)

    def drop(self, name: str) -> None:
        """Remove a dataset, its shards' rows and its view (files on disk are untouched)."""
        self.store.drop(name)

    def delete(
        self, dataset: str, where: str | None = None, params: Params = None, *, keys: Keys = None
    ) -> int:
        """Soft-delete the records of ``dataset`` matching ``where`` (SQL over its view,
        ``?`` placeholders with ``params``) and/or ``keys``, without touching shards:
        readers raise ``KeyError`` for them and leave them out of ``len``, positions
        and iteration; samplers and the SQL view skip them; a re-ingest keeps them
        deleted. Returns how many were newly deleted."""
        return self.store.mark_deleted(dataset, Pick(where, params, keys), deleted=True)

    def undelete(
        self, dataset: str, where: str | None = None, params: Params = None, *, keys: Keys = None
    ) -> int:
        """Restore soft-deleted records of ``dataset`` (``where`` over every record,
        deleted or not, and/or ``keys``; neither: all); returns how many."""
        return self.store.mark_deleted(dataset, Pick(where, params, keys), deleted=False)

    def create_index(self, dataset: str, field: str) -> bool:
        """Index the SQL field ``field`` of ``dataset`` (see
        :meth:`Store.create_index <shardcat.catalog.store.Store.create_index>`);
        False when it was indexed already."""
        return self.store.create_index(dataset, field)

    def drop_index(self, dataset: str, field: str) -> bool:
        """Drop the index :meth:`create_index` made; False when the field had none."""
        return self.store.drop_index(dataset, field)

    def checkpoint(self, *, wait: bool = True) -> bool:
        """Copy every commit from the ``-wal`` file back into the main file; True when
        the main file now holds every commit (see
        :meth:`Store.checkpoint <shardcat.catalog.store.Store.checkpoint>`)."""
        return self.store.checkpoint(wait=wait)

    def close(self) -> None:
        """Close this process's connections (idempotent)."""
        self.store.close()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"

    def __reduce__(self) -> tuple[Any, ...]:  # pickled as where and how to reopen it
        reopen = functools.partial(type(self), readonly=self.readonly, immutable=self.immutable)
        return (reopen, (self.location,))


def rebuild(handle: ReadHandle, dataset: str) -> None:
    """Re-index every shard of ``dataset`` from its source patterns, with the format
    and options it was ingested with (``Reader.rebuild_index``): an ingest with
    ``rescan=True`` through a catalog opened as the reader's handle was."""
    row = handle.dataset_row(dataset)
    options = {k: v for k, v in row.options.items() if k != DROPPED}
    with Catalog(handle.location, readonly=handle.readonly, immutable=handle.immutable) as cat:
        sources = [absolute_path(p, cat.store.directory) for p in row.source]
        cat.ingest(sources, dataset, format=row.format, options=options, rescan=True).close()


def discard_if_empty(path: Path) -> None:
    """Remove the SQLite catalog ``path`` (a file this process created) when no
    dataset went into it, as after a failed first ingest. Left alone while another
    process has it open (its ``-wal`` file is still there once this process closed it)."""
    if not path.exists() or Path(f"{path}-wal").exists():
        return
    with Catalog(path, readonly=True) as cat:
        if cat.datasets():
            return
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def migrate(
    paths: PathsLike,
    *,
    catalog: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    **options: Any,
) -> MigrationReport:
    """Import the legacy index files found for ``paths`` into the catalog at
    ``catalog`` (default: the one readers of the shards use, ``shardcat.sqlite``
    beside them, per legacy index); ``options`` and ``progress`` as for
    :meth:`Catalog.migrate`."""
    opts = legacy_import.MigrateOptions(**options)
    return legacy_import.migrate(
        paths, opts, catalog=catalog, open_catalog=Catalog, progress=progress
    )
