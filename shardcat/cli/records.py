"""get, extract: read records and features out of the catalog."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from shardcat.cli.common import (
    CatalogOpt,
    DatasetArg,
    ReadModeOpt,
    handle_errors,
    open_to_read,
    printable,
)
from shardcat.errors import CatalogError, KeyNotFoundError
from shardcat.readers.reader import Reader

KeyArg = Annotated[str, typer.Argument(help="The record's key.")]

_MAGIC = [
    (b"\xff\xd8\xff", "jpg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
    (b"II*\x00", "tif"),
    (b"MM\x00*", "tif"),
]


def file_extension(data: bytes) -> str:
    """A file extension for ``data``, from magic numbers (images), else text/JSON/bin."""
    for magic, ext in _MAGIC:
        if data.startswith(magic):
            return ext
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "bin"
    return "json" if text.lstrip()[:1] in ("{", "[") else "txt"


_MAX_NAME_PART = 100  # characters of a key or feature name kept in a file name


def safe_name(text: str) -> str:
    """``text`` as one file name part: letters, digits, ``-``, ``_`` and ``.`` kept,
    every other character (``/``, NUL, controls, spaces...) becomes ``_``, cut
    to ``_MAX_NAME_PART`` characters. It never contains a path separator, so
    ``<key>_<feature>_<i>.<ext>`` stays inside the output directory."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text[:_MAX_NAME_PART])


def _show(data: bytes) -> str:
    """Bytes as text for a terminal: UTF-8 with control characters made visible."""
    return printable(data.decode("utf-8", "backslashreplace"))


def _features(reader: Reader, key: str) -> dict[str, list[Any]]:
    record = reader.get_record(key)
    if record is None:
        raise KeyNotFoundError(f"key {key!r} not in dataset {reader.dataset!r}")
    return reader.features(record)


@handle_errors
def get(
    dataset: DatasetArg,
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

    Example: catalog get train rec_000000042 image > img.jpg
    """
    with (
        open_to_read(catalog, readonly) as cat,
        cat.dataset(dataset) as reader,
    ):
        features = _features(reader, key)
    if feature not in features:
        have = ", ".join(printable(name) for name in sorted(features))
        raise CatalogError(f"record {key!r} has no feature {feature!r} (it has: {have})")
    values = features[feature]
    if not values:
        raise CatalogError(f"feature {feature!r} of {key!r} holds no values")
    if not -len(values) <= index < len(values):
        raise CatalogError(f"--index {index} out of range: {feature!r} has {len(values)} values")
    value = values[index]
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
    dataset: DatasetArg,
    key: KeyArg,
    catalog: CatalogOpt = None,
    output_dir: Annotated[
        Path, typer.Option("--output-dir", "-o", help="Directory for the files.")
    ] = Path("."),
    readonly: ReadModeOpt = True,
) -> None:
    """Save a record's bytes features as files (images get their extension); print the rest.

    Files are named <key>_<feature>_<i>.<ext>, with characters other than
    letters, digits, '-', '_' and '.' in the key and feature replaced by '_'
    (a name can never point outside --output-dir). Text printed has control
    characters shown as escapes.
    """
    with (
        open_to_read(catalog, readonly) as cat,
        cat.dataset(dataset) as reader,
    ):
        features = _features(reader, key)
    output_dir.mkdir(parents=True, exist_ok=True)
    safe_key = safe_name(key)
    written: set[str] = set()
    for name, values in sorted(features.items()):
        shown = printable(name)
        if values and isinstance(values[0], bytes):
            for i, data in enumerate(values):
                ext = file_extension(data)
                if ext == "txt" and len(data) <= 200:
                    typer.echo(f"{shown}[{i}] (text): {_show(data)}")
                    continue
                stem = f"{safe_key}_{safe_name(name)}_{i}"
                filename, n = f"{stem}.{ext}", 1
                while filename in written:  # two names that differ only in replaced characters
                    n += 1
                    filename = f"{stem}~{n}.{ext}"
                written.add(filename)
                path = output_dir / filename
                path.write_bytes(data)
                typer.echo(f"{shown}[{i}]: {len(data):,} bytes -> {printable(str(path))}")
        else:
            typer.echo(f"{shown}: {printable(str(values))}")


def register(app: typer.Typer) -> None:
    app.command()(get)
    app.command()(extract)
