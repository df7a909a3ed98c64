"""The ``catalog`` command: a thin typer layer over :mod:`shardcat`.

Each command opens the catalog, calls one public function and formats the
result. Errors are one line on stderr and exit code 1; set
``SHARDCAT_DEBUG=1`` (or pass ``--debug``) for the traceback.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from shardcat.cli import (
    convert,
    export,
    index,
    info,
    ingest,
    manage,
    migrate,
    records,
    serve,
    skill,
    snapshot,
    sql,
    verify,
)
from shardcat.cli.common import set_debug
from shardcat.cli.help import HelpCommand

app = typer.Typer(
    name="catalog",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(asked: bool) -> None:
    if asked:
        from shardcat import __version__

        typer.echo(f"catalog (shardcat) {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the full traceback of errors.")
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    """One SQLite catalog for every record of your TFRecord, tar, RecordIO and Parquet shards.

    Every command uses the catalog file given with --catalog, else
    $SHARDCAT_CATALOG, else ./shardcat.sqlite in the current directory, and
    names the file it used when --catalog did not. (Readers opened on shard
    paths in Python, like TFRecordRandomAccess, look beside the shards.)
    """
    set_debug(debug or bool(os.environ.get("SHARDCAT_DEBUG")))


for module in (
    ingest,
    manage,
    migrate,
    info,
    records,
    sql,
    index,
    verify,
    export,
    convert,
    skill,
    snapshot,
    serve,
):
    module.register(app)
for _command in app.registered_commands:
    _command.cls = HelpCommand


def main() -> None:
    app()


__all__ = ["app", "main"]
