"""ingest, drop, sample: putting datasets into the catalog (and taking them out)."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from shardcat.cli.common import (
    RERUN_TO_FINISH,
    catalog_path,
    cli_message,
    handle_errors,
    open_catalog,
    print_json,
    progress_bar,
)
from shardcat.cli.options import (
    CatalogOpt,
    DatasetArg,
    JsonOpt,
    OnBadRecordOpt,
    OnDuplicateOpt,
    StorageOpt,
    WorkersOpt,
    storage_options,
)
from shardcat.errors import CatalogError, IngestError, ShardcatWarning

if TYPE_CHECKING:
    from shardcat.facade.ingest import ShardOutcome
    from shardcat.facade.tasks import IngestSummary

RERUN_INGEST = RERUN_TO_FINISH + " (shards already indexed are not read again)"
# What `catalog sample` writes (shardcat.sample.SAMPLE_FORMATS, checked when it runs).
_SAMPLE_FORMATS = "tfrecord, tar, recordio"


PathsArg = Annotated[list[str], typer.Argument(help="Shard files, directories or globs.")]
IngestDatasetOpt = Annotated[
    str | None, typer.Option("--dataset", "-d", help="Dataset name (default: from the files).")
]
KeyOpt = Annotated[
    str | None,
    typer.Option(
        "--key", "-k", help="Feature holding each record's key (default: key, or as before)."
    ),
]
ByPositionOpt = Annotated[
    bool, typer.Option("--by-position", help="Key records by position: '0'..'n-1'.")
]
FormatOpt = Annotated[
    str | None,
    typer.Option(
        "--format",
        "-f",
        help="tfrecord, tar, recordio, parquet or a plugin's format name; default: "
        "detected from the bytes of each file.",
    ),
]
NoFieldsOpt = Annotated[
    bool, typer.Option("--no-fields", help="Do not extract scalar fields for SQL.")
]
RescanOpt = Annotated[bool, typer.Option(help="Re-index unchanged shards too.")]
GroupingOpt = Annotated[
    str | None,
    typer.Option(
        help="tar: how members form samples: webdataset (default; split at the first "
        "dot of the basename) or tfd (at the last dot, as tfd-utils)."
    ),
]
WaitTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--wait-timeout",
        metavar="SECONDS",
        help="Give up after waiting this long for shards other live processes are "
        "indexing (default: wait; the wait names them).",
    ),
]
EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="Where shards are scanned: local (worker processes here) or ray (tasks "
        "spread over a Ray cluster's nodes; needs shardcat[ray]).",
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        metavar="ADDRESS",
        help="With --engine ray: the cluster to connect to (default: Ray's usual "
        "discovery: $RAY_ADDRESS, a cluster started on this host, else a new local one).",
    ),
]
OldStorageOpt = Annotated[list[str] | None, typer.Option("-o", hidden=True, metavar="KEY=VALUE")]
MkdirOpt = Annotated[
    bool, typer.Option("--mkdir", help="Create the catalog's directory when missing.")
]


@handle_errors(interrupted=RERUN_INGEST)
def ingest(
    paths: PathsArg,
    dataset: IngestDatasetOpt = None,
    catalog: CatalogOpt = None,
    workers: WorkersOpt = None,
    key: KeyOpt = None,
    by_position: ByPositionOpt = False,
    format: FormatOpt = None,
    no_fields: NoFieldsOpt = False,
    on_duplicate: OnDuplicateOpt = "error",
    on_bad_record: OnBadRecordOpt = "raise",
    rescan: RescanOpt = False,
    grouping: GroupingOpt = None,
    wait_timeout: WaitTimeoutOpt = None,
    storage_option: StorageOpt = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
    old_storage_option: OldStorageOpt = None,
    mkdir: MkdirOpt = False,
    json: JsonOpt = False,
) -> None:
    """Index shards into the catalog (only new or changed shards are read).

    The dataset's shard set becomes exactly the matched files: new ones are
    indexed, changed ones re-indexed, missing ones dropped. CRCs are verified.
    Several processes may ingest the same files at once; each shard is
    indexed once. The catalog (as for every command: --catalog, else
    $SHARDCAT_CATALOG, else ./shardcat.sqlite) is created if it does not exist.
    Interrupted (Ctrl-C, SIGTERM, SIGHUP: exit code 130, 143, 129), the same
    command run again finishes the work; workers always end with it.
    --engine ray runs each shard as a task on a Ray cluster's nodes, committing
    through the same claims (a SQLite catalog only when every node is on this host).
    --storage-option values are stored with the dataset without secrets (key,
    secret, token, password...).
    """
    from shardcat.facade import tasks
    from shardcat.facade.options import KEEP, IngestOptions

    if old_storage_option:
        warnings.warn(
            "-o is --storage-option here for now; spell it --storage-option (-o is "
            "--output in every other command)",
            ShardcatWarning,
            stacklevel=1,
        )
        storage_option = [*(storage_option or []), *old_storage_option]
    where = catalog_path(catalog, announce=False)  # the summary line names it
    opts = IngestOptions(
        format=format,
        key=None if by_position else (KEEP if key is None else key),
        fields=False if no_fields else None,
        workers=workers,
        on_duplicate=on_duplicate,
        rescan=rescan,
        wait_timeout=wait_timeout,
        grouping=grouping,
        on_bad_record=on_bad_record,
        engine=engine,
        ray_address=ray_address,
        options={"storage_options": storage_options(storage_option)} if storage_option else {},
    )
    shards = {"total": 0}
    try:
        with progress_bar("ingest", unit="shards", transient=json) as bar:
            task = bar.add_task("ingest", total=None, records=0)
            counted = {"records": 0}

            def progress(outcome: ShardOutcome, total: int) -> None:
                shards["total"] = total
                counted["records"] += outcome.records
                bar.update(task, advance=1, records=counted["records"], total=total)

            summary = tasks.ingest(where, paths, dataset, opts, progress=progress, make_dirs=mkdir)
            bar.update(task, completed=summary.shards, total=summary.shards)
    except IngestError as exc:
        raise CatalogError(_failed_shards(exc, shards["total"])) from None
    _say(summary, where, json=json, on_duplicate=on_duplicate)


def _say(summary: IngestSummary, where: Path | str, *, json: bool, on_duplicate: str) -> None:
    """The ingest's summary: one line (or its JSON), and what was dropped or set aside."""
    from shardcat.catalog.backend import backend_for

    if json:
        print_json({**dataclasses.asdict(summary), "catalog": backend_for(where).display})
        return
    typer.echo(
        f"dataset {summary.dataset}: {summary.records:,} records in "
        f"{summary.shards} shards ({summary.indexed_now:,} indexed now) "
        f"-> {backend_for(where).display}"
    )
    if summary.duplicates_dropped:
        typer.echo(
            f"{summary.duplicates_dropped:,} records with duplicate keys dropped "
            f"(--on-duplicate {on_duplicate})",
            err=True,
        )
    if summary.bad_records:
        typer.echo(
            f"{summary.bad_records:,} bad records set aside (catalog verify "
            f"{summary.dataset} lists them)",
            err=True,
        )


