"""DALI index files written from the catalog (``catalog export-index``).

DALI's readers take one index file per shard. The catalog already knows every
record's offset, so the index files are written from it instead of re-reading
the shards: the catalog stays the single source of truth. The store gives the rows
(:mod:`shardcat.catalog.export`); each format writes its own lines
(the :class:`DaliIndex` capability, ``index_lines``, which a format has by
defining it; a format without it has no DALI index):

- RecordIO: what DALI's ``tools/rec2idx`` writes, ``<n>\\t<offset>`` per record
  (``n`` = 0, 1, ... in file order, ``offset`` = its first frame);
- TFRecord: what DALI's ``tools/tfrecord2idx`` writes, ``<offset> <size>`` per
  record (frame offset and frame size, both CRCs included);
- tar: DALI's ``wds2idx`` format, from the tar module.

The files list the records the catalog holds (records dropped as duplicates
at ingest are not in them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from shardcat.catalog import export as rows
from shardcat.catalog.sync import absolute_path
from shardcat.errors import REPLACE, CatalogError, StaleShardError
from shardcat.facade.catalog import Catalog
from shardcat.formats.base import Entry
from shardcat.formats.registry import get_format

__all__ = ["DaliIndex", "export_index", "index_name"]


@runtime_checkable
class DaliIndex(Protocol):
    """A format whose shards DALI reads with an index file."""

    def index_lines(self, entries: Sequence[Entry], options: Mapping[str, Any]) -> Iterator[str]:
        """The lines (without newlines) of the DALI index file of one shard, given its
        entries in file order (``members`` filled for PARTS formats) and the
        dataset's ``options``."""


def index_name(shard: str, extensions: tuple[str, ...]) -> str:
    """``<shard name without its format extension>.idx`` (``train.rec`` -> ``train.idx``)."""
    name = os.path.basename(shard)
    for ext in sorted(extensions, key=len, reverse=True):
        if name.endswith(ext) and len(name) > len(ext):
            return name[: -len(ext)] + ".idx"
    return name + ".idx"


def export_index(
    catalog: Catalog,
    dataset: str,
    out_dir: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
) -> list[Path]:
    """Write one DALI index file per shard of ``dataset``; returns their paths.

    Files are named ``<shard stem>.idx`` and go beside the shards, or under
    ``out_dir`` keeping the shards' directory layout below their common
    directory. Existing files are left alone (:class:`CatalogError`) unless
    ``overwrite``: beside ``.rec`` files they may be MXNet indexes with other keys.
    Every shard must be indexed (``ready``), uncompressed and unchanged on disk
    (else :class:`StaleShardError`).
    """
    info = catalog.info(dataset)
    fmt = get_format(info.format)
    if not isinstance(fmt, DaliIndex):
        raise CatalogError(f"DALI has no index file for {fmt.TITLE} shards")
    conn = catalog.store.reader_connection()
    shards = rows.shards_of(conn, dataset)
    by_position = info.key_rule == "position"
    files = [absolute_path(row[1], catalog.store.directory) for row in shards]
    for row, path in zip(shards, files, strict=True):
        if row[2] != "ready":
            raise CatalogError(
                f"{path} is {row[2]} in dataset {dataset!r}: ingest it first (catalog ingest)"
            )
        if row[5] is not None:
            raise CatalogError(
                f"{path} is {row[5]}-compressed: DALI index files describe uncompressed shards"
            )
        st = os.stat(path)
        if (st.st_size, st.st_mtime_ns) != (row[3], row[4]):
            raise StaleShardError(
                f"{path} changed after it was indexed: re-ingest it before exporting its index"
            )
    root = os.path.commonpath([os.path.dirname(f) for f in files]) if files else ""
    targets = []
    for path in files:
        directory = os.path.dirname(path)
        if out_dir is not None:
            directory = os.path.join(os.fspath(out_dir), os.path.relpath(directory, root))
        targets.append(Path(os.path.normpath(directory)) / index_name(path, fmt.EXTENSIONS))
    seen: dict[Path, str] = {}
    for path, target in zip(files, targets, strict=True):
        if target in seen:
            raise CatalogError(f"{seen[target]} and {path} would both get the index {target}")
        seen[target] = path
        if not overwrite and target.exists():
            raise CatalogError(f"{target} exists", hint=REPLACE)
    for row, target in zip(shards, targets, strict=True):
        entries = [
            Entry(str(row[6] + ordinal) if by_position else key, offset, length)
            for key, ordinal, offset, length in rows.records_of(conn, row[7], row[0])
        ]
        if fmt.PARTS:
            for ordinal, name, offset, length, extents in rows.members_of(conn, row[0]):
                member: tuple[Any, ...] = (name, offset, length)
                if extents is not None:  # a sparse member: its pieces (index_lines refuses)
                    member = (*member, tuple(map(tuple, json.loads(extents))))
                entries[ordinal].members.append(member)
        text = "".join(f"{line}\n" for line in fmt.index_lines(entries, info.options))
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        partial.write_text(text, encoding="utf-8", newline="\n")
        os.replace(partial, target)
    return targets
