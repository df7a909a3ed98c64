"""get, extract: read records and features out of the catalog."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from shardcat.cli.common import handle_errors, open_dataset, printable
from shardcat.cli.options import CatalogOpt, DatasetOrShardsArg, KeyArg, ReadModeOpt
from shardcat.errors import CatalogError, NoSuchFeatureError

__all__ = ["extract", "get", "register"]


def _show(data: bytes) -> str:
    """Bytes as text for a terminal: UTF-8 with control characters made visible."""
    return printable(data.decode("utf-8", "backslashreplace"))


def _stream(chunks: Iterator[bytes], output: Path | None) -> None:
    """Write bytes as they are read: to ``output`` (removed if the read fails) or stdout."""
    if output is None:
        for chunk in chunks:
            sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
        return
    total = 0
    try:
        with open(output, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
                total += len(chunk)
    except BaseException:
        output.unlink(missing_ok=True)
        raise
    typer.echo(f"wrote {total:,} bytes to {output}", err=True)


@handle_errors
def get(
    dataset: DatasetOrShardsArg,
    key: KeyArg,
    feature: Annotated[str, typer.Argument(help="The feature to print or write.")],
    catalog: CatalogOpt = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the bytes to this file.")
    ] = None,
    index: Annotated[int, typer.Option(help="Which value of a multi-valued feature.")] = 0,
    readonly: ReadModeOpt = True,
) -> None:
    """Write one feature's bytes to stdout (or --output); numbers are printed.

    A tar member is written as it is read (a member of any size is never held
    in memory whole).

    Example: catalog get train rec_000000042 image > img.jpg
    """
    from shardcat.facade.records import feature_chunks, feature_value, file_extension

    with open_dataset(catalog, dataset, readonly) as (_, reader):
        if output is not None or not sys.stdout.isatty():  # a tar member: streamed
            chunks = feature_chunks(reader, key, feature, index)
            if chunks is not None:
                _stream(chunks, output)
                return
        try:
            value = feature_value(reader, key, feature, index)
        except NoSuchFeatureError as exc:
            have = ", ".join(printable(name) for name in exc.available or [])
            raise CatalogError(
                f"record {key!r} has no feature {feature!r} (it has: {have})"
            ) from None
    if not isinstance(value, bytes):
        typer.echo(value if output is None else "")
        if output is not None:
            output.write_text(f"{value}\n")
        return
    if output is not None:
        output.write_bytes(value)
        typer.echo(f"wrote {len(value):,} bytes to {output}", err=True)
    elif not sys.stdout.isatty():
        sys.stdout.buffer.write(value)  # redirected: the exact bytes
        sys.stdout.flush()
    elif file_extension(value) not in ("txt", "json"):
        raise CatalogError(
            f"{feature!r} holds {len(value):,} binary bytes: redirect stdout or pass -o FILE"
        )
    else:
        typer.echo(_show(value))  # a terminal: escape sequences shown, not obeyed


@handle_errors
def extract(
    dataset: DatasetOrShardsArg,
    key: KeyArg,
    catalog: CatalogOpt = None,
    output_dir: Annotated[
        Path, typer.Option("--output-dir", "-o", help="Directory for the files.")
    ] = Path("."),
    readonly: ReadModeOpt = True,
) -> None:
    """Save a record's bytes values as files (images get their extension); print the rest.

    Files are named <key>_<feature>_<i>.<ext>, with characters other than
    letters, digits, '-', '_' and '.' in the key and feature replaced by '_'
    (a name can never point outside --output-dir). Short text values (a tar
    sample's cls, a caption) are printed too, with control characters shown
    as escapes.
    """
    from shardcat.facade.records import SHOWN_TEXT
    from shardcat.facade.records import extract as extract_record

    with open_dataset(catalog, dataset, readonly) as (_, reader):
        items = extract_record(reader, key, output_dir)
    for item in items:
        shown = printable(item.feature)
        if item.path is None:
            typer.echo(f"{shown}: {printable(str(item.value))}")
        elif item.path.suffix == ".txt" and len(item.value) <= SHOWN_TEXT:
            where = printable(str(item.path))
            typer.echo(f"{shown}[{item.index}] (text): {_show(item.value)} -> {where}")
        else:
            size = len(item.value)
            typer.echo(f"{shown}[{item.index}]: {size:,} bytes -> {printable(str(item.path))}")


def register(app: typer.Typer) -> None:
    app.command()(get)
    app.command()(extract)
