"""Trust but verify: a shard's legacy entries checked against its file before they
are committed; any mismatch re-indexes that shard from its data instead (the
report says why).

This module is the format-independent part; each format checks its own rows
through the :class:`LegacyImport` capability (``check_entries``, given a
:class:`~shardcat.formats.base.LegacyRows`: TFRecord frames tiling the file, tar
headers, RecordIO offsets; see the format modules); a format without it is
always re-indexed from its data:

- compressed shards are always re-indexed (seek points come from the data);
- a shard modified after the index file was written (its mtime is newer) is
  re-indexed: a copy that keeps mtimes (``mv``, ``cp -a``, ``rsync -a``)
  keeps the import fast; a remote object's Last-Modified is when it was
  uploaded, not changed, so remote shards rely on the checks below (their
  frames tiling the object's exact size, the sample re-read, fetched as few
  merged ranged requests);
- every entry of a local shard is re-read by the format: its key confirmed
  against the record itself (TFRecord: the key feature, through the native scan
  where built; tar: the member's header and name) and its check computed, so a
  swapped entry is never imported; of a remote shard, a sample of ``sample``
  entries (default 64: the first, the last and evenly spaced ones; 0 = all),
  the others stored without a check (reads check their framing);
- a damaged record or header found on the way is a mismatch too;
- the key feature of tfd-utils TFRecord indexes is read off the first record
  (:func:`infer_key`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from shardcat.errors import CorruptRecordError, LegacyIndexError, ShardIOError
from shardcat.formats.base import Entry, Format, LegacyRows, Location, Mismatch
from shardcat.formats.registry import get_format
from shardcat.migrations.legacy.index import LegacyIndex, LegacyShard
from shardcat.readers.record_view import features
from shardcat.readers.view import STORAGE_OPTIONS
from shardcat.sources.compressed import compression_of, detect_compression
from shardcat.sources.local import shard_to_check
from shardcat.sources.remote import is_url

# Mismatch and LegacyRows are declared in shardcat.formats.base (the formats
# raise the one and are given the other).
__all__ = ["DEFAULT_SAMPLE", "LegacyImport", "infer_key", "verify_shard"]

DEFAULT_SAMPLE = 64


@runtime_checkable
class LegacyImport(Protocol):
    """A format whose shards' entries are imported from legacy index files."""

    def check_entries(self, shard: LegacyRows) -> tuple[list[Entry], int]:
        """The entries made from ``shard.rows``, checked against the file (the
        ``shard.picks`` re-read from it, with their checks); and how many were
        re-read. Anything that does not match raises
        :class:`~shardcat.formats.base.Mismatch` (the shard is then re-indexed
        from its data)."""


def _compression(path: str, options: Mapping[str, Any], size: int | None = None) -> str | None:
    """The shard's compression, from its first bytes (a remote shard's: one ranged read)."""
    if not is_url(path):
        return detect_compression(path)
    with shard_to_check(path, size, options.get(STORAGE_OPTIONS)) as source:
        return compression_of(source.pread(6, 0))


def _sample(n: int, k: int) -> list[int]:
    """Indexes of the entries to re-read: the first, the last and evenly spaced ones."""
    if k <= 0 or n <= k:
        return list(range(n))
    k = max(k, 2)
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _spell(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _key_candidates(fmt: Format, raw: bytes, options: Mapping[str, Any], key: str) -> list[str]:
    record = fmt.decode(raw, options)
    out = []
    for name, values in features(fmt, record).items():
        try:
            if values and _spell(values[0]) == key:
                out.append(name)
        except UnicodeDecodeError:
            continue
    return sorted(out, key=lambda n: (n != "key", n))


def infer_key(
    shards: Mapping[str, tuple[LegacyIndex, LegacyShard]], options: Mapping[str, Any]
) -> str:
    """The feature holding tfd-utils' keys: read off the first record found,
    ``key`` preferred when several features hold the key."""
    fmt = get_format("tfrecord")
    for path, (index, shard) in sorted(shards.items()):
        if not shard.rows or _compression(path, options) is not None:
            continue
        first = min(shard.rows, key=lambda e: e.offset)
        key, offset, length = first.key, first.offset, first.length
        try:
            with shard_to_check(path, None, options.get(STORAGE_OPTIONS)) as source:
                raw = fmt.read(source, Location(offset, length), False)
        except (CorruptRecordError, OSError, ShardIOError):
            continue
        try:
            candidates = _key_candidates(fmt, raw, options, key)
        except Exception as exc:  # protobuf's DecodeError: the index cuts the record wrong
            raise LegacyIndexError(
                index.path,
                0,
                f"entry {key!r} ({length} bytes at byte {offset} of {path}) does not decode "
                f"as a TFRecord Example ({exc}): the index's offset or length is wrong; "
                "index the shards from their data instead (catalog ingest)",
            ) from None
        if candidates:
            return candidates[0]
    return "key"


def verify_shard(
    format: str,
    index: LegacyIndex,
    shard: LegacyShard,
    st: os.stat_result,
    options: Mapping[str, Any],
    sample: int,
) -> tuple[list[Entry], int]:
    """The shard's entries from its legacy rows, checked against the file (raises
    :class:`~shardcat.formats.base.Mismatch`); also how many entries were re-read."""
    path = shard.path
    if _compression(path, options, st.st_size) is not None:
        raise Mismatch("compressed shard: its seek points are built from the data")
    if st.st_mtime_ns > index.mtime_ns and not is_url(path):
        raise Mismatch("the shard was modified after the legacy index was written")
    fmt = get_format(format)
    if not isinstance(fmt, LegacyImport):
        raise Mismatch(f"{fmt.TITLE} shards are not imported from legacy indexes")
    picks = _sample(len(shard.rows), sample if is_url(path) else 0)
    try:
        return fmt.check_entries(LegacyRows(path, st.st_size, shard.rows, picks, options))
    except CorruptRecordError as exc:
        raise Mismatch(f"{exc.problem} (at byte {exc.offset})") from None
    except UnicodeDecodeError as exc:
        raise Mismatch(f"a key is not UTF-8: {exc}") from None
