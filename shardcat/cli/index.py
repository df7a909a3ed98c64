"""index: an index on one SQL field of a dataset (or, with --drop, removing it)."""

from __future__ import annotations

from typing import Annotated

import typer

from shardcat.cli.common import handle_errors, open_catalog
from shardcat.cli.options import CatalogOpt, DatasetArg


@handle_errors
def index(
    dataset: DatasetArg,
    field: Annotated[
        str,
        typer.Argument(help="The SQL field (a column of the dataset's view, see `catalog list`)."),
    ],
    catalog: CatalogOpt = None,
    drop: Annotated[bool, typer.Option("--drop", help="Remove the field's index instead.")] = False,
) -> None:
    """Index one SQL field of a dataset, so queries filtering or sorting on it read a
    range of the index instead of every record.

    Example: catalog index train label, then
    catalog query "SELECT count(*) FROM train WHERE label < 10" reads only the
    matching entries of the index. Running it again changes nothing; every later
    ingest of the dataset keeps the index current, and `catalog drop` removes it
    with the dataset. `catalog datasets` lists the indexed fields. The index takes
    space in the catalog (about what the field's column takes) and is written by
    every ingest: --drop removes it.
    """
    with open_catalog(catalog) as cat:
        changed = cat.drop_index(dataset, field) if drop else cat.create_index(dataset, field)
    if drop:
        typer.echo(
            f"{dataset}.{field}: index dropped" if changed else f"{dataset}.{field}: no index"
        )
    else:
        typer.echo(
            f"{dataset}.{field}: indexed" if changed else f"{dataset}.{field}: already indexed"
        )


def register(app: typer.Typer) -> None:
    app.command()(index)
