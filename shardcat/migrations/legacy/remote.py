"""Legacy indexes on object storage: :func:`discover_remote`, the per-shard text
indexes (DALI/vahidk ``tfrecord2idx``, MXNet/DALI ``.idx``) stored beside remote
shards, found as :func:`shardcat.migrations.legacy.index.discover` finds them on disk.

**Listing.** A prefix (``s3://bucket/train/``, or a URL naming a "directory")
is one recursive listing of the objects below it (``max_depth`` levels, hidden
``.name`` folders left out); a glob (``s3://bucket/train/*.rec``) one listing
of the folder it starts in, restricted to the shards it matches (their index
files beside them); an object named explicitly one listing of its folder. No
object is asked for on its own (no HEAD per object): what the listing says of
each (size, ETag, Last-Modified) is kept for the migration (see
:func:`shardcat.sources.remote.listed_info`).

**Index files** are downloaded once each (they are small), read as the local
ones are, and paired with their shard by name exactly as on disk
(:func:`~shardcat.migrations.legacy.index.shard_names`), the shard's format told from its
first bytes (one ranged request of 512 bytes; the shards themselves are never
downloaded). Their entries are then verified through the remote source
(:mod:`shardcat.migrations.legacy.verify`) like those of tfd-utils indexes remapped to
object storage. A tfd-utils pickle on object storage is read too: its shards are
the objects of the same name beside it (or ``--remap`` targets).

Errors name the URL: a malformed index raises
:class:`~shardcat.errors.LegacyIndexError`, an index with no shard beside it is
skipped with the reason (raised when the index was named explicitly).
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from shardcat.errors import CatalogError, LegacyIndexError
from shardcat.formats.registry import SNIFF_BYTES, detect_format
from shardcat.migrations.legacy.index import (
    FORMAT_OF,
    TFD_TAR,
    TFD_TFRECORD,
    LegacyIndex,
    LegacyShard,
    ReaderFiles,
    is_index_name,
    not_known_reason,
    shard_names,
    sniff,
    text_rows,
)
from shardcat.migrations.legacy.pickles import load_pickle, tfd_rows
from shardcat.paths import brace_expand
from shardcat.sources.remote import RemoteInfo, RemoteSource, list_objects
from shardcat.sources.remote_file import download

__all__ = ["discover_remote"]

_MAGIC = "*?["


def _depth(url: str, root: str) -> int:
    """How many folders below ``root`` the object ``url`` is (0: directly in it)."""
    return url[len(root) :].strip("/").count("/")


def _hidden(url: str, root: str) -> bool:
    return any(part.startswith(".") for part in url[len(root) :].strip("/").split("/")[:-1])


class _Found:
    """What the listings found: every object listed, and what was asked for."""

    def __init__(self, options: Mapping[str, Any] | None) -> None:
        self.options = options
        self.objects: dict[str, RemoteInfo] = {}
        self.candidates: dict[str, None] = {}  # index files to read, in order
        self.explicit: set[str] = set()
        self.shard_filter: set[str] = set()

    def list(self, prefix: str, below: int | None) -> dict[str, RemoteInfo]:
        found = list_objects(prefix, self.options, below=below)
        self.objects.update(found)
        return found

    def walk(self, root: str, max_depth: int | None, wanted: Any) -> None:
        """The index files below the prefix ``root``: one listing."""
        root = root.rstrip("/") + "/"
        listed = self.list(root, None)  # one recursive listing; the depth told here
        if not listed:
            raise CatalogError(f"no objects match {root!r}")
        for url in listed:
            if max_depth is not None and _depth(url, root) > max_depth:
                continue
            if not _hidden(url, root) and wanted(posixpath.basename(url)):
                self.candidates.setdefault(url)

    def beside(self, folder: str, wanted: Any, listed: Mapping[str, RemoteInfo]) -> None:
        for url in listed:
            if posixpath.dirname(url) == folder and wanted(posixpath.basename(url)):
                self.candidates.setdefault(url)

    def given(self, url: str, max_depth: int | None, wanted: Any) -> None:
        if url.endswith("/"):
            self.walk(url, max_depth, wanted)
            return
        magic = [i for i, c in enumerate(url) if c in _MAGIC]
        folder = posixpath.dirname(url[: magic[0]] if magic else url)
        listed = self.list(folder + "/", 1)
        if magic:
            matches = [u for u in listed if u.count("/") == url.count("/")]
            matches = [u for u in matches if fnmatch.fnmatchcase(u, url)]
        else:
            matches = [url] if url in listed else []
            if not matches:  # a folder, then
                self.walk(url, max_depth, wanted)
                return
        if not matches:
            raise CatalogError(f"no objects match {url!r}")
        shards = [u for u in matches if not is_index_name(u) and ".sqlite" not in u]
        for u in matches:
            if u not in shards:
                self.explicit.add(u)
                self.candidates.setdefault(u)
        if shards:
            self.shard_filter.update(shards)
            self.beside(folder, wanted, listed)


def _detect(url: str, info: RemoteInfo, options: Mapping[str, Any] | None, tmp: str) -> str:
    """The format of the remote shard ``url``, from its first bytes (one ranged GET)."""
    source = RemoteSource(url, info.size, info.mtime_ns, info.fingerprint, options, use_cache=False)
    try:
        head = source.pread(min(SNIFF_BYTES, info.size), 0)
    finally:
        source.close()
    local = os.path.join(tmp, "head-" + posixpath.basename(url))
    with open(local, "wb") as f:
        f.write(head)
    return detect_format(local)


def _shard_beside(url: str, kind: str, found: _Found, tmp: str) -> str | None:
    """As :func:`shardcat.migrations.legacy.index._shard_beside`, from the listing."""
    folder, name = posixpath.split(url)
    stems: dict[str, list[str]] = {}
    for other in found.objects:
        if posixpath.dirname(other) == folder:
            base = posixpath.basename(other)
            stems.setdefault(os.path.splitext(base)[0], []).append(base)
    matches = []
    for candidate in shard_names(name, kind, stems):
        shard = f"{folder}/{candidate}"
        info = found.objects[shard]
        try:
            if info.size == 0 or _detect(shard, info, found.options, tmp) == FORMAT_OF[kind]:
                matches.append(shard)
        except CatalogError:
            continue
    return matches[0] if len(matches) == 1 else None


def _tfd(
    url: str,
    local: str,
    found: _Found,
    remap: Sequence[tuple[str, str]],
    onto: ReaderFiles | None = None,
) -> LegacyIndex:
    """A tfd-utils pickle on object storage: its shards beside it, or remapped (or
    placed onto a reader's files by name)."""
    try:
        data = load_pickle(local)
    except LegacyIndexError as exc:  # named by its URL, not the downloaded copy
        raise LegacyIndexError(url, exc.offset, exc.problem) from None
    layout, by_file = tfd_rows(data, url)
    kind = TFD_TFRECORD if layout == "tfrecord" else TFD_TAR
    index = LegacyIndex(url, kind, found.objects[url].mtime_ns, [])
    names = [posixpath.basename(f) for f in by_file]
    unique = len(set(names)) == len(names)
    for recorded, rows in by_file.items():
        target, how = None, "re-rooted beside the index"
        for old, new in sorted(remap, key=lambda r: len(r[0]), reverse=True):
            if recorded == old.rstrip("/") or recorded.startswith(old.rstrip("/") + "/"):
                target = new.rstrip("/") + recorded[len(old.rstrip("/")) :]
                how = f"remapped {old}={new}"
                break
        if target is None and unique:
            target = f"{posixpath.dirname(url)}/{posixpath.basename(recorded)}"
        if target is not None and target not in found.objects:
            target = None
        if onto is not None and unique:  # a reader's files exist: they were listed
            target, how = onto.place(recorded, target, how)
        if target is None:
            index.missing.append(recorded)
        else:
            index.shards.append(LegacyShard(target, recorded, how, rows))
    index.shards.sort(key=lambda s: s.path)
    return index


def _read(
    url: str,
    found: _Found,
    remap: Sequence[tuple[str, str]],
    tmp: str,
    onto: ReaderFiles | None = None,
) -> LegacyIndex | str:
    """The legacy index at ``url`` (downloaded once), or why it is not one."""
    local = os.path.join(tmp, "index-" + posixpath.basename(url))
    download(url, local, found.options)
    kind = sniff(local)
    if kind is None:
        return not_known_reason(local)
    if kind == "pickle":
        return _tfd(url, local, found, remap, onto)
    shard = _shard_beside(url, kind, found, tmp)
    if shard is None:
        raise CatalogError(
            f"{url}: cannot tell which shard this {kind} belongs to: expected its "
            "shard beside it, named like it without the index extension"
        )
    rows = text_rows(local, kind, url)
    mtime_ns = found.objects[url].mtime_ns
    return LegacyIndex(url, kind, mtime_ns, [LegacyShard(shard, shard, "beside", rows)])


def discover_remote(
    urls: Sequence[str],
    remap: Sequence[tuple[str, str]] = (),
    *,
    storage_options: Mapping[str, Any] | None = None,
    max_depth: int | None = None,
    pattern: str | Sequence[str] | None = None,
    onto: ReaderFiles | None = None,
) -> tuple[list[LegacyIndex], list[tuple[str, str]]]:
    """:func:`shardcat.migrations.legacy.index.discover` for URLs (prefixes, index files,
    shards or globs of them on object storage; see the module docs); ``onto``: a
    reader's files, that tfd-utils indexes' shards are placed onto by name."""
    if max_depth is not None and max_depth < 0:
        raise CatalogError(f"max_depth (--depth) must be 0 or more, not {max_depth}")
    names = None if pattern is None else [pattern] if isinstance(pattern, str) else list(pattern)

    def wanted(name: str) -> bool:
        if names is None:
            return is_index_name(name)
        return any(fnmatch.fnmatchcase(name, p) for p in names)

    found = _Found(storage_options)
    for given in urls:
        for one in brace_expand(given):
            found.given(one, max_depth, wanted)
    indexes: list[LegacyIndex] = []
    skipped: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="shardcat-legacy-") as tmp:
        for url in found.candidates:
            try:
                index = _read(url, found, remap, tmp, onto)
            except CatalogError as exc:
                if url in found.explicit or isinstance(exc, LegacyIndexError):
                    raise
                skipped.append((url, str(exc)))
                continue
            if isinstance(index, str):
                if url in found.explicit:
                    raise CatalogError(f"{url}: {index}")
                skipped.append((url, index))
                continue
            if found.shard_filter:
                index.shards = [s for s in index.shards if s.path in found.shard_filter]
                if not index.shards and url not in found.explicit:
                    continue
            indexes.append(index)
    return indexes, skipped
