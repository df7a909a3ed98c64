"""``catalog delete`` and ``catalog undelete``: soft deletes of a dataset's records
(:meth:`shardcat.Catalog.delete`, :meth:`shardcat.Catalog.undelete`); ``catalog
dedup``: exact duplicate records (:meth:`shardcat.Catalog.dedup`); ``catalog tag``,
``tags``, ``untag``: pinned record sets (:mod:`shardcat.facade.tags`); ``catalog seen``:
what a training run consumed, as a table (:mod:`shardcat.facade.provenance`)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Annotated

import typer

from shardcat.cli.common import (
    cell,
    handle_errors,
    open_catalog,
    print_json,
    print_table,
    progress_bar,
)
from shardcat.cli.options import CatalogOpt, DatasetArg, JsonOpt

_TAG_HELP = "The tag's name (letters, digits and _); read it as DATASET@NAME."
TagArg = Annotated[str, typer.Argument(help=_TAG_HELP)]

_KEY_HELP = "A record's key (repeat the option for more)."


@handle_errors
def delete(
    dataset: DatasetArg,
    where: Annotated[
        str | None,
        typer.Option("--where", help="SQL condition over the dataset's view (label = 3)."),
    ] = None,
    key: Annotated[list[str] | None, typer.Option("--key", help=_KEY_HELP)] = None,
    catalog: CatalogOpt = None,
) -> None:
    """Mark records deleted without rewriting shards: readers, samplers and the SQL
    view skip them until `catalog undelete`."""
    with open_catalog(catalog) as cat:
        n = cat.delete(dataset, where, keys=key)
    typer.echo(f"{n} record(s) of {dataset} deleted")


@handle_errors
def undelete(
    dataset: DatasetArg,
    where: Annotated[
        str | None,
        typer.Option("--where", help="SQL condition over every record, deleted ones included."),
    ] = None,
    key: Annotated[list[str] | None, typer.Option("--key", help=_KEY_HELP)] = None,
    catalog: CatalogOpt = None,
) -> None:
    """Restore records `catalog delete` marked deleted (all of them without --where
    or --key)."""
    with open_catalog(catalog) as cat:
        n = cat.undelete(dataset, where, keys=key)
    typer.echo(f"{n} record(s) of {dataset} restored")


@handle_errors
def dedup(
    dataset: DatasetArg,
    across: Annotated[
        list[str] | None,
        typer.Option(
            "--across", metavar="OTHER", help="Another dataset to compare with (repeat for more)."
        ),
    ] = None,
    mark: Annotated[
        bool, typer.Option("--mark", help="Soft-delete all but the first of each group.")
    ] = False,
    json: JsonOpt = False,
    catalog: CatalogOpt = None,
) -> None:
    """List exact duplicate records (the same bytes) within DATASET and across the
    --across datasets: candidates share a stored CRC32C, then their bytes are
    compared. The first of each group (dataset named first, then lowest position)
    is kept; --mark soft-deletes the others (`catalog undelete` restores them)."""
    names = [dataset, *(across or [])]
    with (
        open_catalog(catalog, readonly=not mark) as cat,
        progress_bar("dedup", count="records", disable=json) as bar,
    ):
        task = bar.add_task("dedup", total=None)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=stage)  # scan, compare

        report = cat.dedup(dataset, across or [], mark=mark, progress=progress)
    if json:
        print_json(report.as_dict())
        return
    for group in report.groups:
        others = ", ".join(f"{c.dataset} {c.key!r}" for c in group.duplicates)
        typer.echo(f"{group.kept.dataset} {group.kept.key!r} ({group.length:,} bytes): {others}")
    typer.echo(
        f"{', '.join(names)}: {report.records:,} records, {report.duplicates:,} duplicate(s) "
        f"in {len(report.groups):,} group(s); {report.candidates:,} candidate(s) compared "
        f"({report.bytes_compared:,} bytes), {report.collisions:,} CRC32C collision(s)",
        err=True,
    )
    if report.computed:
        computed = f"{report.computed:,} record(s) had no stored check: read to compute it"
        typer.echo(computed, err=True)
    if mark and report.marked:
        marked = ", ".join(f"{name} {n:,}" for name, n in report.marked.items())
        typer.echo(f"marked deleted: {marked} (catalog undelete restores them)", err=True)
    elif mark:
        typer.echo("nothing to mark", err=True)


@handle_errors
def tag(dataset: DatasetArg, name: TagArg, catalog: CatalogOpt = None) -> None:
    """Pin a dataset as it is (its shard versions and record set): DATASET@NAME reads
    exactly that later, after re-ingests, adds and deletes."""
    with open_catalog(catalog) as cat:
        info = cat.tag(dataset, name)
    typer.echo(
        f"tagged {dataset} as {info.pinned}: {info.records} record(s) in {info.shards} shard(s)"
    )


@handle_errors
def untag(dataset: DatasetArg, name: TagArg, catalog: CatalogOpt = None) -> None:
    """Remove a tag and the rows it pinned (files on disk are untouched)."""
    with open_catalog(catalog) as cat:
        info = cat.untag(dataset, name)
    typer.echo(f"removed tag {info.name} of {dataset} ({info.records} record(s))")


@handle_errors
def tags(
    dataset: Annotated[
        str | None, typer.Argument(help="Only this dataset's tags (default: all).")
    ] = None,
    catalog: CatalogOpt = None,
    json: JsonOpt = False,
) -> None:
    """List tags: name, dataset, records and when each was made."""
    with open_catalog(catalog) as cat:
        found = cat.tags(dataset)
    if json:
        print_json([{**dataclasses.asdict(t), "pinned": t.pinned} for t in found])
        return
    if not found:
        typer.echo("no tags yet (catalog tag DATASET NAME)")
        return
    from rich.table import Table

    table = Table("tag", "dataset", "records", "shards", "created", "read as")
    for t in found:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(t.created))
        table.add_row(
            cell(t.name), cell(t.dataset), f"{t.records:,}", str(t.shards), when, cell(t.pinned)
        )
    print_table(table)


@handle_errors
def seen(
    state: Annotated[Path, typer.Argument(help="A RecordSampler (or loader) state, JSON.")],
    dataset: Annotated[str, typer.Option("--dataset", help="The dataset the run read.")],
    out: Annotated[Path, typer.Option("--out", help="The SQLite file to write.")],
    where: Annotated[
        str | None, typer.Option("--where", help="The run's keys= subset, as SQL.")
    ] = None,
    catalog: CatalogOpt = None,
) -> None:
    """Write the keys a training run consumed up to a saved sampler state to a SQLite
    file (table seen: key, times), to query with `catalog query --attach run=FILE`."""
    from shardcat.facade.provenance import load_state, write_seen

    with open_catalog(catalog) as cat, cat.dataset(dataset) as reader:
        n = write_seen(reader, load_state(state), out, where)
    typer.echo(f"{n} key(s) of {dataset} seen, written to {out}")


def register(app: typer.Typer) -> None:
    app.command()(delete)
    app.command()(undelete)
    app.command()(dedup)
    app.command()(tag)
    app.command()(untag)
    app.command()(tags)
    app.command()(seen)
