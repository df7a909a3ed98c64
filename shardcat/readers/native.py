"""The Python side of the native TFRecord scanner (``shardcat.readers._scan``): its
import, the switch that turns it off, and the loop that hands it a shard and
builds :class:`~shardcat.readers.formats.Columns` from what it fills.

The extension settles the well-formed common case; at any record it cannot
settle with certainty (damaged framing, a malformed or unusual protobuf wire, a
missing key) it stops, the pure-Python reference scan handles that one record
(so errors, their messages and offsets are the reference's), and the extension
continues after it. ``SHARDCAT_NATIVE=0`` in the environment forces the
reference scan everywhere; without a built extension it is used anyway.
"""

from __future__ import annotations

import importlib
import io
import mmap
import os
import struct
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

from shardcat.errors import CorruptRecordError
from shardcat.readers.formats import Columns, Entry, Scalar, float32_shortest

__all__ = ["available", "enabled", "scan_tfrecord"]

_native: ModuleType | None
try:
    _native = importlib.import_module("shardcat.readers._scan")
except ImportError:  # no compiler at install time: the reference scan
    _native = None

_U64 = struct.Struct("<Q")
_HEADER, _FOOTER = 12, 4

# the reference scan of one stream: (stream, path, options, size) -> entries
Reference = Callable[[Any, str, Mapping[str, Any], "int | None"], Iterator[Entry]]


def available() -> bool:
    """Whether the extension was built and imports."""
    return _native is not None


def enabled() -> bool:
    """Whether scans use the extension: built, and not turned off by ``SHARDCAT_NATIVE=0``."""
    return _native is not None and os.environ.get("SHARDCAT_NATIVE", "1") != "0"


def _one(buf: Any, pos: int, path: str, options: Mapping[str, Any], ref: Reference) -> Entry:
    """The record at ``pos`` of ``buf`` through the reference scan (which raises
    its own error for it, moved to the record's offset in the shard)."""
    size = len(buf) - pos
    length = _U64.unpack_from(buf, pos)[0] if size >= _HEADER else 0
    frame = bytes(buf[pos : pos + min(size, _HEADER + length + _FOOTER)])
    try:
        entry = next(ref(io.BytesIO(frame), path, options, size))
    except CorruptRecordError as exc:
        raise type(exc)(path, pos + exc.offset, exc.problem) from None
    entry.offset += pos
    return entry


def _add(columns: Columns, entry: Entry) -> None:
    """Append the reference's entry to columns the extension is filling."""
    i = len(columns.offsets)
    columns.keys.append(entry.key)
    columns.offsets.append(entry.offset)
    columns.lengths.append(entry.length)
    for name, value in entry.fields.items():
        column = columns.fields.setdefault(name, [])
        column.extend([None] * (i - len(column)))
        column.append(value)


def scan_buffer(buf: Any, path: str, options: Mapping[str, Any], ref: Reference) -> Columns:
    """The records of a whole TFRecord shard held in ``buf`` (bytes, mmap, ...)."""
    assert _native is not None
    key: str | None = options.get("key", "key")
    want_fields = bool(options.get("fields", True))
    fields: dict[str, list[Scalar | None]] = {}
    columns = Columns([], [], [], fields)
    pos = 0
    while True:
        pos, done = _native.tfrecord(
            buf,
            pos,
            key,
            want_fields,
            columns.keys,
            columns.offsets,
            columns.lengths,
            fields,
            float32_shortest,
        )
        if done:
            break
        entry = _one(buf, pos, path, options, ref)
        _add(columns, entry)
        pos = entry.offset + _HEADER + entry.length + _FOOTER
    n = len(columns.offsets)
    for column in fields.values():
        column.extend([None] * (n - len(column)))
    return columns


def scan_tfrecord(path: str, options: Mapping[str, Any], ref: Reference) -> Columns:
    """The records of the plain TFRecord file at ``path``, mapped into memory."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return Columns([], [], [])
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return scan_buffer(buf, path, options, ref)
