"""export-index: DALI index files written from the catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardcat.cli.common import handle_errors, open_to_read
from shardcat.cli.options import CatalogOpt, DatasetArg, ReadModeOpt


@handle_errors
def export_index(
    dataset: DatasetArg,
    catalog: CatalogOpt = None,
    output_dir: Annotated[
        Path | None,
        typer.Option(
            "--output-dir",
            "-o",
            help="Write the index files here, keeping the shards' directory layout "
            "(default: beside the shards).",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace existing index files.")] = False,
    readonly: ReadModeOpt = True,
) -> None:
    """Write DALI index files for a dataset, one <shard stem>.idx per shard.

    RecordIO: what DALI's rec2idx writes ("<n>\\t<offset>" per record).
    TFRecord: what DALI's tfrecord2idx writes ("<offset> <size>" per record).
    tar: DALI's wds2idx format.
    The offsets come from the catalog; the shards are not re-read. Existing
    files (e.g. MXNet .idx files beside .rec shards) are kept unless --force.
    """
    from shardcat.facade.export import export_index as write_index_files

    with open_to_read(catalog, readonly) as cat:
        paths = write_index_files(cat, dataset, output_dir, overwrite=force)
    for path in paths:
        typer.echo(path)
    typer.echo(f"wrote {len(paths)} index file(s)", err=True)


def register(app: typer.Typer) -> None:
    app.command("export-index")(export_index)
