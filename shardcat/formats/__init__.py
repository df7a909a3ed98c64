"""The container formats, one module each behind :class:`~shardcat.formats.base.Format`
(TFRecord, tar, RecordIO, Parquet), each writer beside its reader, and the registry
that finds them by name or by a shard's first bytes
(:mod:`shardcat.formats.registry`). Formats know bytes, never the catalog.

This package re-exports the interface (:mod:`shardcat.formats.base`) and the
registry: what the old ``shardcat.readers.formats`` module held.
"""

from __future__ import annotations

from shardcat.formats.base import (
    BAD_RECORDS,
    BadRecord,
    Columns,
    Entry,
    Format,
    LegacyRows,
    Location,
    Mismatch,
    ShardScan,
    float32_shortest,
    set_aside,
)
from shardcat.formats.registry import (
    ENTRY_POINT_GROUP,
    SNIFF_BYTES,
    detect_format,
    get_format,
    known_formats,
    other_format,
    register_format,
)

__all__ = [
    "BAD_RECORDS",
    "ENTRY_POINT_GROUP",
    "SNIFF_BYTES",
    "BadRecord",
    "Columns",
    "Entry",
    "Format",
    "LegacyRows",
    "Location",
    "Mismatch",
    "ShardScan",
    "detect_format",
    "float32_shortest",
    "get_format",
    "known_formats",
    "other_format",
    "register_format",
    "set_aside",
]
