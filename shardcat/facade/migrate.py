"""``migrate``: legacy indexes into the catalog, each shard verified before it is
committed (see :mod:`shardcat.migrations.legacy` for what, :mod:`.plans` for which dataset,
:mod:`.verify` for the checks).

Verified entries go through the ingest's own claim and commit
(:meth:`Catalog.ingest` with ``provided=``): same transaction, duplicate
rules and positions, so the dataset equals one ingested from scratch with
``fields=False`` (keys, offsets, lengths, members, positions, view).

**SQL fields.** Legacy indexes never held them, and filling them means parsing
every record, which is what a fresh ingest costs. So a new dataset is imported
without them (recorded with ``fields=False``; later runs and readers keep
that) and the report gives the command that fills them: the same migration
with ``fields=True`` (``--fields``), which re-indexes every shard from its
data (CRC-checked, in parallel, shards imported without fields included) and
records ``fields=True``. A dataset that already has fields keeps getting
them.

**RecordIO keys.** MXNet ``.idx`` files of one shard set whose keys collide
(every file numbered from 0, as ``im2rec``, ``rec2idx`` and
``RecordIOWriter`` do) make a dataset keyed by position, each record's
``.idx`` key kept in SQL column ``idx_key`` (filled with the SQL fields); the
report's ``notes`` say so. Nothing is dropped.

**Where it goes.** The catalog is ``catalog`` if given, else the one a reader
would use (``$SHARDCAT_CATALOG``, else ``shardcat.sqlite`` beside the shards:
each dataset's own directory when a tree is walked).
"""

from __future__ import annotations

import contextlib
import gc
import os
import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardcat.catalog.backend import backend_for
from shardcat.catalog.claims import CLAIM_LOST
from shardcat.catalog.engine import locate
from shardcat.catalog.store import Store
from shardcat.catalog.sync import absolute_path, stored_path
from shardcat.errors import CatalogError, IngestError, MissingShardError
from shardcat.facade.dataset_options import detect_options
from shardcat.facade.ingest import ProvideEntries, ShardOutcome
from shardcat.facade.options import IngestOptions, Progress
from shardcat.facade.remote_detect import SNIFF_HEAD, SNIFF_REMOTE, head_copy
from shardcat.formats import mxnet_idx
from shardcat.formats.base import Columns, Entry, Mismatch, ShardScan
from shardcat.formats.registry import SNIFF_BYTES, get_format
from shardcat.migrations.legacy.index import TFRECORD_FRAME, ReaderFiles, discover
from shardcat.migrations.legacy.plans import Plan, make_plans, source_of
from shardcat.migrations.legacy.remote import discover_remote
from shardcat.migrations.legacy.report import DatasetReport, MigrationReport, ShardReport
from shardcat.migrations.legacy.verify import DEFAULT_SAMPLE, infer_key, verify_shard
from shardcat.paths import PathsLike, as_patterns, resolve_paths
from shardcat.readers.view import STORAGE_OPTIONS
from shardcat.sources.remote import configure, is_url, listed_info, protocol_of, remote_info

__all__ = ["MigrateOptions", "MigrationStep", "migrate", "migrate_for_reader"]

# Opens a catalog by path (shardcat.Catalog): ``open_catalog(path, readonly=...)``.
OpenCatalog = Callable[..., Any]


@dataclass(frozen=True)
class MigrationStep:
    """What a migration's ``progress(step, total)`` reports: ``name`` is ``verify``
    (per shard) or ``commit`` (per shard committed or re-indexed), ``done`` how many
    shards that step has done."""

    name: str
    done: int


