"""query: read-only SQL over the catalog."""

from __future__ import annotations

import csv
import sys
from typing import Annotated

import typer

from shardcat.catalog.names import DEFAULT_QUERY_TIMEOUT
from shardcat.cli.common import cell, handle_errors, open_to_read, print_json, print_table
from shardcat.cli.options import CatalogOpt, JsonOpt, ReadModeOpt
from shardcat.errors import CatalogError


@handle_errors
def query(
    sql: Annotated[str, typer.Argument(help="One SELECT statement.")],
    catalog: CatalogOpt = None,
    param: Annotated[
        list[str] | None,
        typer.Option("--param", "-p", help="Value for a ? placeholder (repeat in order)."),
    ] = None,
    json: JsonOpt = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV.")] = False,
    attach: Annotated[
        list[str] | None,
        typer.Option(
            "--attach",
            help="NAME=PATH: also query another SQLite file or a TensorDB directory "
            "as schema NAME, read-only (repeatable).",
        ),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            metavar="SECONDS",
            help="Stop the query after this long (0: no limit).",
        ),
    ] = DEFAULT_QUERY_TIMEOUT,
    readonly: ReadModeOpt = True,
) -> None:
    """Run read-only SQL; every dataset is a view named after it.

    Example: catalog query "SELECT label, count(*) FROM train GROUP BY label"

    With --attach emb=emb.db, a TensorDB's rows join a dataset's records:
    catalog query "SELECT t.key, e.position FROM train t JOIN emb.rows e ON e.key = t.key"
    --attach emb=emb.db

    Only SELECT runs, calling SQLite's built-in functions; the catalog file is
    never changed. Ctrl-C stops a query.
    """
    attached: dict[str, str] = {}
    for item in attach or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise CatalogError(f"--attach takes NAME=PATH, not {item!r}")
        attached[name] = path
    if timeout < 0:
        raise CatalogError(f"--timeout takes seconds (0: no limit), not {timeout:g}")
    with open_to_read(catalog, readonly) as cat:
        rows = cat.query(sql, param or [], attach=attached, timeout=timeout or None)
    if json:
        print_json([dict(zip(rows.columns, row, strict=True)) for row in rows])
    elif as_csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(rows.columns)
        writer.writerows(rows)
    else:
        from rich.table import Column, Table

        table = Table(*(Column(cell(name)) for name in rows.columns))
        for row in rows:
            table.add_row(*(cell(v) for v in row))
        print_table(table)
        typer.echo(f"{len(rows)} row(s)", err=True)


def register(app: typer.Typer) -> None:
    app.command()(query)
