"""verify: re-check every record's bytes against the catalog."""

from __future__ import annotations

import typer

from shardcat.cli.common import handle_errors, open_to_read, print_json, progress_bar
from shardcat.cli.options import CatalogOpt, DatasetArg, JsonOpt, ReadModeOpt
from shardcat.errors import masked


@handle_errors
def verify(
    dataset: DatasetArg,
    catalog: CatalogOpt = None,
    json: JsonOpt = False,
    readonly: ReadModeOpt = True,
) -> None:
    """Re-read every record of a dataset checking framing and CRCs.

    Reports each bad record with its file and byte offset; exit code 1 if any.
    """
    from shardcat.facade import tasks

    with (
        open_to_read(catalog, readonly) as cat,
        progress_bar("verify", count="records", disable=json) as bar,
    ):
        task = bar.add_task("verify", total=None)
        result = tasks.verify(
            cat, dataset, lambda done, total: bar.update(task, completed=done, total=total)
        )
        origin = cat.snapshot_info()
    problems = result.problems
    if origin is not None:
        typer.echo(f"{cat.path}: {origin.describe()}", err=True)
    if json:
        print_json([{"path": p.path, "offset": p.offset, "problem": p.problem} for p in problems])
    else:
        for p in problems:
            typer.echo(masked(f"{p.path}: at byte {p.offset}: {p.problem}"))
        typer.echo(f"{dataset}: {result.records:,} records checked, {len(problems)} bad", err=True)
    if problems:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(verify)
