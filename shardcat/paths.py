"""Paths: the shard files a path, glob, directory or list of them stands for
(URLs too: brace ranges expanded here, globs through fsspec), and the default
name of a dataset over them."""

from __future__ import annotations

import glob
import os
import re
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from shardcat.catalog.schema import is_dataset_name
from shardcat.errors import CatalogError, ShardIOError

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _is_url(path: str) -> bool:
    return _URL.match(path) is not None and not path.startswith("file://")


__all__ = [
    "PathsLike",
    "as_patterns",
    "brace_expand",
    "default_dataset_name",
    "names_as_given",
    "require_regular",
    "resolve_paths",
]

PathsLike = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
# Shard numbering at the end of a file stem: "-00003", "_00003-of-00016", ".7".
_SHARD_SUFFIX = re.compile(r"(?:[-_.]+of|[-_.]*\d+)+$")
# Files that are never shards: catalogs (and their -wal/-shm), legacy index files
# (tfd-utils, MXNet/DALI, vahidk) and the lock and temporary files tfd-utils keeps
# beside its indexes.
_NOT_A_SHARD = re.compile(r"\.sqlite|\.(?:index|tar_index|idx|tfindex)(?:\.lock|\.tmp)?$")


def as_patterns(paths: PathsLike) -> list[str]:
    """``paths`` (one path or pattern, or several) as a list of strings."""
    if isinstance(paths, (str, os.PathLike)):
        return [os.fspath(paths)]
    return [os.fspath(p) for p in paths]


_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def brace_expand(pattern: str) -> list[str]:
    """``pattern`` with its braces expanded, as webdataset and the shell do:
    ``{000..099}`` is a range (the width of its first bound kept: ``000``, ``001``...),
    ``{a,b}`` a choice; several braces multiply. No brace: ``[pattern]``."""
    m = _BRACE.search(pattern)
    if m is None:
        return [pattern]
    body, head, tail = m.group(1), pattern[: m.start()], pattern[m.end() :]
    r = _RANGE.match(body)
    if r is not None:
        lo, hi = int(r.group(1)), int(r.group(2))
        width = len(r.group(1)) if r.group(1).startswith("0") else 0
        step = 1 if hi >= lo else -1
        choices = [str(i).zfill(width) for i in range(lo, hi + step, step)]
    elif "," in body:
        choices = body.split(",")
    else:
        choices = ["{" + body + "}"]  # not a brace expression: literal
        return [head + choices[0] + t for t in brace_expand(tail)]
    return [head + c + t for c in choices for t in brace_expand(tail)]


def _remote(pattern: str, storage_options: dict[str, Any] | None) -> list[str]:
    from shardcat.sources.remote import glob_urls

    return [
        u
        for u in glob_urls(pattern, storage_options)
        if not _NOT_A_SHARD.search(u.rsplit("/", 1)[-1])
    ]


def _local(pattern: str) -> list[str]:
    pattern = os.path.expanduser(pattern)
    if os.path.isdir(pattern):
        return [
            os.path.join(pattern, n)
            for n in os.listdir(pattern)
            if os.path.isfile(os.path.join(pattern, n)) and not _NOT_A_SHARD.search(n)
        ]
    if os.path.exists(pattern):
        require_regular(pattern, os.stat(pattern))
        return [pattern]
    return [
        m
        for m in glob.glob(pattern, recursive=True)
        if os.path.isfile(m) and not _NOT_A_SHARD.search(os.path.basename(m))
    ]


_SPECIAL = (
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISDIR, "directory"),
)


def require_regular(path: str, st: os.stat_result) -> None:
    """Refuse a shard ``path`` (its ``stat`` is ``st``, links followed) that is not a
    regular file: a FIFO, socket or device is never opened (opening a FIFO to read
    blocks until a writer comes). Raises :class:`~shardcat.errors.ShardIOError`."""
    if stat.S_ISREG(st.st_mode):
        return
    kind = next((name for test, name in _SPECIAL if test(st.st_mode)), "special file")
    raise ShardIOError(
        f"{path}: not a regular file (a {kind}): only regular files are shards", path
    )


def _expanded(pattern: str) -> list[str]:
    """``pattern``'s brace expansion (:func:`brace_expand`), unless it names an
    existing file as it is (a file may have braces in its name)."""
    if _is_url(pattern) or not os.path.exists(os.path.expanduser(pattern)):
        return brace_expand(pattern)
    return [pattern]


def resolve_paths(paths: PathsLike, storage_options: dict[str, Any] | None = None) -> list[str]:
    """Absolute, sorted, unique shard files for a path, a glob, a directory or a list of them.

    A directory or a glob stands for its files except catalogs (``*.sqlite*``),
    legacy index files (``*.index``, ``*.tar_index``, ``*.idx``, ``*.tfindex``)
    and tfd-utils' ``.lock``/``.tmp`` files beside them, and anything but regular
    files; a file named explicitly is taken as it is, but must be a regular file
    (:func:`require_regular`). Braces are expanded first, as webdataset and
    the shell do (``shard-{000000..000003}.tar``, ``{train,val}-*.tfrecord``), for
    local paths and URLs alike; ``file://`` URLs are local paths. Other URLs
    (``s3://bucket/train/*.tfrecord``) stay URLs, their globs listed through
    fsspec with ``storage_options``.
    """
    found: set[str] = set()
    for pattern in _patterns(paths):
        if _is_url(pattern):
            found.update(_remote(pattern, storage_options))
        else:
            found.update(os.path.abspath(m) for m in _local(pattern))
    return sorted(found)


def _patterns(paths: PathsLike) -> Iterator[str]:
    for given in as_patterns(paths):
        yield from _expanded(_without_file_scheme(given))


def names_as_given(paths: PathsLike) -> dict[str, str]:
    """Each local shard file :func:`resolve_paths` finds (absolute) -> its path as
    ``paths`` spell it (relative when given relative, as tfd-utils' index keeps it)."""
    return {
        os.path.abspath(m): m
        for pattern in _patterns(paths)
        if not _is_url(pattern)
        for m in _local(pattern)
    }


def _without_file_scheme(path: str) -> str:
    """A ``file://`` URL as the local path it names (``file:///data/x`` -> ``/data/x``)."""
    if not path.startswith("file://"):
        return path
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(path)
    if parts.netloc not in ("", "localhost"):
        raise CatalogError(f"{path}: a file:// URL names a file on this host (file:///path)")
    return unquote(parts.path)


def default_dataset_name(files: Sequence[str]) -> str:
    """A SQL-friendly name for a shard set: the common stem prefix, or the directory name."""
    stems = [Path(f.rsplit("/", 1)[-1]).name.split(".")[0] for f in files]
    # character-wise on purpose: "train-00001" and "train-00002" share "train-0000"
    prefix = _SHARD_SUFFIX.sub("", os.path.commonprefix(stems))  # noqa: RUF071
    parent = files[0].rsplit("/", 1)[0] if _is_url(files[0]) else str(Path(files[0]).parent)
    base = prefix or Path(parent).name or "dataset"
    slug = re.sub(r"[^A-Za-z0-9_]+", "_", base).strip("_") or "dataset"
    return slug if is_dataset_name(slug) else f"d_{slug}"
