"""Options shared by every command, opening the catalog, error handling, and making
text safe to print."""

from __future__ import annotations

import functools
import json
import sys
import traceback
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from shardcat.catalog import Catalog
from shardcat.catalog.engine import ENV_VAR, locate
from shardcat.errors import CatalogError, ShardcatError

F = TypeVar("F", bound=Callable[..., Any])

CatalogOpt = Annotated[
    Path | None,
    typer.Option(
        "--catalog",
        "-c",
        envvar=ENV_VAR,
        show_envvar=True,
        help="Catalog file (default: ./shardcat.sqlite).",
    ),
]
DatasetArg = Annotated[str, typer.Argument(help="Dataset name (see `catalog datasets`).")]
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

_debug = False


def set_debug(on: bool) -> None:
    global _debug
    _debug = on


def open_catalog(path: Path | None, *, readonly: bool = False, immutable: bool = False) -> Catalog:
    """An existing catalog (commands other than ingest never create one).

    Commands that only read pass ``readonly=True`` (or ``immutable=True``): the
    file is then never created, upgraded or changed. Without either, it is
    opened for writing (and upgraded when older).
    """
    where = locate(path)
    if not where.is_file():
        raise CatalogError(
            f"no catalog at {where}: pass --catalog FILE, set ${ENV_VAR}, "
            "or create one with `catalog ingest`"
        )
    return Catalog(where, readonly=readonly or immutable, immutable=immutable)


_NAMED_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
# Characters that reorder or break what a terminal shows: bidirectional marks,
# embeddings, overrides and isolates, and the line and paragraph separators.
_LAYOUT_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029"
)


def printable(text: str) -> str:
    """``text`` with control characters made visible, for tables printed to a terminal.

    C0/C1 control characters and DEL (the escape sequences a terminal would
    obey) and the bidirectional overrides (which reorder what is shown) become
    Python-style escapes: ``"\\x1b[2J"`` prints as ``\\x1b[2J``, a newline as
    ``\\n``. Everything else is kept. JSON and CSV output must not use it.
    """
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[char])
        elif char in _LAYOUT_CONTROLS or unicodedata.category(char) == "Cc":
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


def cell(value: Any) -> Text:
    """A table cell: ``NULL`` for None, else the value as :func:`printable` text
    (a rich ``Text``, so brackets in data are never read as markup)."""
    return Text("NULL" if value is None else printable(str(value)))


def open_to_read(path: Path | None, readonly: bool) -> Catalog:
    """What the commands that only read open: read-only, or immutable when
    ``--immutable`` turned ``readonly`` (a :data:`ReadModeOpt`) off."""
    return open_catalog(path, readonly=True, immutable=not readonly)


def handle_errors(fn: F) -> F:
    """Turn shardcat errors into one line on stderr and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ShardcatError, OSError) as exc:
            if _debug:
                traceback.print_exc()
            message = (
                str(exc)
                if isinstance(exc, ShardcatError)
                else (f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc))
            )
            typer.echo(f"error: {message}", err=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def progress_bar(
    label: str,
    *,
    unit: str | None = None,
    elapsed: bool = True,
    transient: bool = False,
    disable: bool = False,
) -> Progress:
    """The commands' progress bar, on stderr: label, bar, done/total, then with
    ``unit`` a running record count (``task.fields["records"]``) and the time taken."""
    columns = [TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn()]
    if unit is not None:
        columns.append(TextColumn(unit + " {task.fields[records]:,} records"))
    if elapsed:
        columns.append(TimeElapsedColumn())
    return Progress(*columns, console=Console(stderr=True), transient=transient, disable=disable)
