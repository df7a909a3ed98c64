"""verify: re-check every record's bytes against the catalog."""

from __future__ import annotations

from typing import Annotated

import typer

from shardcat.cli.common import handle_errors, open_catalog, open_to_read, print_json, progress_bar
from shardcat.cli.options import CatalogOpt, DatasetArg, JsonOpt, ReadModeOpt
from shardcat.errors import CatalogError, masked


@handle_errors
def verify(
    dataset: DatasetArg,
    catalog: CatalogOpt = None,
    json: JsonOpt = False,
    readonly: ReadModeOpt = True,
    delete_bad: Annotated[
        bool,
        typer.Option(
            "--delete-bad",
            help="Soft-delete the bad records found (catalog undelete restores them).",
        ),
    ] = False,
) -> None:
    """Re-read every record of a dataset checking framing, CRCs and each record's
    stored check (after SQLite's quick_check of the catalog file itself).

    Reports each bad record with its file, byte offset and key; exit code 1 if
    any. Records set aside at ingest (--on-bad-record skip) are listed too;
    soft-deleted records are not re-read. --delete-bad soft-deletes the bad
    records, so readers, samplers and SQL skip them.
    """
    from shardcat.facade import tasks

    if delete_bad and not readonly:
        raise CatalogError("--delete-bad writes to the catalog: not with --immutable")
    with (
        open_catalog(catalog) if delete_bad else open_to_read(catalog, readonly) as cat,
        progress_bar("verify", count="records", disable=json) as bar,
    ):
        task = bar.add_task("verify", total=None)
        result = tasks.verify(
            cat,
            dataset,
            lambda done, total: bar.update(task, completed=done, total=total),
            delete_bad=delete_bad,
        )
        origin = cat.snapshot_info()
    if result.damage:
        typer.echo(f"{cat.path}: the catalog file is damaged (SQLite's quick_check):", err=True)
        for line in result.damage:
            typer.echo(f"  {line}", err=True)
        typer.echo("rebuild it: ingest the shards into a new catalog (or restore a copy)", err=True)
        raise typer.Exit(1)
    problems = result.problems
    if origin is not None:
        typer.echo(f"{cat.path}: {origin.describe()}", err=True)
    if json:
        print_json(
            [
                {"path": p.path, "offset": p.offset, "key": p.key, "problem": p.problem}
                for p in problems
            ]
            + [
                {
                    "path": b.shard,
                    "offset": b.offset,
                    "key": b.key,
                    "problem": b.reason,
                    "set_aside": True,
                }
                for b in result.set_aside
            ]
        )
    else:
        for p in problems:
            typer.echo(masked(f"{p.path}: at byte {p.offset}{_key(p.key)}: {p.problem}"))
        for b in result.set_aside:
            where = f"{b.shard}: at byte {b.offset}{_key(b.key)}"
            typer.echo(masked(f"{where}: set aside at ingest: {b.reason}"))
        aside = f", {len(result.set_aside)} set aside at ingest" if result.set_aside else ""
        typer.echo(
            f"{dataset}: {result.records:,} records checked, {len(problems)} bad{aside}", err=True
        )
        if result.deleted:
            typer.echo(f"{result.deleted} bad record(s) of {dataset} soft-deleted", err=True)
    if problems:
        raise typer.Exit(1)


def _key(key: str | None) -> str:
    return "" if key is None else f" (key {key!r})"


def register(app: typer.Typer) -> None:
    app.command()(verify)
