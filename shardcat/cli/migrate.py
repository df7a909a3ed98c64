"""migrate: legacy index files (tfd-utils, MXNet/DALI, vahidk) into the catalog;
``--upgrade``: a catalog's schema to this shardcat's version."""

from __future__ import annotations

import contextlib
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
from shardcat.errors import CatalogError

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from shardcat.facade.migrate import MigrationStep
    from shardcat.migrations.legacy.report import MigrationReport

# What migrate re-reads per shard by default (migrations.legacy.verify.DEFAULT_SAMPLE, which
# a test keeps equal; imported here it would load the readers for --help).
DEFAULT_SAMPLE = 64


@handle_errors(interrupted=RERUN_TO_FINISH)
def migrate(
    paths: Annotated[
        list[str] | None,
        typer.Argument(
            help="Directories (walked, see --depth), legacy index files, shard files or globs "
            "(index files are found beside the shards by their names)."
        ),
    ] = None,
    depth: Annotated[
        int | None,
        typer.Option(
            "--depth",
            min=0,
            help="How many directory levels below each directory to look into "
            "(0: the directory alone; default: the whole tree, hidden directories left out).",
            show_default=False,
        ),
    ] = None,
    pattern: Annotated[
        list[str] | None,
        typer.Option(
            "--pattern",
            metavar="GLOB",
            help="Index file names to look for in directories, e.g. '*.tar_index' or "
            "'*.pkl' (repeatable; default: *.index, *.tar_index, *.idx, *.tfindex).",
        ),
    ] = None,
    dataset: Annotated[
        str | None,
        typer.Option("--dataset", "-d", help="Dataset name (default: from the shard names)."),
    ] = None,
    catalog: CatalogOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Verify and show what would happen; write nothing.")
    ] = False,
    remap: Annotated[
        list[str] | None,
        typer.Option(
            "--remap",
            metavar="OLD=NEW",
            help="Rewrite shard paths recorded in tfd-utils indexes that start with OLD "
            "(repeatable); NEW may be a URL (s3://bucket/train) when the shards moved "
            "to object storage.",
        ),
    ] = None,
    storage_option: StorageOpt = None,
    fields: Annotated[
        bool | None,
        typer.Option(
            "--fields/--no-fields",
            help="Fill the SQL fields too: re-reads every record (as slow as catalog ingest). "
            "Default: as the dataset was ingested before, else --no-fields.",
            show_default=False,
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key", "-k", help="tfd-utils TFRecord indexes: the key feature (default: detected)."
        ),
    ] = None,
    sample: Annotated[
        int,
        typer.Option(
            help="Entries re-read per remote shard to verify it (the first, the last and evenly "
            "spaced ones; 0: all of them). Every entry of a local shard is re-read."
        ),
    ] = DEFAULT_SAMPLE,
    workers: WorkersOpt = None,
    on_duplicate: OnDuplicateOpt = "error",
    upgrade_only: Annotated[
        bool,
        typer.Option(
            "--upgrade",
            help="Only upgrade the catalog's schema to this shardcat's version (no PATHS).",
        ),
    ] = False,
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
    from shardcat.facade import tasks

    if upgrade_only:
        if paths:
            raise CatalogError("--upgrade takes no PATHS")
        done = tasks.upgrade_catalog(catalog)
        typer.echo(
            f"{done.path}: schema version {done.now}"
            + (
                f" (upgraded from {done.found}: older shardcat versions can no longer open it)"
                if 0 < done.found < done.now
                else " (up to date)"
            )
        )
        return
    if not paths:
        raise CatalogError("give the directories or index files to migrate (see --help)")
    where = catalog_path(catalog, announce=False)  # named below once a legacy import ran
    with contextlib.ExitStack() as stack:
        bars: list[Progress] = []  # opened at the first legacy step, not for tensorblob
        steps: dict[str, TaskID] = {}

        def progress(step: MigrationStep, total: int) -> None:
            if not bars:
                bars.append(stack.enter_context(progress_bar("{task.description}", disable=json)))
            bar = bars[0]
            if step.name not in steps:
                steps[step.name] = bar.add_task(step.name, total=total)
            bar.update(steps[step.name], completed=step.done, total=total)

        outcome = tasks.migrate_any(
            paths,
            catalog=where,
            dataset=dataset,
            dry_run=dry_run,
            remap=remap or [],
            fields=fields,
            key=key,
            sample=sample,
            workers=workers,
            on_duplicate=on_duplicate,
            progress=progress,
            max_depth=depth,
            pattern=pattern or None,
            storage_options=storage_options(storage_option) or None,
        )
    if outcome.report is not None:
        catalog_path(catalog)  # the command ends naming the catalog it imported into
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
    if outcome.report is None:
        return
    if json:
        print_json(outcome.report.to_dict())
    else:
        print_report(outcome.report)
    if outcome.failed:
        raise typer.Exit(1)


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
