"""tar archives with damaged headers, for a scan that sets bad records aside
(ingest's ``on_bad_record="skip"``): the member walk that resynchronises after a
bad header (:func:`salvaging`) and the samples set aside with it
(:func:`set_aside_broken`).

A damaged header (bad checksum, a size or pax record that does not parse, data
running past the end) is set aside from its first header block to the next block
on a 512-byte boundary that is a valid header (or the end of the file); the walk
goes on there. Its member name, when the damaged block still holds a readable
one, names the sample it belonged to: that sample (its members on either side of
the damage) is set aside too, since it lost a member. When the name cannot be
read, a sample whose members lie on both sides of the damage is set aside. Only
plain archives are resynchronised (a compressed stream is not read back).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from shardcat.errors import CorruptRecordError
from shardcat.formats.base import BadRecord
from shardcat.formats.native import TarReference
from shardcat.formats.tar_headers import BLOCK, ZERO, Cursor, MapCursor, Member, checksum_ok, padded
from shardcat.formats.tar_rules import split_key

__all__ = ["salvaging", "set_aside_broken"]

# (key, members, first header, end of the last member's data, fields) of one sample
Found = tuple[str, list[Any], int, int, dict[str, Any]]


def _next_header(mm: Any, start: int, size: int) -> int:
    """The first block from ``start`` (a multiple of 512) that is a valid header;
    ``size`` when there is none."""
    at = start
    while at + BLOCK <= size:
        block = mm[at : at + BLOCK]
        if block != ZERO and checksum_ok(block):
            return at
        at += BLOCK
    return size


def _name_in(block: bytes) -> str | None:
    """The member name a damaged header block still holds, when it reads as one."""
    raw = block[:100].split(b"\0", 1)[0]
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return name if name and name.isprintable() else None


def salvaging(walk: TarReference) -> TarReference:
    """The member walk ``walk`` that, at a damaged header of a plain (memory-mapped)
    archive, yields a :class:`BadRecord` for it (``key``: the member name the damaged
    block holds, when readable; :func:`set_aside_broken` makes it a sample key) and
    goes on at the next valid header."""

    def members(cur: Cursor, path: str) -> Iterator[Member | BadRecord]:
        while True:
            try:
                yield from walk(cur, path)
                return
            except CorruptRecordError as exc:
                if exc.offset is None or not isinstance(cur, MapCursor):
                    raise
                at = exc.offset - exc.offset % BLOCK
                end = _next_header(cur.mm, at + BLOCK, cur.size)
                yield BadRecord(at, end - at, exc.problem, _name_in(cur.mm[at : at + BLOCK]))
                cur.pos = end

    return members


def _touches(found: Found, start: int, end: int) -> bool:
    return found[2] <= end and padded(found[3]) >= start


def set_aside_broken(
    found: Sequence[Found], breaks: Sequence[BadRecord], grouping: str
) -> tuple[list[Found], list[BadRecord]]:
    """The samples to index and the bad records, given the samples ``found`` around
    the damaged headers ``breaks`` (whose ``key`` holds the member name read from
    the damaged block): see the module docstring. Each bad record comes back with
    the key of the sample it took, when known."""
    dropped: set[int] = set()
    out: list[BadRecord] = []
    for broken in breaks:
        start = broken.offset
        end = start + (broken.length or 0)
        parts = None if broken.key is None else split_key(broken.key, grouping)
        near = [i for i, f in enumerate(found) if _touches(f, start, end)]
        if parts is not None:
            key: str | None = parts[0]
            hit = {i for i in near if found[i][0] == key}
        else:
            before = {found[i][0] for i in near if found[i][2] < start}
            after = {found[i][0] for i in near if padded(found[i][3]) > end}
            across = before & after
            hit = {i for i in near if found[i][0] in across}
            key = next(iter(across)) if len(across) == 1 else None
        dropped |= hit
        out.append(BadRecord(broken.offset, broken.length, broken.reason, key))
    return [f for i, f in enumerate(found) if i not in dropped], out
