"""Whole tasks as the ``catalog`` commands run them, each one call that returns a
result to print: ingest with a summary (:func:`ingest`), convert tar archives
(:func:`convert`), verify with the record count (:func:`verify`), migrate whatever the paths are
(:func:`migrate_any`: tensorblob directories converted in place, the rest legacy
indexes imported) and upgrade a catalog's schema (:func:`upgrade_catalog`).

The commands only parse, call one of these and print; nothing here prints.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardcat.catalog.backend import backend_for
from shardcat.catalog.bad_records import SetAside
from shardcat.convert import ConvertResult, convert_tars, tar_inputs
from shardcat.errors import CatalogError, CorruptRecordError
from shardcat.facade import opener
from shardcat.facade.catalog import Catalog, discard_if_empty
from shardcat.facade.migrate import MigrateOptions, migrate
from shardcat.facade.options import IngestOptions, Progress
from shardcat.migrations.legacy.report import MigrationReport
from shardcat.paths import PathsLike, as_patterns
from shardcat.sources.remote import configure, is_url, protocol_of
from shardcat.storage import convert_tensorblob, is_tensorblob_dir

__all__ = [
    "Converted",
    "IngestSummary",
    "MigrateOutcome",
    "Upgraded",
    "VerifyResult",
    "convert",
    "ingest",
    "migrate_any",
    "upgrade_catalog",
    "verify",
]


# -- ingest ------------------------------------------------------------------------


@dataclass(frozen=True)
class IngestSummary:
    """What an ingest left: the dataset's name, its records and shards in all, the
    records this call indexed, the records dropped as duplicate keys, and the bad
    records its shards set aside (``on_bad_record="skip"``)."""

    dataset: str
    records: int
    shards: int
    indexed_now: int
    duplicates_dropped: int
    bad_records: int = 0


def ingest(
    catalog: str | os.PathLike[str],
    paths: PathsLike,
    dataset: str | None,
    opts: IngestOptions,
    *,
    progress: Progress | None = None,
    make_dirs: bool = False,
) -> IngestSummary:
    """Ingest ``paths`` into the catalog file ``catalog`` (created when missing; its
    directory too with ``make_dirs``),
    as :meth:`Catalog.ingest_with`; returns an :class:`IngestSummary`.

    No catalog is left behind when no file matches ``paths`` (:class:`CatalogError`
    ``no files match ...``: the paths are resolved once, by the ingest) or nothing
    could be indexed. ``progress(outcome, total_shards)`` as for
    :meth:`Catalog.ingest`; :class:`IngestError` names the shards that failed.
    """
    indexed = 0

    def count(outcome: Any, total: int) -> None:
        nonlocal indexed
        indexed += outcome.records
        if progress is not None:
            progress(outcome, total)

    file = backend_for(catalog).local_file
    new = file is not None and not file.exists()
    try:
        with (
            Catalog(catalog, make_dirs=make_dirs) as cat,
            cat.ingest_with(paths, dataset, opts, progress=count) as reader,
        ):
            stats = reader.get_stats()
            dropped = reader.indexed_duplicates
    except BaseException:
        if new and file is not None:  # a failed first ingest leaves no catalog behind
            discard_if_empty(file)
        raise
    return IngestSummary(
        stats["dataset"],
        stats["total_records"],
        stats["total_files"],
        indexed,
        dropped,
        stats["bad_records"],
    )


# -- verify ------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyResult:
    """What :func:`verify` found: the records checked, one error per bad one (``key``
    naming it), the records an ingest set aside (not checked: not records), or
    ``damage``: what SQLite's quick_check found damaged in the catalog file itself
    (then no record was read); ``deleted``: the bad records soft-deleted."""

    records: int
    problems: list[CorruptRecordError]
    set_aside: list[SetAside] = field(default_factory=list)
    damage: list[str] = field(default_factory=list)
    deleted: int = 0


def verify(
    catalog: Catalog,
    dataset: str,
    progress: Progress | None = None,
    *,
    delete_bad: bool = False,
) -> VerifyResult:
    """Re-read every record of ``dataset`` (see :meth:`Catalog.verify`, also for
    ``delete_bad``); returns how many records were checked with the problems.
    ``progress(done, total)``. The catalog file is checked first (:meth:`Store.damage`)."""
    damage = catalog.store.damage()
    if damage:
        return VerifyResult(0, [], damage=damage)
    checked = 0

    def count(done: Any, total: int) -> None:
        nonlocal checked
        checked = total
        if progress is not None:
            progress(done, total)

    problems = catalog.verify(dataset, count, delete_bad=delete_bad)
    deleted = len({p.key for p in problems if p.key is not None}) if delete_bad else 0
    return VerifyResult(int(checked), list(problems), catalog.bad_records(dataset), deleted=deleted)


# -- convert -----------------------------------------------------------------------


def convert(
    inputs: PathsLike,
    output_dir: str | os.PathLike[str] | None = None,
    *,
    delete: bool = False,
    workers: int | None = None,
    grouping: str = "tfd",
    progress: Progress | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> list[ConvertResult]:
    """Convert the tar archives ``inputs`` name (files, directories, globs: see
    :func:`shardcat.convert.tar_inputs`) to TFRecords with
    :func:`shardcat.convert.convert_tars`; ``workers`` None: one per CPU.
    ``progress(result, total_archives)`` after each archive. :class:`CatalogError`
    when no archive is found."""
    for pattern in as_patterns(inputs):  # given here: over those of an earlier call
        if storage_options and is_url(pattern):
            configure(protocol_of(pattern), **storage_options)
    sources = tar_inputs(inputs, storage_options)
    if not sources:
        raise CatalogError(f"no tar archives found for {' '.join(as_patterns(inputs))}")
    return convert_tars(
        sources,
        output_dir,
        delete=delete,
        workers=(os.cpu_count() or 1) if workers is None else workers,
        grouping=grouping,
        progress=progress,
        storage_options=storage_options,
    )


# -- migrate -----------------------------------------------------------------------


@dataclass(frozen=True)
class Converted:
    """A tensorblob directory converted in place (``kind`` and ``rows`` None in a dry
    run, where nothing is converted)."""

    path: str
    kind: str | None
    rows: int | None


@dataclass(frozen=True)
class MigrateOutcome:
    """What :func:`migrate_any` did: the tensorblob directories converted (in the
    order given), and the report of the legacy import of the other paths (None
    when every path was a tensorblob directory)."""

    converted: list[Converted] = field(default_factory=list)
    report: MigrationReport | None = None

    @property
    def failed(self) -> bool:
        return self.report is not None and self.report.failed


def migrate_any(
    paths: Sequence[str],
    opts: MigrateOptions | None = None,
    *,
    catalog: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
) -> MigrateOutcome:
    """Migrate ``paths`` whatever they are: each directory written by the tensorblob
    package is converted to a shardcat TensorBlob/TensorDB in place (no block
    copied; a dry run only lists it), every other path goes to the legacy index
    import (:func:`shardcat.facade.migrate.migrate` with ``opts``, ``catalog``
    and ``progress``)."""
    if not paths:
        raise CatalogError("give the directories or index files to migrate")
    opts = opts or MigrateOptions()
    blobs = [p for p in paths if is_tensorblob_dir(p)]
    converted = []
    for directory in blobs:
        if opts.dry_run:
            converted.append(Converted(directory, None, None))
        else:
            kind, rows = convert_tensorblob(directory)
            converted.append(Converted(directory, kind, rows))
    rest = [p for p in paths if p not in blobs]
    if not rest:
        return MigrateOutcome(converted)
    report = migrate(rest, opts, catalog=catalog, open_catalog=Catalog, progress=progress)
    return MigrateOutcome(converted, report)


@dataclass(frozen=True)
class Upgraded:
    """A catalog's schema upgrade: the file (or server URL without its password), the
    version found and the version now."""

    path: Path | str
    found: int
    now: int


def upgrade_catalog(path: str | os.PathLike[str] | None) -> Upgraded:
    """Upgrade the schema of the catalog at ``path`` (None: where every command
    looks, see :func:`~shardcat.catalog.engine.locate`) to this library's version."""
    backend = backend_for(path)
    found, now = opener.upgrade(backend.where)
    return Upgraded(backend.local_file or backend.display, found, now)
