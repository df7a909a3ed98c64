"""Options shared by every command, opening the catalog, and error handling."""

from __future__ import annotations

import functools
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from shardcat.catalog import Catalog
from shardcat.catalog.engine import ENV_VAR, locate
from shardcat.errors import CatalogError, ShardcatError

F = TypeVar("F", bound=Callable[..., Any])

CatalogOpt = Annotated[
    Path | None,
    typer.Option(
        "--catalog",
        "-c",
        envvar=ENV_VAR,
        show_envvar=True,
        help="Catalog file (default: ./shardcat.sqlite).",
    ),
]
DatasetArg = Annotated[str, typer.Argument(help="Dataset name (see `catalog datasets`).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

_debug = False


def set_debug(on: bool) -> None:
    global _debug
    _debug = on


def open_catalog(path: Path | None) -> Catalog:
    """An existing catalog (commands other than ingest never create one)."""
    where = locate(path)
    if not where.is_file():
        raise CatalogError(
            f"no catalog at {where}: pass --catalog FILE, set ${ENV_VAR}, "
            "or create one with `catalog ingest`"
        )
    return Catalog(where)


def handle_errors(fn: F) -> F:
    """Turn shardcat errors into one line on stderr and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ShardcatError, OSError) as exc:
            if _debug:
                traceback.print_exc()
            message = (
                str(exc)
                if isinstance(exc, ShardcatError)
                else (f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc))
            )
            typer.echo(f"error: {message}", err=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def progress_bar(
    label: str,
    *,
    unit: str | None = None,
    elapsed: bool = True,
    transient: bool = False,
    disable: bool = False,
) -> Progress:
    """The commands' progress bar, on stderr: label, bar, done/total, then with
    ``unit`` a running record count (``task.fields["records"]``) and the time taken."""
    columns = [TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn()]
    if unit is not None:
        columns.append(TextColumn(unit + " {task.fields[records]:,} records"))
    if elapsed:
        columns.append(TimeElapsedColumn())
    return Progress(*columns, console=Console(stderr=True), transient=transient, disable=disable)
