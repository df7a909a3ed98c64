"""snapshot: a self-contained SQLite catalog of some datasets, for readers on many hosts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardcat.cli.common import handle_errors, open_to_read, print_json
from shardcat.cli.options import CatalogOpt, JsonOpt, ReadModeOpt


@handle_errors
def snapshot(
    datasets: Annotated[list[str], typer.Argument(help="The datasets to put in the snapshot.")],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="The snapshot file to write.", show_default=False)
    ],
    catalog: CatalogOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
    json: JsonOpt = False,
    readonly: ReadModeOpt = True,
) -> None:
    """Write a compact, self-contained SQLite catalog of DATASETS to --output.

    Meant for readers on many hosts (--immutable, Catalog(path, immutable=True)),
    e.g. published next to the data on a shared filesystem. Written to a
    temporary file beside it and renamed into place; shard paths are relative
    to it when the shards lie below its directory. Shards never indexed
    (pending, failed) are left out. An existing file is kept unless --force
    (readers holding it open then fail with "changed": they reopen).
    """
    with open_to_read(catalog, readonly) as cat:
        result = cat.snapshot(datasets, output, overwrite=force)
    if json:
        print_json(
            {
                "path": result.path,
                "snapshot_of": result.provenance.snapshot_of,
                "snapshot_at": result.provenance.snapshot_at,
                "bytes": result.bytes,
                "datasets": [d.__dict__ for d in result.datasets],
            }
        )
        return
    for d in result.datasets:
        typer.echo(f"{d.name}: {d.records:,} records in {d.shards} shards (version {d.version})")
        if d.awaiting_reindex:
            typer.echo(
                f"{d.name}: {d.awaiting_reindex} shard(s) awaiting a re-index: "
                "their last indexed version is in the snapshot"
            )
        if d.left_out:
            states = ", ".join(f"{n} {state}" for state, n in sorted(d.left_out.items()))
            typer.echo(
                f"{d.name}: left out {sum(d.left_out.values())} shard(s) never indexed ({states})"
            )
    typer.echo(f"{result.path}: {result.provenance.describe()} ({result.bytes:,} bytes)", err=True)


def register(app: typer.Typer) -> None:
    app.command()(snapshot)
