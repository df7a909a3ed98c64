"""The Python side of the native scanners (``shardcat.formats._scan``): its
import, the switch that turns it off, the loop that hands it a TFRecord shard and
builds :class:`~shardcat.formats.base.Columns` from what it fills, the RecordIO
frame walk (:func:`recordio_frames`, driven by the RecordIO format) and the tar
header walk (:func:`tar_members`), whose members the tar format groups as usual.

The extension settles the well-formed common case; at any record it cannot
settle with certainty (damaged framing, a malformed or unusual protobuf wire, a
missing key) it stops, the pure-Python reference scan handles that one record
(so errors, their messages and offsets are the reference's), and the extension
continues after it. A scan that sets bad records aside (ingest's
``on_bad_record="skip"``) does so here too: the reference's error goes to the
format's ``skip`` function, which says where the extension goes on.
``SHARDCAT_NATIVE=0`` in the environment forces the
reference scan everywhere; without a built extension it is used anyway.

The two may list a record's field names in another order (wire order here,
protobuf's map order there); the store adds new field columns in name order,
so the catalog is the same either way.
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
from shardcat.formats.base import (
    BadRecord,
    Columns,
    Entry,
    float32_shortest,
    set_aside,
)
from shardcat.formats.tar_headers import BLOCK, ZERO, Cursor, Member, padded

__all__ = [
    "available",
    "enabled",
    "recordio_frames",
    "scan_buffer",
    "scan_stream",
    "scan_tfrecord",
    "tar_members",
]

_native: ModuleType | None
try:
    _native = importlib.import_module("shardcat.formats._scan")
except ImportError:  # no compiler at install time: the reference scan
    _native = None

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_HEADER, _FOOTER = 12, 4
_CHUNK = 4 << 20  # stream reads


def _masked_crc(data: bytes) -> int:
    assert _native is not None
    crc: int = _native.masked_crc(data)
    return crc


# the reference scan of one stream: (stream, path, options, size) -> entries
Reference = Callable[[Any, str, Mapping[str, Any], "int | None"], Iterator[Entry]]
# a format's way past a bad record, in a scan that sets them aside:
# (read(offset, n), size, error, options) -> where the scan goes on
Skip = Callable[[Callable[[int, int], bytes], int, CorruptRecordError, Mapping[str, Any]], int]


def available() -> bool:
    """Whether the extension was built and imports."""
    return _native is not None


def enabled() -> bool:
    """Whether scans use the extension: built, and not turned off by ``SHARDCAT_NATIVE=0``."""
    return _native is not None and os.environ.get("SHARDCAT_NATIVE", "1") != "0"


def _one(
    frame: bytes,
    offset: int,
    size: int | None,
    path: str,
    options: Mapping[str, Any],
    ref: Reference,
) -> Entry:
    """The record starting ``frame`` (at byte ``offset`` of the shard) through the
    reference scan, which raises its own error for it, moved to that offset;
    ``size``: the bytes left in the file from there (None for a stream)."""
    try:
        entry = next(ref(io.BytesIO(frame), path, options, size))
    except CorruptRecordError as exc:
        raise type(exc)(path, offset + (exc.offset or 0), exc.problem) from None
    entry.offset += offset
    return entry


def _frame_end(buf: Any, pos: int) -> int | None:
    """Where the frame at ``pos`` ends as far as the reference reads it (its header
    only when the length CRC is wrong); None when fewer than 12 bytes are there."""
    if len(buf) - pos < _HEADER:
        return None
    (length,) = _U64.unpack_from(buf, pos)
    if _masked_crc(bytes(buf[pos : pos + 8])) != _U32.unpack_from(buf, pos + 8)[0]:
        return pos + _HEADER
    return pos + _HEADER + length + _FOOTER


def _add(columns: Columns, entry: Entry) -> None:
    """Append the reference's entry to columns the extension is filling."""
    i = len(columns.offsets)
    columns.keys.append(entry.key)
    columns.offsets.append(entry.offset)
    columns.lengths.append(entry.length)
    if columns.checks is not None:
        columns.checks.append(entry.check)
    for name, value in entry.fields.items():
        column = columns.fields.setdefault(name, [])
        column.extend([None] * (i - len(column)))
        column.append(value)


class _Scan:
    """One shard's columns being filled by the extension."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.key: str | None = options.get("key", "key")
        self.want_fields = bool(options.get("fields", True))
        self.columns = Columns([], [], [], {}, checks=[])

    def run(self, buf: Any, pos: int, base: int) -> tuple[int, bool]:
        assert _native is not None
        c = self.columns
        result: tuple[int, bool] = _native.tfrecord(
            buf, pos, base, self.key, self.want_fields, c.keys, c.offsets, c.lengths, c.checks,
            c.fields, float32_shortest,
        )  # fmt: skip
        return result

    def done(self) -> Columns:
        n = len(self.columns.offsets)
        for column in self.columns.fields.values():
            column.extend([None] * (n - len(column)))
        return self.columns


def scan_buffer(
    buf: Any, path: str, options: Mapping[str, Any], ref: Reference, skip: Skip | None = None
) -> Columns:
    """The records of a whole TFRecord shard held in ``buf`` (bytes, mmap, ...);
    ``skip``: the format's way past a bad record when ``options`` set them aside."""
    scan = _Scan(options)
    pos = 0
    while True:
        pos, done = scan.run(buf, pos, 0)
        if done:
            return scan.done()
        end = _frame_end(buf, pos)
        frame = bytes(buf[pos : len(buf) if end is None else min(end, len(buf))])
        try:
            entry = _one(frame, pos, len(buf) - pos, path, options, ref)
        except CorruptRecordError as exc:
            if skip is None or set_aside(options) is None:
                raise
            pos = skip(lambda at, n: bytes(buf[at : at + n]), len(buf), exc, options)
            continue
        _add(scan.columns, entry)
        pos = entry.offset + _HEADER + entry.length + _FOOTER


