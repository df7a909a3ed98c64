"""What every command shares besides its options (those are in :mod:`.options`):
which catalog it uses and opening it through the library, error handling (one line
per failure, its hint in the CLI's spelling), progress bars, and making text safe to
print."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sqlite3
import sys
import traceback
import unicodedata
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

import typer

from shardcat.catalog.names import DEFAULT_NAME, ENV_VAR
from shardcat.errors import Hint, ShardcatError, ShardcatWarning, masked

if TYPE_CHECKING:  # the library is imported when a command runs, not for --help
    from rich.progress import Progress
    from rich.text import Text

    from shardcat.facade.catalog import Catalog
    from shardcat.readers.reader import Reader

F = TypeVar("F", bound=Callable[..., Any])

_debug = False


def set_debug(on: bool) -> None:
    global _debug
    _debug = on


class _Invocation:
    """What the running command used: the catalog file, and the line saying which
    one it was when --catalog did not name it (printed when the command succeeds)."""

    catalog: str | None = None
    note: str | None = None


_now = _Invocation()


def catalog_path(option: str | Path | None, *, announce: bool = True) -> Path | str:
    """The catalog file of every command: ``--catalog``, else ``$SHARDCAT_CATALOG``,
    else ``./shardcat.sqlite`` in the current directory (:func:`locate`'s rule
    without a shard directory, the one ``Catalog()`` follows too).

    When ``--catalog`` was not given, the command ends with a line on stderr
    naming the file it used (``announce=False``: its own output names it). A
    PostgreSQL URL (there or in ``$SHARDCAT_CATALOG``) is returned as it is.
    """
    from shardcat.catalog.backend import backend_for

    backend = backend_for(option)
    where = backend.where
    _now.catalog = backend.display
    if option is None and announce:
        source = f"from ${ENV_VAR}" if os.environ.get(ENV_VAR) else f"default: ./{DEFAULT_NAME}"
        _now.note = f"catalog: {_now.catalog} ({source})"
    return where


def open_catalog(
    path: str | Path | None,
    *,
    readonly: bool = False,
    immutable: bool = False,
) -> Catalog:
    """The catalog of :func:`catalog_path`, opened as the library opens it
    (``Catalog``, through :mod:`shardcat.facade.opener`) but never creating a file
    or a directory (only ``catalog ingest`` creates one); commands that only read
    pass ``readonly=True`` or ``immutable=True``, so the file is never created,
    upgraded or changed."""
    from shardcat.facade.catalog import Catalog

    return Catalog(
        catalog_path(path), readonly=readonly, immutable=immutable, create=False, make_dirs=False
    )


def cli_message(text: str, hint: Hint | None = None) -> str:
    """A library message as the CLI shows it: its hint (the option or command meant)
    in the CLI's spelling (:meth:`~shardcat.errors.Hint.render`), on one line, its
    URLs without their secrets (:func:`masked`). The text itself is never rewritten."""
    text = masked(text)
    if hint is not None:
        text = hint.render(text)
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _describe(exc: Exception) -> str:
    """One line for an error a command did not handle itself."""
    if isinstance(exc, ShardcatError):
        return cli_message(str(exc), exc.hint)
    if isinstance(exc, OSError):
        why = exc.strerror or str(exc)
        return cli_message(why if exc.filename is None else f"{exc.filename}: {why}")
    db_error = getattr(exc, "orig", None) or exc  # SQLAlchemy wraps the sqlite3 error
    if isinstance(db_error, sqlite3.Error):
        return f"catalog {_now.catalog}: {db_error}" if _now.catalog else f"SQLite: {db_error}"
    return (
        f"unexpected {type(exc).__name__}: {exc} (a bug in shardcat; "
        "`catalog --debug ...` shows where)"
    )


@contextlib.contextmanager
def _plain_warnings() -> Iterator[None]:
    """shardcat's warnings as one line ``warning: ...`` on stderr (no source line)."""
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
            if issubclass(category, ShardcatWarning):
                hint = getattr(message, "hint", None)
                typer.echo(f"warning: {cli_message(str(message), hint)}", err=True)
            else:
                shown(message, category, *args, **kwargs)

        warnings.showwarning = show
        yield


def _fail(message: str, code: int, prefix: str = "error: ") -> typer.Exit:
    if _debug:
        traceback.print_exc()
    typer.echo(prefix + message, err=True)
    return typer.Exit(code)


