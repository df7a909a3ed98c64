"""Formats (one module each behind :class:`~shardcat.readers.formats.Format`), byte
sources (:mod:`~shardcat.readers.source`, :mod:`~shardcat.readers.compressed`),
and the :class:`~shardcat.readers.reader.Reader` that combines them with the
store's lookups."""

from __future__ import annotations

from shardcat.readers.formats import (
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