@dataclass(frozen=True)
class MigrateOptions:
    """How :func:`migrate` imports legacy indexes (the keywords of
    :meth:`Catalog.migrate <shardcat.Catalog.migrate>` and :func:`shardcat.migrate`).

    ``dataset``: the dataset name (only when the indexes make one dataset;
    default: the dataset already holding these shards, else named after the
    files). ``dry_run``: verify and report, write nothing. ``remap``:
    ``{OLD_PREFIX: NEW_PREFIX}`` (or ``"OLD=NEW"`` strings) for shard paths
    recorded in tfd-utils indexes. ``fields``: True fills the SQL fields,
    re-indexing every shard from its data (as slow as a fresh ingest); False
    imports without them; None (default): as the dataset was ingested before,
    else False. ``key``: the key feature of tfd-utils TFRecord indexes
    (default: as the dataset was ingested before, else read off the records).
    ``sample``: entries re-read per remote shard (0: all; every entry of a local
    shard is). ``workers``: processes re-indexing shards. ``on_duplicate``: as
    for :meth:`Catalog.ingest <shardcat.Catalog.ingest>`. ``max_depth``: how
    many levels directories are walked (None: the whole tree). ``pattern``: shell
    patterns of the index file names looked for in directories (default:
    ``*.index``, ``*.tar_index``, ``*.idx``, ``*.tfindex``).
    ``storage_options``: fsspec options for shards on object storage (a
    ``remap`` to ``s3://...``), stored with the dataset without secrets.
    """

    dataset: str | None = None
    dry_run: bool = False
    remap: Mapping[str, str] | Iterable[tuple[str, str] | str] | None = None
    fields: bool | None = None
    key: str | None = None
    sample: int = DEFAULT_SAMPLE
    workers: int | None = None
    on_duplicate: str = "error"
    max_depth: int | None = None
    pattern: str | Sequence[str] | None = None
    storage_options: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        IngestOptions(on_duplicate=self.on_duplicate)  # refused here as ingest refuses it


@dataclass(frozen=True)
class _ForReader:
    """What :func:`migrate_for_reader` adds: the patterns the reader was opened with
    (the dataset is made of them), its format and its dataset options."""

    source: list[str]
    format: str | None
    overrides: Mapping[str, Any]


def _parse_remap(
    remap: Mapping[str, str] | Iterable[tuple[str, str] | str] | None,
) -> list[tuple[str, str]]:
    if remap is None:
        return []
    items = remap.items() if isinstance(remap, Mapping) else remap
    out = []
    for item in items:
        if isinstance(item, str):
            old, eq, new = item.partition("=")
            if not eq or not old:
                raise CatalogError(f"--remap takes OLD_PREFIX=NEW_PREFIX, not {item!r}")
            item = (old, new)
        out.append((str(item[0]), str(item[1])))
    return out


def _head_size(fmt: str, rows: Sequence[Any]) -> int:
    """How many first bytes of a remote shard its options are read from first: up
    to the end of its first record as its legacy rows say (TFRecord, RecordIO; and
    a little more), else :data:`SNIFF_HEAD` as ingest reads (then, as there, the
    rest of a longer first record: :func:`head_copy`)."""
    end = None
    if fmt == "tfrecord" and rows:
        first = min(rows, key=lambda e: e.offset)
        end = first.offset + first.length + TFRECORD_FRAME if first.offset == 0 else None
    elif fmt == "recordio" and len(rows) > 1:
        end = sorted(row[1] for row in rows)[1]
    return SNIFF_HEAD if end is None else min(SNIFF_REMOTE, end + SNIFF_BYTES)


def _detect_options(
    fmt: str, first: str, storage: Mapping[str, Any] | None, rows: Sequence[Any] = ()
) -> dict[str, Any]:
    """The options ``fmt`` reads off the shard ``first`` (a remote one: off a local
    copy of its first bytes, up to the end of its first record, see :func:`_head_size`)."""
    if not is_url(first):
        return detect_options(get_format(fmt), first)
    with head_copy(first, storage, fmt, _head_size(fmt, rows)) as (head, _):
        return detect_options(get_format(fmt), head)