def scan_tfrecord(
    path: str, options: Mapping[str, Any], ref: Reference, skip: Skip | None = None
) -> Columns:
    """The records of the plain TFRecord file at ``path``, mapped into memory."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return Columns([], [], [], checks=[])
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return scan_buffer(buf, path, options, ref, skip)


def scan_stream(stream: Any, path: str, options: Mapping[str, Any], ref: Reference) -> Columns:
    """The records of a TFRecord stream read sequentially in chunks (the decompressed
    stream of a GZIP TFRecord): offsets are stream offsets. A decompression error
    is raised where the reference would meet it: when a record needs bytes past it."""
    scan = _Scan(options)
    buf = bytearray()
    base = 0  # the stream offset of buf[0]
    pending: CorruptRecordError | None = None
    eof = False
    while True:
        pos, _ = scan.run(buf, 0, base)
        del buf[:pos]
        base += pos
        end = _frame_end(buf, 0)
        if end is None or end > len(buf):  # the next record needs more bytes
            if not eof:
                try:
                    chunk = stream.read(_CHUNK)
                except CorruptRecordError as exc:
                    pending, chunk = exc, b""
                eof = not chunk
                buf += chunk
                continue
            if pending is not None:
                raise pending
            if not buf:
                return scan.done()
            end = len(buf)  # truncated: the reference says how
        entry = _one(bytes(buf[:end]), base, None, path, options, ref)
        _add(scan.columns, entry)
        del buf[: _HEADER + entry.length + _FOOTER]
        base += _HEADER + entry.length + _FOOTER


# -- RecordIO ----------------------------------------------------------------------


def recordio_frames(buf: Any, pos: int, want_header: bool, columns: Columns) -> tuple[int, bool]:
    """Append the whole (cflag 0) frames of ``buf`` from ``pos`` to ``columns``
    (offsets, lengths and, with ``want_header``, the IRHeader fields of flag-0
    headers); returns where it stopped and whether that is the end of ``buf``.
    It stops at anything else (split records, bad magic, truncation, a label
    array): the caller hands that record to the reference walk."""
    assert _native is not None
    c = columns
    if c.checks is None:
        c.checks = [None] * len(c.offsets)
    result: tuple[int, bool] = _native.recordio(
        buf, pos, want_header, c.offsets, c.lengths, c.checks, c.fields, float32_shortest
    )
    return result


# -- tar ---------------------------------------------------------------------------

_TAR_BATCH = 1 << 16  # members per call of the extension
_NO_DATA = frozenset({b"1", b"2", b"3", b"4", b"5", b"6"})

# the reference walk: (cursor, path) -> members (and, in a scan that sets bad
# records aside, a BadRecord where it resynchronised after a damaged header)
TarReference = Callable[[Cursor, str], Iterator["Member | BadRecord"]]


def tar_members(mm: Any, cur: Cursor, path: str, ref: TarReference) -> Iterator[Member | BadRecord]:
    """The members of the archive mapped in ``mm`` (read through ``cur``, a cursor
    over it that the caller may read member data from after each member), as the
    reference walk ``ref`` gives them. The extension walks runs of plain headers;
    at a header it cannot settle the reference reads that one member (pax or GNU
    headers included) and the extension goes on after its data; after a global
    pax header, a sparse member, or at the end of the archive the reference walk
    reads the rest. A :class:`BadRecord` from the reference (a damaged header set
    aside) is passed on, and the extension goes on after it."""
    assert _native is not None
    size = len(mm)
    pos = 0
    while True:
        names: list[str] = []
        heads: list[int] = []
        datas: list[int] = []
        sizes: list[int] = []
        types: list[bytes] = []
        pos = _native.tar(mm, pos, _TAR_BATCH, names, heads, datas, sizes, types)
        for name, head, data, n, kind in zip(names, heads, datas, sizes, types, strict=True):
            cur.pos = data
            yield Member(name, kind, head, data, n)
        if len(names) == _TAR_BATCH:
            continue
        cur.pos = pos
        if size - pos < BLOCK or mm[pos : pos + BLOCK] == ZERO or mm[pos + 156] == ord("g"):
            yield from ref(cur, path)
            return
        members = ref(cur, path)
        member = next(members, None)
        if member is None:
            return
        if isinstance(member, BadRecord):  # set aside: go on where the walk resynchronised
            yield member
            pos = member.offset + (member.length or 0)
            continue
        span = 0 if member.type in _NO_DATA else padded(member.size)
        after = member.data_offset + span
        if member.header_offset != pos or member.extents is not None or after > size:
            # a global pax header on the way, a sparse member, or data past the end
            yield member
            yield from members
            return
        yield member
        pos = after