def _failed_shards(exc: IngestError, total: int) -> str:
    """The error line of an ingest some shards failed in (``total``: the shards of
    the set, as the progress callback said). One failed shard alone is its own
    error; otherwise each is listed first (``failed: ...``)."""
    total = max(total, len(exc.failures))
    failures = [cli_message(str(f.error), f.hint) for f in exc.failures]
    if len(failures) == 1 and total == 1:
        return failures[0]
    for failure in failures:
        typer.echo(f"failed: {failure}", err=True)
    others = "; the other shards are in the catalog" if total > len(failures) else ""
    return f"{len(failures)} shard(s) failed{others}"


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
    format: Annotated[
        str, typer.Option("--format", "-f", help=f"One of {_SAMPLE_FORMATS}.")
    ] = "tfrecord",
) -> None:
    """Write small generated shards (TFRecord, tar or RecordIO) to try the catalog on.

    TFRecord: records with key (rec_000000042), label (0..9), score, caption and
    image. tar: WebDataset samples rec_000000042.{jpg,cls,json} (the label in
    .cls, score and caption in .json). RecordIO: .rec files with an MXNet .idx
    each (keys 0..n-1), IRHeader label and id, the image as payload.
    """
    from shardcat.sample import SAMPLE_FORMATS, make_sample

    if shards < 1 or records < 0:
        raise CatalogError("--shards must be at least 1 and --records not negative")
    if format not in SAMPLE_FORMATS:
        raise CatalogError(f"--format must be one of {', '.join(SAMPLE_FORMATS)}, not {format!r}")
    with progress_bar("sample", count="records") as bar:
        task = bar.add_task("sample", total=records)
        paths = make_sample(
            directory,
            shards=shards,
            records=records,
            image_bytes=image_bytes,
            format=format,
            progress=lambda done: bar.update(task, completed=done),
        )
    for path in paths:
        typer.echo(path)


def register(app: typer.Typer) -> None:
    app.command()(ingest)
    app.command()(drop)
    app.command()(sample)
