"""migrate: legacy index files (tfd-utils, MXNet/DALI, vahidk) into the catalog,
and tensorblob directories converted in place; upgrade: a catalog's schema to this
shardcat's version (``migrate --upgrade``, its older spelling, still works)."""

from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING, Annotated

import typer

from shardcat.cli.common import (
    RERUN_TO_FINISH,
    catalog_path,
    handle_errors,
    print_json,
    print_table,
    progress_bar,
)
from shardcat.cli.options import (
    CatalogOpt,
    JsonOpt,
    OnDuplicateOpt,
    StorageOpt,
    WorkersOpt,
    storage_options,
)
from shardcat.errors import CatalogError, ShardcatWarning

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from shardcat.facade.migrate import MigrateOptions, MigrationStep
    from shardcat.facade.tasks import MigrateOutcome
    from shardcat.migrations.legacy.report import MigrationReport

# What migrate re-reads per shard by default (migrations.legacy.verify.DEFAULT_SAMPLE, which
# a test keeps equal; imported here it would load the readers for --help).
DEFAULT_SAMPLE = 64

PathsArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="Directories (walked, see --depth), legacy index files, shard files or globs "
        "(index files are found beside the shards by their names)."
    ),
]
DepthOpt = Annotated[
    int | None,
    typer.Option(
        "--depth",
        min=0,
        help="How many directory levels below each directory to look into "
        "(0: the directory alone; default: the whole tree, hidden directories left out).",
        show_default=False,
    ),
]
PatternOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--pattern",
        metavar="GLOB",
        help="Index file names to look for in directories, e.g. '*.tar_index' or "
        "'*.pkl' (repeatable; default: *.index, *.tar_index, *.idx, *.tfindex).",
    ),
]
DatasetOpt = Annotated[
    str | None,
    typer.Option("--dataset", "-d", help="Dataset name (default: from the shard names)."),
]
DryRunOpt = Annotated[
    bool, typer.Option("--dry-run", help="Verify and show what would happen; write nothing.")
]
RemapOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--remap",
        metavar="OLD=NEW",
        help="Rewrite shard paths recorded in tfd-utils indexes that start with OLD "
        "(repeatable); NEW may be a URL (s3://bucket/train) when the shards moved "
        "to object storage.",
    ),
]
FieldsOpt = Annotated[
    bool | None,
    typer.Option(
        "--fields/--no-fields",
        help="Fill the SQL fields too: re-reads every record (as slow as catalog ingest). "
        "Default: as the dataset was ingested before, else --no-fields.",
        show_default=False,
    ),
]
KeyOpt = Annotated[
    str | None,
    typer.Option(
        "--key", "-k", help="tfd-utils TFRecord indexes: the key feature (default: detected)."
    ),
]
SampleOpt = Annotated[
    int,
    typer.Option(
        help="Entries re-read per remote shard to verify it (the first, the last and evenly "
        "spaced ones; 0: all of them). Every entry of a local shard is re-read."
    ),
]
UpgradeOpt = Annotated[
    bool,
    typer.Option(
        "--upgrade",
        help="Deprecated: use `catalog upgrade`. Only upgrade the catalog's schema (no PATHS).",
    ),
]


@handle_errors(interrupted=RERUN_TO_FINISH)
def migrate(
    paths: PathsArg = None,
    depth: DepthOpt = None,
    pattern: PatternOpt = None,
    dataset: DatasetOpt = None,
    catalog: CatalogOpt = None,
    dry_run: DryRunOpt = False,
    remap: RemapOpt = None,
    storage_option: StorageOpt = None,
    fields: FieldsOpt = None,
    key: KeyOpt = None,
    sample: SampleOpt = DEFAULT_SAMPLE,
    workers: WorkersOpt = None,
    on_duplicate: OnDuplicateOpt = "error",
    upgrade_only: UpgradeOpt = False,
    json: JsonOpt = False,
) -> None:
    """Import legacy index files into the catalog, so readers open without re-indexing.

    Reads tfd-utils pickles (<stem>.index, all<N>.index, <stem>_unified_tot<N>.index,
    <stem>.tar_index, ...; loaded with a restricted unpickler that refuses
    anything but plain data), MXNet/DALI .idx files beside .rec shards, and
    DALI/vahidk tfrecord2idx offset files. Every shard is checked against its
    file (size, and its records re-read, keys confirmed) before it is imported; a
    shard that does not match is re-indexed from its data. SQL fields are not
    in legacy indexes: --fields fills them by re-reading the data. Each
    legacy index becomes one dataset, named after it and found by the reader
    call that made it (per-shard MXNet/DALI indexes of one shard set make
    one); directories are walked (--depth, --pattern). The catalog is the one
    every command uses (see --catalog); readers opened on the shard paths look
    beside the shards, so -c DIR/shardcat.sqlite builds the catalog they find. A
    directory written by the tensorblob package is converted to a shardcat
    TensorBlob/TensorDB in place (no block copied). Exit code 1 if
    any shard failed.
    """
    if upgrade_only:
        warnings.warn(
            "`catalog migrate --upgrade` is deprecated: run `catalog upgrade`",
            ShardcatWarning,
            stacklevel=1,
        )
        if paths:
            raise CatalogError("--upgrade takes no PATHS")
        _upgrade(catalog)
        return
    if not paths:
        raise CatalogError("give the directories or index files to migrate (see --help)")
    from shardcat.facade.migrate import MigrateOptions

    opts = MigrateOptions(
        dataset=dataset,
        dry_run=dry_run,
        remap=remap or [],
        fields=fields,
        key=key,
        sample=sample,
        workers=workers,
        on_duplicate=on_duplicate,
        max_depth=depth,
        pattern=pattern or None,
        storage_options=storage_options(storage_option) or None,
    )
    outcome = _import(paths, opts, catalog, quiet=json)
    _print_converted(outcome)
    if outcome.report is None:
        return
    catalog_path(catalog)  # the command ends naming the catalog it imported into
    if json:
        print_json(outcome.report.to_dict())
    else:
        print_report(outcome.report)
    if outcome.failed:
        raise typer.Exit(1)


