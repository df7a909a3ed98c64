"""The format registry: formats found by name (:func:`get_format`), by a shard's
first bytes (:func:`detect_format`), and registered by name (:func:`register_format`).

Formats are registered by name: the built-in ones below, any module calling
:func:`register_format`, and third-party packages through the
``shardcat.formats`` entry-point group (``name = "module:Class"``). A format
is imported on first use; one whose module cannot be imported is an error
naming what to install (as fsspec's registry does).
"""

from __future__ import annotations

import importlib
from importlib import metadata

from shardcat.errors import CatalogError, Hint
from shardcat.formats.base import Format
from shardcat.sources.compressed import read_head

__all__ = [
    "ENTRY_POINT_GROUP",
    "SNIFF_BYTES",
    "detect_format",
    "get_format",
    "known_formats",
    "other_format",
    "register_format",
]

ENTRY_POINT_GROUP = "shardcat.formats"

# name -> a Format, or "module:Class" (imported on first use) with its install hint
_registry: dict[str, Format | tuple[str, str | None]] = {
    "tfrecord": ("shardcat.formats.tfrecord:TFRecordFormat", None),
    "recordio": ("shardcat.formats.recordio:RecordIOFormat", None),
    "tar": ("shardcat.formats.tar:TarFormat", None),
}
_entry_points_read = False


def register_format(
    name: str,
    fmt: Format | type[Format] | str,
    *,
    install_hint: str | None = None,
    replace: bool = False,
) -> None:
    """Register a format under ``name``: a :class:`Format` instance or class, or
    ``"module:Class"`` imported on first use (``install_hint``: what to install
    when that import fails, e.g. ``"pip install 'shardcat[parquet]'"``).
    A name taken already is refused unless ``replace``."""
    _read_entry_points()
    if name in _registry and not replace:
        raise CatalogError(f"a format named {name!r} is registered already")
    if isinstance(fmt, type):
        fmt = fmt()
    if isinstance(fmt, Format):
        if name != fmt.NAME:
            raise CatalogError(f"format {fmt!r} is named {fmt.NAME!r}, not {name!r}")
        _registry[name] = fmt
    else:
        _registry[name] = (fmt, install_hint)


def _read_entry_points() -> None:
    """Add the formats of installed packages (``shardcat.formats`` entry points),
    once; a built-in or registered name wins."""
    global _entry_points_read
    if _entry_points_read:
        return
    _entry_points_read = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        _registry.setdefault(ep.name, (ep.value, f"reinstall the package that provides {ep.value}"))


def known_formats() -> list[str]:
    _read_entry_points()
    return sorted(_registry)


def get_format(name: str) -> Format:
    """The format registered under ``name`` (imported on first use)."""
    _read_entry_points()
    try:
        found = _registry[name]
    except KeyError:
        raise CatalogError(
            f"unknown format {name!r}; known formats: {', '.join(known_formats())}"
        ) from None
    if isinstance(found, Format):
        return found
    target, hint = found
    module_name, _, class_name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except ImportError as exc:
        raise CatalogError(
            f"format {name!r} needs {exc.name or module_name}, which is not installed"
            + (f": {hint}" if hint else "")
        ) from None
    except AttributeError:
        raise CatalogError(f"format {name!r}: {module_name} has no {class_name}") from None
    if not (isinstance(cls, type) and issubclass(cls, Format) and name == cls.NAME):
        raise CatalogError(f"{target} is not a shardcat Format named {name!r}")
    fmt = cls()
    _registry[name] = fmt
    return fmt


SNIFF_BYTES = 512


def detect_format(path: str) -> str:
    """Name of the format of the file at ``path``, from its first bytes (of the
    decompressed content for gzip/bz2/xz-compressed files)."""
    head = read_head(path, SNIFF_BYTES)
    formats = []
    for name in known_formats():
        try:
            formats.append(get_format(name))
        except CatalogError:
            continue  # a format that cannot be imported here cannot be this file's
    matches = [f.NAME for f in formats if f.sniff(head)]
    if len(matches) > 1:
        ext = [f.NAME for f in formats if f.NAME in matches and path.endswith(f.EXTENSIONS)]
        matches = ext or matches
    if not matches:
        if not head:
            ext_match = [f.NAME for f in formats if f.EXTENSIONS and path.endswith(f.EXTENSIONS)]
            if ext_match:
                return ext_match[0]
        raise CatalogError(
            f"{path}: cannot tell the container format from its first {len(head)} bytes;",
            hint=Hint.naming(
                "format=",
                "--format",
                before="pass ",
                after=f" (one of {', '.join(known_formats())})",
            ),
        )
    return matches[0]


def other_format(path: str, expected: Format) -> str | None:
    """``"x is a TFRecord file, not a tar file"`` when the first bytes of the local
    file ``path`` say it is of another known format than ``expected`` (why its scan
    failed, said plainly); else None."""
    try:
        found = detect_format(path)
    except (CatalogError, OSError):
        return None
    if found == expected.NAME:
        return None
    return f"{path} is a {get_format(found).TITLE} file, not a {expected.TITLE} file"
