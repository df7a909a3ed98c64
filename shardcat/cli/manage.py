"""``catalog delete`` and ``catalog undelete``: soft deletes of a dataset's records
(:meth:`shardcat.Catalog.delete`, :meth:`shardcat.Catalog.undelete`); ``catalog
seen``: what a training run consumed, as a table (:mod:`shardcat.facade.provenance`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardcat.cli.common import handle_errors, open_catalog
from shardcat.cli.options import CatalogOpt, DatasetArg

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
    app.command()(seen)
