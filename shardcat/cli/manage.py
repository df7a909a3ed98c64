"""``catalog delete`` and ``catalog undelete``: soft deletes of a dataset's records
(:meth:`shardcat.Catalog.delete`, :meth:`shardcat.Catalog.undelete`)."""

from __future__ import annotations

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


def register(app: typer.Typer) -> None:
    app.command()(delete)
    app.command()(undelete)