def _import(
    paths: list[str], opts: MigrateOptions, catalog: str | None, *, quiet: bool
) -> MigrateOutcome:
    """Run the migration with a progress bar per step (verify, commit), opened at the
    first legacy step (a tensorblob conversion shows none)."""
    from shardcat.facade import tasks

    where = catalog_path(catalog, announce=False)  # named once a legacy import ran
    with contextlib.ExitStack() as stack:
        bars: list[Progress] = []
        steps: dict[str, TaskID] = {}

        def progress(step: MigrationStep, total: int) -> None:
            if not bars:
                bars.append(stack.enter_context(progress_bar("{task.description}", disable=quiet)))
            bar = bars[0]
            if step.name not in steps:
                steps[step.name] = bar.add_task(step.name, total=total)
            bar.update(steps[step.name], completed=step.done, total=total)

        return tasks.migrate_any(paths, opts, catalog=where, progress=progress)


def _print_converted(outcome: MigrateOutcome) -> None:
    """A line per tensorblob directory converted (or, in a dry run, to convert)."""
    for converted in outcome.converted:
        if converted.kind is None:
            typer.echo(
                f"{converted.path}: tensorblob directory, would be converted in place "
                "(the tensorblob package could no longer open it)"
            )
        else:
            typer.echo(
                f"{converted.path}: tensorblob {converted.kind} of {converted.rows:,} rows "
                "converted in place (the tensorblob package can no longer open it)"
            )


@handle_errors
def upgrade(catalog: CatalogOpt = None) -> None:
    """Upgrade the catalog's schema to this shardcat's version, in place.

    Opening a catalog for writing (any command that writes, Catalog(path) in
    Python) upgrades it too; commands that only read never do, and name this
    command instead. Older shardcat versions can no longer open an upgraded
    catalog.
    """
    _upgrade(catalog)


def _upgrade(catalog: str | None) -> None:
    from shardcat.facade import tasks

    done = tasks.upgrade_catalog(catalog)
    typer.echo(
        f"{done.path}: schema version {done.now}"
        + (
            f" (upgraded from {done.found}: older shardcat versions can no longer open it)"
            if 0 < done.found < done.now
            else " (up to date)"
        )
    )


def print_report(report: MigrationReport) -> None:
    """The summary table, then per dataset where it went and the shards that were
    not imported (and why)."""
    from rich import box
    from rich.table import Table

    if not report.datasets:
        typer.echo("no legacy index files found")
    else:
        imported = "import" if report.dry_run else "imported"
        reindexed = "re-index" if report.dry_run else "re-indexed"
        table = Table(
            "dataset", "shards", imported, "verified", reindexed, "unchanged", "failed", "records",
            title="dry run: nothing was written" if report.dry_run else None,
            box=box.SIMPLE_HEAD,  # with the options below: fits 80 columns
            show_edge=False,
            pad_edge=False,
            padding=(0, 1, 0, 0),
        )  # fmt: skip
        for d in report.datasets:
            counts = map(str, d.totals(report.dry_run).values())
            table.add_row(d.dataset, str(len(d.shards)), *counts, f"{d.records:,}")
        print_table(table)
    for d in report.datasets:
        typer.echo(f"dataset {d.dataset} ({d.format}, {d.key_rule}) -> {d.catalog}", err=True)
        for legacy in d.legacy:
            typer.echo(f"  from {legacy}", err=True)
        for note in d.notes:
            typer.echo(f"  note: {note}", err=True)
        if d.dropped:
            typer.echo(
                f"  {d.dropped:,} record{'s' if d.dropped != 1 else ''} with duplicate keys "
                f"dropped (--on-duplicate {report.on_duplicate})",
                err=True,
            )
        for s in d.shards:
            if s.reason is not None and s.action != "unchanged":
                typer.echo(f"  {s.action}: {s.path}: {s.reason}", err=True)
            elif s.resolved_by.startswith(("re-rooted", "remapped")):
                typer.echo(f"  {s.resolved_by}: {s.path}", err=True)
        if d.fill_fields:
            typer.echo(
                "  SQL fields are not imported (legacy indexes do not hold them); "
                f"to fill them: {d.fill_fields}",
                err=True,
            )
    for path, reason in report.skipped:
        typer.echo(f"skipped {path}: {reason}", err=True)


def register(app: typer.Typer) -> None:
    app.command()(migrate)
    app.command()(upgrade)
