"""convert: tar archives -> TFRecord files (tfd-utils' ``tfd convert``)."""

from __future__ import annotations

import warnings
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from shardcat.cli.common import (
    RERUN_TO_FINISH,
    cli_message,
    handle_errors,
    print_json,
    progress_bar,
)
from shardcat.cli.options import JsonOpt, StorageOpt, WorkersOpt, storage_options
from shardcat.errors import CatalogError, ShardcatWarning, masked

if TYPE_CHECKING:
    from shardcat.convert import ConvertResult


@handle_errors(interrupted=RERUN_TO_FINISH)
def convert(
    inputs: Annotated[list[str], typer.Argument(help="Tar archives: files, directories or globs.")],
    output_dir: Annotated[
        Path | None,
        typer.Option(
            "--output-dir", "-o", help="Where to write the TFRecords (default: beside each tar)."
        ),
    ] = None,
    delete: Annotated[
        bool,
        typer.Option(
            "--delete",
            help="Delete each tar once its TFRecord was written, read back and verified.",
        ),
    ] = False,
    old_delete: Annotated[bool, typer.Option("-d", hidden=True)] = False,
    workers: WorkersOpt = None,
    grouping: Annotated[
        str,
        typer.Option(
            help="Member grouping: tfd (key = name without its last suffix, as tfd-utils) "
            "or webdataset (split at the first dot of the basename)."
        ),
    ] = "tfd",
    json_out: JsonOpt = False,
    storage_option: StorageOpt = None,
) -> None:
    """Convert tar archives to TFRecord files, one <archive stem>.tfrecord per archive.

    Each sample becomes one tf.train.Example: a 'key' feature plus one bytes
    feature per member (named after its extension), as `tfd convert` writes
    them. Compressed archives (.tar.gz, .tar.bz2, .tar.xz) work too. Each
    TFRecord is read back and checked before it replaces an older file, and
    --delete removes a tar only after that. The results ingest at once:
    `catalog ingest 'OUT/*.tfrecord'`. Archives on object storage
    (s3://bucket/train/*.tar, https://...) are read once each, into a local
    --output-dir.
    """
    from shardcat.facade import tasks

    if old_delete:
        warnings.warn(
            "-d is --delete here for now; spell it --delete (-d is --dataset in the "
            "other commands)",
            ShardcatWarning,
            stacklevel=1,
        )
        delete = True
    with progress_bar("convert", unit="archives", transient=json_out) as bar:
        task = bar.add_task("convert", total=None, records=0)
        counted = {"records": 0}

        def progress(result: ConvertResult, total: int) -> None:
            counted["records"] += result.records
            bar.update(task, advance=1, records=counted["records"], total=total)

        results = tasks.convert(
            inputs,
            output_dir,
            delete=delete,
            workers=workers,
            grouping=grouping,
            progress=progress,
            storage_options=storage_options(storage_option),
        )
    failed = [r for r in results if r.error is not None]
    if json_out:
        print_json([asdict(r) for r in results])
    else:
        for r in results:
            if r.error is None:
                typer.echo(masked(f"{r.source} -> {r.output} ({r.records:,} records)"))
    for r in failed:
        typer.echo(f"failed: {cli_message(str(r.error))}", err=True)
    if failed:
        raise CatalogError(
            f"{len(failed)} of {len(results)} archive(s) failed; their sources are kept"
        )
    if not json_out:
        deleted = sum(r.deleted for r in results)
        typer.echo(
            f"converted {len(results)} archive(s), {counted['records']:,} records"
            + (f"; deleted {deleted} source(s)" if deleted else ""),
            err=True,
        )


def register(app: typer.Typer) -> None:
    app.command()(convert)
