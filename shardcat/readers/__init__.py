"""Container formats (bytes on disk) and the SQL-backed reader classes."""

from __future__ import annotations

from shardcat.readers.formats import Entry, detect_format, get_format, known_formats

__all__ = ["Entry", "detect_format", "get_format", "known_formats"]
