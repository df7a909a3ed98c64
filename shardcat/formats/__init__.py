"""The container formats, one module each behind :class:`~shardcat.formats.base.Format`
(TFRecord, tar, RecordIO, Parquet), each writer beside its reader, and the registry
that finds them by name or by a shard's first bytes. Formats know bytes, never the
catalog."""

from __future__ import annotations

from shardcat.formats.base import (
    Entry,
    Format,
    Location,
    detect_format,
    get_format,
    known_formats,
    register_format,
)

__all__ = [
    "Entry",
    "Format",
    "Location",
    "detect_format",
    "get_format",
    "known_formats",
    "register_format",
]
