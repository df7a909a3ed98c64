"""datasets, stats, list: what the catalog holds; checkpoint: fold its WAL into the file."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection

import typer

from shardcat.cli.common import (
    catalog_path,
    cell,
    handle_errors,
    open_catalog,
    open_dataset,
    open_to_read,
    print_json,
    print_table,
)
from shardcat.cli.options import CatalogOpt, DatasetOrShardsArg, JsonOpt, ReadModeOpt
from shardcat.errors import CatalogError


@handle_errors
def datasets(
    catalog: CatalogOpt = None, json: JsonOpt = False, readonly: ReadModeOpt = True
) -> None:
    """List the datasets with their format, key rule and counts."""
    with open_to_read(catalog, readonly) as cat:
        infos = cat.datasets()
        origin = cat.snapshot_info()
    if origin is not None:
        typer.echo(f"{cat.path}: {origin.describe()}", err=True)
    if json:
        print_json([dataclasses.asdict(d) for d in infos])
        return
    if not infos:
        typer.echo("no datasets yet (catalog ingest FILES --dataset NAME)")
        return
    from rich.table import Table

    table = Table("dataset", "format", "key", "shards", "records", "fields", "indexed", "created")
    for d in infos:
        shards = f"{d.ready_shards}/{d.shards}" + (
            f" ({d.failed_shards} failed)" if d.failed_shards else ""
        )
        table.add_row(
            cell(d.name + (f" ({d.tags} tag{'s' * (d.tags > 1)})" if d.tags else "")),
            cell(d.format),
            cell(d.key_rule),
            shards,
            f"{d.records:,}" + (f" ({d.deleted:,} deleted)" if d.deleted else ""),
            cell(", ".join(d.fields)),
            cell(", ".join(d.indexed)),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(d.created_at)),
        )
    print_table(table)


@handle_errors
def stats(
    dataset: DatasetOrShardsArg,
    catalog: CatalogOpt = None,
    json: JsonOpt = False,
    readonly: ReadModeOpt = True,
) -> None:
    """Record counts per shard of one dataset (and the bad records set aside at ingest)."""
    with open_dataset(catalog, dataset, readonly) as (cat, reader):
        result = reader.get_stats()
        origin = cat.snapshot_info()
    if origin is not None:
        typer.echo(f"{cat.path}: {origin.describe()}", err=True)
    if json:
        print_json(result)
        return
    from rich.table import Table

    bad = result["bad_records_per_file"]
    aside = f", {result['bad_records']:,} bad records set aside" if bad else ""
    gone = result["deleted_records"]
    aside += f", {gone:,} deleted" if gone else ""
    table = Table(
        "shard",
        "records",
        *(["set aside"] if bad else []),
        title=cell(
            f"{reader.dataset}: {result['total_records']:,} records in "
            f"{result['total_files']} shards{aside}"
        ),
    )
    for name, n in result["records_per_file"].items():
        table.add_row(cell(name), f"{n:,}", *([f"{bad.get(name, 0):,}"] if bad else []))
    print_table(table)


@handle_errors
def list_features(
    dataset: DatasetOrShardsArg,
    catalog: CatalogOpt = None,
    json: JsonOpt = False,
    readonly: ReadModeOpt = True,
) -> None:
    """Features and types of the first record, and the dataset's SQL columns."""
    with open_dataset(catalog, dataset, readonly) as (cat, reader):
        features = reader.describe()
        first = reader.key_at(0) if len(reader) else None
        columns = cat.info(reader.dataset).fields
    if json:
        print_json({"first_key": first, "features": features, "sql_fields": columns})
        return
    if first is None:
        typer.echo(f"dataset {reader.dataset} has no records")
        return
    from rich.table import Table

    table = Table("feature", "type", "SQL column", title=cell(f"first record: {first}"))
    for name, kind in features.items():
        table.add_row(cell(name), cell(kind), cell(", ".join(_sql_columns(name, columns))))
    print_table(table)


def _sql_columns(feature: str, columns: Collection[str]) -> list[str]:
    """The SQL columns a feature fills: its own name, or for a JSON member the
    ``<feature>_<key>`` columns of its scalars (``json_score``, ``json_caption``)."""
    if feature in columns:
        return [feature]
    return [c for c in columns if c.startswith(feature + "_")]


@handle_errors
def checkpoint(catalog: CatalogOpt = None) -> None:
    """Copy every commit from the catalog's -wal file into the main file.

    Run it where the catalog is written before a copy of the file alone, or an
    --immutable / immutable=True open, has to see every commit (ingest and drop
    do it when they finish). Exit code 1 while readers still hold on to the WAL.
    """
    with open_catalog(catalog_path(catalog, announce=False)) as cat:  # the output names it
        if cat.store.backend.local_file is None:
            typer.echo(f"{cat.path}: a server catalog keeps its own log: nothing to fold")
            return
        complete = cat.checkpoint()
    if not complete:
        raise CatalogError(
            f"{cat.path}: readers still use the WAL, not every commit is in the main file "
            "yet; run `catalog checkpoint` again when they are done"
        )
    typer.echo(f"{cat.path}: every commit is in the main file")


def register(app: typer.Typer) -> None:
    app.command()(datasets)
    app.command()(stats)
    app.command("list")(list_features)
    app.command()(checkpoint)
