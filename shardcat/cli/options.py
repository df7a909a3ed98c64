"""The option and argument declarations the commands share (``--catalog``, the
dataset argument, ``--json``, ``--readonly/--immutable``, a record's key,
``--on-duplicate``), declared once so every command spells them alike; and the
parsing of ``--storage-option KEY=VALUE``."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from shardcat.catalog.names import DEFAULT_NAME, DUPLICATE_POLICIES, ENV_VAR
from shardcat.errors import CatalogError

__all__ = [
    "CatalogOpt",
    "DatasetArg",
    "DatasetOrShardsArg",
    "JsonOpt",
    "KeyArg",
    "OnBadRecordOpt",
    "OnDuplicateOpt",
    "ReadModeOpt",
    "StorageOpt",
    "WorkersOpt",
    "storage_options",
]

# No envvar= here: catalog_path() reads $SHARDCAT_CATALOG, so it can tell a path
# given on the command line from a default and say which catalog it used.
CatalogOpt = Annotated[
    str | None,
    typer.Option(
        "--catalog",
        "-c",
        metavar="FILE",
        help=f"Catalog file (default: ${ENV_VAR}, else ./{DEFAULT_NAME} in the current "
        "directory). A PostgreSQL URL (postgresql://user@host/db) opens the catalog on "
        "that server.",
        show_default=False,
    ),
]
DatasetArg = Annotated[str, typer.Argument(help="Dataset name (see `catalog datasets`).")]
# list, get, extract, stats: a dataset, or shard files read directly (as `tfd list FILE`)
DatasetOrShardsArg = Annotated[
    str,
    typer.Argument(
        metavar="DATASET",
        help="Dataset name (see `catalog datasets`); without --catalog also shard files "
        "(a path or glob), indexed into the catalog the readers of those files use "
        "(shardcat.sqlite beside them).",
    ),
]
KeyArg = Annotated[str, typer.Argument(help="The record's key.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
# How the commands that only read open the catalog (never creating, upgrading or
# changing a file either way).
ReadModeOpt = Annotated[
    bool,
    typer.Option(
        "--readonly/--immutable",
        help="--readonly (default): read-only, seeing other processes' commits. "
        "--immutable: no locks and no -shm file, for a catalog nothing writes (e.g. a "
        "snapshot on a read-only or network filesystem); refused while its -wal file "
        "holds commits not yet in the main file (see `catalog checkpoint`).",
    ),
]
OnBadRecordOpt = Annotated[
    str,
    typer.Option(
        help="A damaged record: raise (fail its shard) | skip (index the shard's other "
        "records, set the bad one aside: catalog verify and stats list them)."
    ),
]
OnDuplicateOpt = Annotated[
    str, typer.Option(help=f"Duplicate keys: {' | '.join(DUPLICATE_POLICIES)}.")
]

# --storage-option for commands reading URLs (no short form: -o is --output)
StorageOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--storage-option",
        metavar="KEY=VALUE",
        help="KEY=VALUE for URLs (s3://, https://...): an fsspec storage option such as "
        "endpoint_url=http://host:9000 or anon=true; repeatable.",
    ),
]

# --workers of the commands that start processes: at least 1 (None: one per core)
WorkersOpt = Annotated[
    int | None,
    typer.Option(
        "--workers", "-w", min=1, metavar="N", help="Processes to use (default: one per core)."
    ),
]


def storage_options(pairs: list[str] | None) -> dict[str, Any]:
    """``--storage-option KEY=VALUE`` pairs as fsspec storage options: a value that
    reads as JSON (``true``, ``3``, ``{"a": 1}``) is that value, else the text."""
    options: dict[str, Any] = {}
    for pair in pairs or []:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise CatalogError(f"--storage-option takes KEY=VALUE, not {pair!r}")
        try:
            options[name] = json.loads(text)
        except ValueError:
            options[name] = text
    return options
