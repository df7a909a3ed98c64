"""Paths: the shard files a path, glob, directory or list of them stands for, and
the default name of a dataset over them."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from pathlib import Path

from shardcat.catalog.schema import is_dataset_name

__all__ = ["PathsLike", "as_patterns", "default_dataset_name", "resolve_paths"]

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


def resolve_paths(paths: PathsLike) -> list[str]:
    """Absolute, sorted, unique shard files for a path, a glob, a directory or a list of them.

    A directory or a glob stands for its files except catalogs (``*.sqlite*``),
    legacy index files (``*.index``, ``*.tar_index``, ``*.idx``, ``*.tfindex``)
    and tfd-utils' ``.lock``/``.tmp`` files beside them; a file named
    explicitly is taken as it is.
    """
    found: set[str] = set()
    for pattern in as_patterns(paths):
        pattern = os.path.expanduser(pattern)
        if os.path.isdir(pattern):
            matches = [
                os.path.join(pattern, n)
                for n in os.listdir(pattern)
                if os.path.isfile(os.path.join(pattern, n)) and not _NOT_A_SHARD.search(n)
            ]
        elif os.path.exists(pattern):
            matches = [pattern]
        else:
            matches = [
                m
                for m in glob.glob(pattern, recursive=True)
                if os.path.isfile(m) and not _NOT_A_SHARD.search(os.path.basename(m))
            ]
        found.update(os.path.abspath(m) for m in matches)
    return sorted(found)


def default_dataset_name(files: Sequence[str]) -> str:
    """A SQL-friendly name for a shard set: the common stem prefix, or the directory name."""
    stems = [Path(f).name.split(".")[0] for f in files]
    # character-wise on purpose: "train-00001" and "train-00002" share "train-0000"
    prefix = _SHARD_SUFFIX.sub("", os.path.commonprefix(stems))  # noqa: RUF071
    base = prefix or Path(files[0]).parent.name or "dataset"
    slug = re.sub(r"[^A-Za-z0-9_]+", "_", base).strip("_") or "dataset"
    return slug if is_dataset_name(slug) else f"d_{slug}"
