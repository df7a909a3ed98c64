"""ingest, drop, sample: putting datasets into the catalog (and taking them out)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from shardcat.catalog import Catalog, resolve_paths
from shardcat.catalog.catalog import KEEP
from shardcat.catalog.engine import locate
from shardcat.catalog.ingest import DUPLICATE_POLICIES, ShardOutcome
from shardcat.cli.common import CatalogOpt, DatasetArg, handle_errors, open_catalog, progress_bar
from shardcat.errors import CatalogError, IngestError
from shardcat.readers.formats import known_formats
from shardcat.sample import make_sample


@handle_errors
def ingest(
    paths: Annotated[list[str], typer.Argument(help="Shard files, directories or globs.")],
    dataset: Annotated[
        str | None, typer.Option("--dataset", "-d", help="Dataset name (default: from the files).")
    ] = None,
    catalog: CatalogOpt = None,
    workers: Annotated[
        int | None, typer.Option("--workers", "-w", help="Indexing processes (default: cores).")
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key", "-k", help="Feature holding each record's key (default: key, or as before)."
        ),
    ] = None,
    by_position: Annotated[
        bool, typer.Option("--by-position", help="Key records by position: '0'..'n-1'.")
    ] = False,
    format: Annotated[
        str | None,
        typer.Option(
            "--format",
            "-f",
            help=f"One of {', '.join(known_formats())}; default: detected from the bytes.",
        ),
    ] = None,
    no_fields: Annotated[
        bool, typer.Option("--no-fields", help="Do not extract scalar fields for SQL.")
    ] = False,
    on_duplicate: Annotated[
        str, typer.Option(help=f"Duplicate keys: {' | '.join(DUPLICATE_POLICIES)}.")
    ] = "error",
    rescan: Annotated[bool, typer.Option(help="Re-index unchanged shards too.")] = False,
    grouping: Annotated[
        str | None,
        typer.Option(
            help="tar: how members form samples: webdataset (default; split at the first "
            "dot of the basename) or tfd (at the last dot, as tfd-utils)."
        ),
    ] = None,
) -> None:
    """Index shards into the catalog (only new or changed shards are read).

    The dataset's shard set becomes exactly the matched files: new ones are
    indexed, changed ones re-indexed, missing ones dropped. CRCs are verified.
    Several processes may ingest the same files at once; each shard is
    indexed once.
    """
    files = resolve_paths(paths)
    if not files:
        raise CatalogError(f"no files match {paths}")
    where = locate(catalog, os.path.commonpath([str(Path(f).parent) for f in files]))
    with Catalog(where) as cat, progress_bar("ingest", unit="shards") as bar:
        task = bar.add_task("ingest", total=len(files), records=0)
        counted = {"records": 0}

        def progress(outcome: ShardOutcome, total: int) -> None:
            counted["records"] += outcome.records
            bar.update(task, advance=1, records=counted["records"], total=total)

        try:
            reader = cat.ingest(
                paths,
                dataset,
                format=format,
                key=None if by_position else (KEEP if key is None else key),
                fields=False if no_fields else None,
                workers=workers,
                on_duplicate=on_duplicate,
                rescan=rescan,
                grouping=grouping,
                progress=progress,
            )
        except IngestError as exc:
            bar.stop()
            for failure in exc.failures:
                typer.echo(f"failed: {failure.error}", err=True)
            raise CatalogError(
                f"{len(exc.failures)} shard(s) failed; the other shards are in the catalog"
            ) from None
        with reader:
            bar.update(task, completed=len(files))
            stats = reader.get_stats()
    typer.echo(
        f"dataset {stats['dataset']}: {stats['total_records']:,} records in "
        f"{stats['total_files']} shards ({counted['records']:,} indexed now) -> {where}"
    )


@handle_errors
def drop(dataset: DatasetArg, catalog: CatalogOpt = None) -> None:
    """Remove a dataset from the catalog (shard files are not touched)."""
    with open_catalog(catalog) as cat:
        cat.drop(dataset)
    typer.echo(f"dropped dataset {dataset}")


@handle_errors
def sample(
    directory: Annotated[Path, typer.Argument(help="Where to write the shards.")],
    shards: Annotated[int, typer.Option(help="Number of shard files.")] = 4,
    records: Annotated[int, typer.Option(help="Records in all.")] = 1000,
    image_bytes: Annotated[int, typer.Option(help="Size of each image payload.")] = 1024,
) -> None:
    """Write small generated TFRecord shards to try the catalog on.

    Records have key (rec_000000042), label (0..9), score, caption and image.
    """
    if shards < 1 or records < 0:
        raise CatalogError("--shards must be at least 1 and --records not negative")
    for path in make_sample(directory, shards=shards, records=records, image_bytes=image_bytes):
        typer.echo(path)


def register(app: typer.Typer) -> None:
    app.command()(ingest)
    app.command()(drop)
    app.command()(sample)