def _options(
    plan: Plan,
    fields: bool,
    key: str | None,
    stored: Mapping[str, Any],
    detected: Mapping[str, Any],
    storage: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The dataset options a fresh ingest of these shards would record, and what the
    report should say about them. ``detected``: those read off the first shard
    (:func:`_detect_options`); ``storage``: the fsspec options of remote shards."""
    opts: dict[str, Any] = {**detected, "fields": fields}
    if storage:
        opts[STORAGE_OPTIONS] = dict(storage)
    notes: list[str] = []
    if plan.format == "tfrecord":
        opts["key"] = (key or infer_key(plan.shards, opts)) if plan.keyed else None
    elif plan.format == "tar":
        opts.update(key="key", grouping="tfd")
    else:
        # keyed by .idx unless the keys collide (a dataset made before keeps its rule)
        where = os.path.commonpath([os.path.dirname(p) for p in plan.shards])
        clash = mxnet_idx.find_collision(
            (os.path.relpath(index.path, where), (row[0] for row in shard.rows))
            for _, (index, shard) in sorted(plan.shards.items())
        )
        column = mxnet_idx.IDX_AS_COLUMN
        opts.update(key="key", idx=stored.get("idx", True if clash is None else column))
        if opts["idx"] == column:
            notes.append(
                (
                    mxnet_idx.position_keys_note(clash)
                    if clash is not None
                    else "keyed by position as when the dataset was made, each record's "
                    f".idx key in SQL column {mxnet_idx.IDX_KEY}"
                )
                + ("" if fields else "; idx_key is filled with the SQL fields (--fields)")
            )
    return opts, notes


@contextlib.contextmanager
def _opened(
    catalog: Any, where: Path | str | None, dry_run: bool, open_catalog: OpenCatalog
) -> Iterator[Any]:
    """The catalog to migrate into (None: a dry run where no catalog file exists yet)."""
    if _is_open(catalog) or where is None:
        yield catalog
        return
    if dry_run and isinstance(where, Path) and not where.is_file():
        yield None
        return
    cat = open_catalog(where, readonly=dry_run)
    try:
        yield cat
    finally:
        cat.close()


def _is_open(catalog: Any) -> bool:
    """Whether ``catalog`` is an open catalog (a :class:`shardcat.Catalog`), not where one is."""
    return isinstance(getattr(catalog, "store", None), Store)


def _known_shards(cat: Any, name: str | None) -> dict[str, tuple[int, int, str, int]]:
    """Stored shard path -> (size, mtime_ns, state, records) of dataset ``name``."""
    return {} if cat is None or name is None else cat.store.shard_states(name)


def _stored_options(cat: Any, name: str | None) -> dict[str, Any] | None:
    """The options dataset ``name`` was ingested with; None when there is no such dataset."""
    return None if cat is None or name is None else cat.store.stored_options(name)


def _stat(path: str, storage: Mapping[str, Any] | None) -> os.stat_result:
    """The shard's stat; a remote object's identity (size, Last-Modified) as one."""
    if is_url(path):  # as the discovery's listing (or the source's glob) gave it
        return (listed_info(path) or remote_info(path, storage)).as_stat()
    return os.stat(path)


def _provider(st: os.stat_result, entries: list[Entry], report: ShardReport) -> ProvideEntries:
    """The verified entries, handed to the ingest once it claimed the shard, unless
    the file changed since it was verified (then the ingest scans it)."""

    def provide(path: str, now: os.stat_result) -> ShardScan | None:
        if (now.st_size, now.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            report.reason = "the shard changed while it was being migrated"
            return None
        report.action = "imported"
        return ShardScan(Columns.of(entries))

    return provide


class _Ticker:
    """Counts the shards each step has done and reports them to ``progress`` (out of
    ``total``, set once the plans are made)."""

    def __init__(self, progress: Progress | None) -> None:
        self.total, self.progress, self.done = 0, progress, {"verify": 0, "commit": 0}

    def __call__(self, step: str) -> None:
        self.done[step] += 1
        if self.progress is not None:
            self.progress(MigrationStep(step, self.done[step]), self.total)


def _fill_command(report: DatasetReport) -> str:
    parts = ["catalog", "migrate", *report.legacy, "--dataset", report.dataset]
    return " ".join(shlex.quote(p) for p in [*parts, "--catalog", report.catalog, "--fields"])


def _free_name(cat: Any, base: str) -> str:
    """``base``, or ``base_2``... when the catalog gives it to another dataset."""
    return base if cat is None else cat.store.unused_name(base)


@dataclass(frozen=True)
class _Run:
    """One migration's settings, shared by every plan: its options, the catalog given
    (a :class:`Catalog`, a path or URL, or None), how to open one by path, the
    progress ticker, and what a reader adds (:func:`migrate_for_reader`)."""

    opts: MigrateOptions
    catalog: Any
    open_catalog: OpenCatalog
    tick: _Ticker
    reader: _ForReader | None = None
    remap: list[tuple[str, str]] = field(default_factory=list)  # opts.remap, parsed


def _target(run: _Run, plan: Plan) -> tuple[Path | str | None, str]:
    """Where a plan's dataset goes: the catalog path to open (None: the
    :class:`Catalog` given) and the directory its shard paths are stored relative to."""
    if _is_open(run.catalog):
        return None, run.catalog.store.directory
    if run.catalog is not None and backend_for(run.catalog).local_file is None:
        return str(run.catalog), ""  # a catalog that is no local file stores paths absolute
    # remote shards: the default catalog (there is no "beside them" on object storage)
    far = any(is_url(f) for f in plan.files)
    beside = None if far else os.path.commonpath([os.path.dirname(f) for f in plan.files])
    where = locate(run.catalog, beside).absolute()
    return where, str(where.parent)


def _verify_shards(
    run: _Run,
    plan: Plan,
    options: Mapping[str, Any],
    known: Mapping[str, tuple[int, int, str, int]],
    directory: str,
    fields: bool,
    rescan: bool,
) -> tuple[dict[str, ShardReport], dict[str, ProvideEntries]]:
    """Each file of the plan checked against its legacy entries: unchanged since
    the catalog indexed it, importable (verified entries, handed to the ingest), or
    to be re-indexed from its data (the report says why)."""
    storage = options.get(STORAGE_OPTIONS)
    reports: dict[str, ShardReport] = {}
    provided: dict[str, ProvideEntries] = {}
    for path in plan.files:
        index, shard = plan.shards.get(path, (None, None))
        report = reports[path] = ShardReport(
            path,
            None if index is None else index.path,
            "re-index",
            resolved_by="" if shard is None else shard.resolved_by,
        )
        try:
            st = _stat(path, storage)
        except MissingShardError:
            report.action, report.reason = "failed", "shard not found (is it moved? see --remap)"
            run.tick("verify")
            continue
        before = known.get(stored_path(path, directory))
        if (
            not rescan
            and before is not None
            and before[:3] == (st.st_size, st.st_mtime_ns, "ready")
        ):
            report.action, report.records = "unchanged", before[3]
        elif index is None or shard is None:
            report.reason = "not in any legacy index"
        elif fields:
            report.reason = "--fields: SQL fields are read from the data"
        else:
            try:
                entries, report.checked = verify_shard(
                    plan.format, index, shard, st, options, run.opts.sample
                )
            except Mismatch as exc:
                report.reason = f"legacy index does not match the file: {exc}"
            else:
                report.action, report.verified, report.records = "import", True, len(entries)
                provided[path] = _provider(st, entries, report)
            shard.rows = []  # the entries (or the re-index) replace them
        run.tick("verify")
    return reports, provided


def _missing(plan: Plan) -> list[ShardReport]:
    return [
        ShardReport(m, i.path, "failed", reason="shard not found (is it moved? see --remap)")
        for i in plan.indexes
        for m in i.missing
    ]


def _migrate_plan(plan: Plan, run: _Run) -> DatasetReport:
    opts = run.opts
    if not plan.shards:
        legacy = [i.path for i in plan.indexes]
        return DatasetReport(
            opts.dataset or plan.name,
            "-",
            plan.format,
            "-",
            legacy,
            [],
            bool(opts.fields),
            _missing(plan),
        )
    where, directory = _target(run, plan)
    with _opened(run.catalog, where, opts.dry_run, run.open_catalog) as cat:
        found = opts.dataset or (None if cat is None else cat.find_dataset(plan.source))
        name = found or _free_name(cat, plan.name)
        known = _known_shards(cat, found)
        stored = _stored_options(cat, found) or {}
        # as the dataset was migrated or ingested before, else without
        fields = bool(stored.get("fields", False)) if opts.fields is None else opts.fields
        # shards migrated without fields are re-read when fields are asked for now
        rescan = fields and stored.get("fields") is False
        storage = opts.storage_options or stored.get(STORAGE_OPTIONS)
        first = min(plan.shards)  # its options read once, handed to the ingest as detected
        detected = _detect_options(plan.format, first, storage, plan.shards[first][1].rows)
        key = opts.key or stored.get("key")
        options, notes = _options(plan, fields, key, stored, detected, storage)
        if run.reader is not None:  # what a reader asks for (see migrate_for_reader)
            options.update(run.reader.overrides)
        reports, provided = _verify_shards(run, plan, options, known, directory, fields, rescan)
        result = DatasetReport(
            dataset=name,
            catalog=str(cat.path if cat is not None else where),
            format=plan.format,
            key_rule=get_format(plan.format).key_rule(options),
            legacy=[i.path for i in plan.indexes],
            source=plan.source,
            fields=fields,
            shards=[*reports.values(), *_missing(plan)],
            notes=notes,
        )
        if cat is not None and not opts.dry_run:
            ingest = IngestOptions(
                format=plan.format,
                options=options,
                workers=opts.workers,
                on_duplicate=opts.on_duplicate,
                rescan=bool(rescan),
            )
            result.dataset, result.dropped = _commit(
                cat, plan, name, ingest, provided, reports, run.tick, detected
            )
    if not fields:
        result.fill_fields = _fill_command(result)
    return result


def _commit(
    cat: Any,
    plan: Plan,
    name: str,
    opts: IngestOptions,
    provided: dict[str, ProvideEntries],
    reports: dict[str, ShardReport],
    tick: _Ticker,
    detected: Mapping[str, Any],
) -> tuple[str, int]:
    """Run the ingest with the verified entries (and the options ``detected`` off the
    first shard: the ingest reads none of its bytes again); returns the dataset's
    name and how many records ``on_duplicate`` dropped."""
    dropped = 0

    def on_outcome(outcome: ShardOutcome, total: int) -> None:
        nonlocal dropped
        dropped += outcome.duplicates  # what on_duplicate removed (here and in other shards)
        report = reports.get(absolute_path(outcome.path, cat.store.directory))
        if report is not None and outcome.error != CLAIM_LOST:
            report.records = outcome.records
            if outcome.error is not None:
                why = f"{report.reason}; re-indexing failed too: " if report.reason else ""
                report.action, report.reason = "failed", why + outcome.error
            elif report.action != "imported":
                report.action = "re-indexed"
        tick("commit")

    try:
        with cat.ingest_with(
            plan.source, name, opts, progress=on_outcome, provided=provided, detected=detected
        ) as reader:
            name = reader.dataset
    except IngestError:
        pass  # the dataset exists (the ingest made it first); failures are in the reports
    # shards indexed by another process at the same time, and the final counts
    for path, (_, _, state, records) in _known_shards(cat, name).items():
        report = reports.get(absolute_path(path, cat.store.directory))
        if report is not None and report.action in ("import", "re-index"):
            report.action = "re-indexed" if state == "ready" else "failed"
        if report is not None and state == "ready":
            report.records = records
    return name, dropped


def migrate(
    paths: PathsLike,
    opts: MigrateOptions,
    *,
    open_catalog: OpenCatalog,
    catalog: Any = None,
    progress: Progress | None = None,
) -> MigrationReport:
    """Import the legacy index files found for ``paths`` into the catalog, as
    ``opts`` (:class:`MigrateOptions`) say.

    ``paths``: directories (walked ``opts.max_depth`` levels down), legacy index
    files, shard files or globs (see :mod:`shardcat.migrations.legacy` for
    discovery, re-rooting and verification). Each legacy index becomes one
    dataset (see :mod:`shardcat.migrations.legacy.plans`). ``catalog``: a
    :class:`Catalog` or a catalog path (default: the one readers of the shards
    use, ``shardcat.sqlite`` beside them). ``progress(step, total)``: ``step`` a
    :class:`MigrationStep`. ``open_catalog(path, readonly=...)`` opens a catalog
    by path (the facade passes :class:`shardcat.Catalog`).

    Raises :class:`LegacyIndexError` for a refused or corrupt pickle, before
    anything is written. Shards that fail are in the report, not raised.
    """
    remaps = _parse_remap(opts.remap)
    # this process's reads of remote shards (given, or remapped to) use them (secrets too)
    for target in [*as_patterns(paths), *(new for _, new in remaps)]:
        if opts.storage_options and is_url(target):
            configure(protocol_of(target), **opts.storage_options)
    run = _Run(opts, catalog, open_catalog, _Ticker(progress), remap=remaps)
    with _gc_paused():
        return _migrate(paths, run)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection meanwhile: a migration holds millions of
    entries, and every full collection would walk them all (it doubled the time
    of building them). Nothing here makes reference cycles."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _discover(paths: PathsLike, run: _Run, onto: ReaderFiles | None) -> tuple[list[Any], list[Any]]:
    """The legacy indexes found for ``paths`` (local ones walked, remote ones listed)
    and the files skipped (with why)."""
    opts, given, remap = run.opts, as_patterns(paths), run.remap
    far = [p for p in given if is_url(p)]  # on object storage: found by listing
    near = [p for p in given if not is_url(p)]
    found = discover(near, remap, max_depth=opts.max_depth, pattern=opts.pattern, onto=onto)
    indexes, skipped = found
    if far:
        more, also = discover_remote(
            far,
            remap,
            storage_options=opts.storage_options,
            max_depth=opts.max_depth,
            pattern=opts.pattern,
            onto=onto,
        )
        indexes, skipped = indexes + more, skipped + also
    return indexes, skipped


def _migrate(paths: PathsLike, run: _Run) -> MigrationReport:
    """``migrate``; with ``run.reader`` the dataset is made of the reader's patterns
    (the index's entries for the shards it covers, the other files indexed from
    their data; see :func:`migrate_for_reader`)."""
    reader = run.reader
    # a reader's files: the dataset, which tfd-utils indexes' shards are placed onto
    files = None if reader is None else set(resolve_paths(reader.source))
    indexes, skipped = _discover(paths, run, None if files is None else ReaderFiles(files))
    for index in indexes:
        if reader is not None and reader.format is not None and index.format != reader.format:
            raise CatalogError(
                f"{index.path} is a {index.kind}: its shards are "
                f"{get_format(index.format).TITLE}, not {reader.format} (the reader's format)"
            )
    if files is not None:
        for index in indexes:
            index.shards = [s for s in index.shards if s.path in files]
            index.missing = []  # the reader's files are the dataset, not the index's
    plans = make_plans(indexes, skipped)
    if run.opts.dataset is not None and len(plans) > 1:
        raise CatalogError(
            f"--dataset names one dataset, but the legacy indexes make {len(plans)}: "
            + "; ".join(", ".join(i.path for i in p.indexes) for p in plans)
            + " (migrate them one at a time)"
        )
    for plan in plans:  # the source set (and its files no index covers) before counting
        if plan.shards and files is not None and reader is not None:
            plan.source = [
                p if is_url(p) else os.path.abspath(os.path.expanduser(p)) for p in reader.source
            ]
            plan.extra = sorted(files - set(plan.shards))
        elif plan.shards:
            plan.source, plan.extra = source_of(sorted(plan.shards), as_patterns(paths))
    run.tick.total = sum(len(p.files) for p in plans)
    reports = [_migrate_plan(plan, run) for plan in plans]
    return MigrationReport(run.opts.dry_run, reports, skipped, run.opts.on_duplicate)


def migrate_for_reader(
    index_file: str | os.PathLike[str],
    shard_paths: PathsLike,
    opts: IngestOptions,
    *,
    open_catalog: OpenCatalog,
    catalog: str | os.PathLike[str],
) -> MigrationReport:
    """:func:`migrate` of one legacy index for a reader opened on ``shard_paths``
    (of ``opts.format``, with dataset options ``opts.options``, ``fields``,
    ``workers``, ``on_duplicate``): the dataset is made of the reader's
    files under the reader's patterns, so the reader finds it; the index's entries
    for the shards it covers are imported (verified), the other files indexed from
    their data. :class:`CatalogError` when the index is of another format."""
    key = opts.key if isinstance(opts.key, str) else None
    migrate_opts = MigrateOptions(
        fields=opts.fields, key=key, workers=opts.workers, on_duplicate=opts.on_duplicate
    )
    reader = _ForReader(as_patterns(shard_paths), opts.format, opts.options)
    run = _Run(migrate_opts, catalog, open_catalog, _Ticker(None), reader)
    with _gc_paused():
        return _migrate([os.fspath(index_file)], run)