def _silence_stdout() -> None:
    """After the reader of stdout went away: send what Python still flushes at exit
    to /dev/null instead of failing again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # not a real file (tests): nothing to flush
        pass


def _announce() -> None:
    if _now.note is not None:
        typer.echo(_now.note, err=True)


INTERRUPTED = "interrupted"
# What commands whose finished work survives an interruption say on Ctrl-C.
RERUN_TO_FINISH = "interrupted: run the same command again to finish"


@overload
def handle_errors(fn: F) -> F: ...
@overload
def handle_errors(*, interrupted: str = INTERRUPTED) -> Callable[[F], F]: ...
def handle_errors(fn: F | None = None, *, interrupted: str = INTERRUPTED) -> Any:
    """Run a command: every failure is one line ``error: ...`` on stderr and exit
    code 1 (a traceback only with ``--debug`` / ``$SHARDCAT_DEBUG``); Ctrl-C prints
    ``interrupted`` (commands whose work survives an interruption say how to
    finish it) and exits with 130; SIGTERM and SIGHUP do the same (``stopped by
    SIGTERM...``) and exit with 143 and 129. A command that did not get
    ``--catalog`` ends with a line naming the catalog it used.

    Use as ``@handle_errors`` or ``@handle_errors(interrupted="...")``.
    """

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from shardcat.catalog.processes import Stopped, stopping_on_signals

            _now.catalog = _now.note = None
            try:
                with stopping_on_signals(exit_after=False), _plain_warnings():
                    result = command(*args, **kwargs)
            except typer.Exit:  # a report with its own exit code (verify, migrate)
                _announce()
                raise
            except (typer.Abort, typer.TyperException):
                raise
            except Stopped as stop:
                said = f"stopped by {signal.Signals(stop.signum).name}"
                line = said + interrupted.removeprefix(INTERRUPTED)
                if not interrupted.startswith(INTERRUPTED):
                    line = f"{said}: {interrupted}"
                raise _fail(line, stop.exit_code, prefix="") from None
            except KeyboardInterrupt:
                raise _fail(interrupted, 130, prefix="") from None
            except BrokenPipeError as exc:  # `catalog query ... | head`: stop, quietly
                if exc.filename is not None:
                    raise _fail(_describe(exc), 1) from None
                _silence_stdout()
                raise typer.Exit(141) from None
            except Exception as exc:
                raise _fail(_describe(exc), 1) from None
            _announce()
            return result

        return wrapper  # type: ignore[return-value]

    return decorate if fn is None else decorate(fn)


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
    from rich.text import Text

    return Text("NULL" if value is None else printable(str(value)))


def open_to_read(path: str | Path | None, readonly: bool) -> Catalog:
    """What the commands that only read open: read-only, or immutable when
    ``--immutable`` turned ``readonly`` (a :data:`ReadModeOpt`) off."""
    return open_catalog(path, readonly=True, immutable=not readonly)


# Wide enough for any value: a table printed to a pipe or file is never cut.
_UNLIMITED_WIDTH = 1_000_000


def print_table(table: Any) -> None:
    """Print a rich table on stdout: fitted to a terminal's width, or with whole
    values (no column cut to ``…``) when stdout is a pipe or a file."""
    from rich.console import Console

    width = None if sys.stdout.isatty() else _UNLIMITED_WIDTH
    Console(width=width).print(table)


@contextlib.contextmanager
def open_dataset(
    option: str | Path | None, dataset: str, readonly: bool
) -> Iterator[tuple[Catalog, Reader]]:
    """The catalog (as :func:`open_to_read`) and the reader of ``dataset`` for the
    commands that read one (list, get, extract, stats). Without --catalog, a
    ``dataset`` that is no dataset of the catalog but names shard files (a path or
    glob, as ``tfd list FILE`` takes) reads those files: indexed, only when new or
    changed, into the catalog the readers opened on them use (beside the shards).
    """
    from shardcat.facade.dropin import index_shards

    failure: ShardcatError | None = None
    try:
        cat: Catalog | None = open_to_read(option, readonly)
    except ShardcatError as exc:
        if option is not None:
            raise
        cat, failure = None, exc
    if cat is not None and (option is not None or cat.store.has_dataset(dataset)):
        with cat, cat.dataset(dataset) as reader:
            yield cat, reader
        return
    with contextlib.ExitStack() as stack:
        if cat is not None:
            stack.enter_context(cat)
        shards = index_shards(dataset)
        if shards is None:  # no such files either: the catalog's own error
            if cat is not None:
                cat.dataset(dataset)  # raises: no dataset ... (it has: ...)
            raise failure or ShardcatError(f"no dataset {dataset!r}")
    shard_cat, reader = shards
    _now.catalog = str(shard_cat.path)
    _now.note = f"catalog: {shard_cat.path} (the one readers of these shards use)"
    with shard_cat, reader:
        yield shard_cat, reader


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def progress_bar(
    label: str,
    *,
    unit: str | None = None,
    count: str | None = None,
    transient: bool = False,
    disable: bool = False,
) -> Progress:
    """The commands' progress bar, on stderr: label, bar, done/total, then with
    ``unit`` a running record count (``task.fields["records"]``), and the time taken.
    With ``count`` (``"records"``) done/total are those, with thousands
    separators and their rate per second.
    It vanishes when the command fails or is interrupted, so what stays on the
    terminal (or in a log) is the one error line."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        Task,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.text import Text

    class _Progress(Progress):
        def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
            if exc_type is None:
                super().__exit__(exc_type, exc, tb)
            elif not self.disable:  # Progress.stop would also end a log with an empty line
                self.live.transient = True
                self.live.stop()

    class _Counted(ProgressColumn):
        """``1,234/5,678 records 2,345/s``."""

        def render(self, task: Task) -> Text:
            total = "?" if task.total is None else f"{int(task.total):,}"
            speed = task.finished_speed or task.speed
            rate = f" {speed:,.0f}/s" if speed else ""
            return Text(f"{int(task.completed):,}/{total} {count}{rate}")

    columns: list[ProgressColumn] = [TextColumn(f"[bold]{label}"), BarColumn()]
    columns.append(MofNCompleteColumn() if count is None else _Counted())
    if unit is not None:
        columns.append(TextColumn(unit + " {task.fields[records]:,} records"))
    columns.append(TimeElapsedColumn())
    return _Progress(*columns, console=Console(stderr=True), transient=transient, disable=disable)
