"""query: read-only SQL over the catalog."""

from __future__ import annotations

import csv
import json as json_module
import sys
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from shardcat.catalog.names import DEFAULT_QUERY_MEMORY, DEFAULT_QUERY_TIMEOUT
from shardcat.cli.common import cell, handle_errors, open_to_read, print_table
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
    memory: Annotated[
        float,
        typer.Option(
            "--memory",
            metavar="MB",
            help="Stop a query whose rows would hold more than this (0: no limit); "
            "--csv and --json stream rows, so only one value must fit.",
        ),
    ] = DEFAULT_QUERY_MEMORY / 2**20,
    readonly: ReadModeOpt = True,
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            help="sqlite: the catalog's own database; duckdb: DuckDB over a columnar "
            "mirror of the datasets (kept beside the catalog, rebuilt when stale).",
        ),
    ] = "sqlite",
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
    if memory < 0:
        raise CatalogError(f"--memory takes megabytes (0: no limit), not {memory:g}")
    limits: dict[str, Any] = {
        "attach": attached,
        "timeout": timeout or None,
        "memory": int(memory * 2**20) or None,
        "engine": engine,
    }
    with open_to_read(catalog, readonly) as cat:
        if json or as_csv:
            with cat.query_rows(sql, param or [], **limits) as (columns, rows):
                (_print_json if json else _print_csv)(columns, rows)
            return
        result = cat.query(sql, param or [], **limits)
    from rich.table import Column, Table

    table = Table(*(Column(cell(name)) for name in result.columns))
    for row in result:
        table.add_row(*(cell(v) for v in row))
    print_table(table)
    typer.echo(f"{len(result)} row(s)", err=True)


def _print_csv(columns: list[str], rows: Iterator[tuple[Any, ...]]) -> None:
    writer = csv.writer(sys.stdout)
    writer.writerow(columns)
    writer.writerows(rows)


def _print_json(columns: list[str], rows: Iterator[tuple[Any, ...]]) -> None:
    """The rows as one JSON list of objects, written as they come (as ``print_json``
    writes a list)."""
    sep = "[\n  "
    for row in rows:
        text = json_module.dumps(dict(zip(columns, row, strict=True)), indent=2, default=str)
        sys.stdout.write(sep + text.replace("\n", "\n  "))
        sep = ",\n  "
    sys.stdout.write("[]\n" if sep.startswith("[") else "\n]\n")


def register(app: typer.Typer) -> None:
    app.command()(query)
