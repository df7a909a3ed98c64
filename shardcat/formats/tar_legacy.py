"""Checking a tfd-utils tar index against its archive, for
``TarFormat.check_entries``: the index's members must follow each other header
by header; where they do not, the headers in between are read, and a regular
member with a key that the index lacks is a mismatch, as are members after the
last indexed one; a sample of members has its header re-read (checksum,
regular file, name, size, data offset) and its content's check computed."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

from shardcat.formats.base import Entry, Mismatch
from shardcat.formats.checks import crc32c
from shardcat.formats.tar_headers import BLOCK, Member, iter_members, padded
from shardcat.formats.tar_rules import split_key
from shardcat.sources.rawio import OPEN_FLAGS, pread_all

__all__ = ["legacy_samples"]


class _PreadCursor:
    """What :func:`~shardcat.formats.tar_headers.iter_members` walks, from any
    offset of a file."""

    def __init__(self, fd: int, size: int, pos: int) -> None:
        self.fd, self.size, self.pos = fd, size, pos

    def read(self, size: int) -> bytes:
        data = pread_all(self.fd, size, self.pos)
        self.pos += len(data)
        return data

    def skip(self, size: int) -> int:
        done = max(0, min(size, self.size - self.pos))
        self.pos += done
        return done


def _members(fd: int, size: int, path: str, start: int) -> Iterator[Member]:
    return iter_members(_PreadCursor(fd, size, start), path)


def _unindexed(member: Member) -> Mismatch | None:
    if member.is_file and split_key(member.name, "tfd") is not None:
        return Mismatch(
            f"member {member.name!r} (header at byte {member.header_offset}) is not in the index"
        )
    return None


def _walk_to(fd: int, size: int, path: str, start: int, target: int) -> Member:
    """The member whose data starts at ``target``, reading every header from
    ``start``; a keyed regular member on the way is one the index lacks."""
    for member in _members(fd, size, path, start):
        if member.data_offset == target:
            return member
        problem = _unindexed(member)
        if problem is not None:
            raise problem
        if member.data_offset > target:
            break
    raise Mismatch(f"no member header right before byte {target}, where the index has data")


def _check_member(member: Member, name: str, size: int, offset: int) -> None:
    if member.extents is not None:  # a legacy index holds one range: the stored bytes
        raise Mismatch(f"{member.name!r} is a sparse member (re-indexed from the data)")
    if (
        not member.is_file
        or member.name != name
        or member.size != size
        or member.data_offset != offset
    ):
        raise Mismatch(
            f"the header at byte {member.header_offset} is {member.name!r} ({member.size} "
            f"bytes from byte {member.data_offset}), the index says {name!r} ({size} bytes "
            f"from byte {offset})"
        )


def legacy_samples(
    path: str, size: int, rows: list[Any], picks: Sequence[int]
) -> tuple[list[Entry], int]:
    """Samples from tfd-utils' ``(key, ext, member name, data offset, size)`` rows
    (one per key, as the tar scan's ``tfd`` grouping has them), checked header by
    header where members do not follow each other, and the headers of the members
    at ``picks`` (positions in archive order) re-read, their content's check
    computed (the others keep none: reads check them by their header); with the
    number of members whose header was read."""
    rows.sort(key=lambda r: r[3])
    headers: list[int] = []
    checked: set[int] = set()
    fd = os.open(path, OPEN_FLAGS)
    try:
        end = 0
        for i, (key, ext, name, offset, length) in enumerate(rows):
            if split_key(name, "tfd") != (key, ext):
                raise Mismatch(f"entry {key!r}/{ext!r} does not match its member name {name!r}")
            if offset - BLOCK == end:  # right after the member before: one header
                headers.append(end)
            elif offset - BLOCK > end:  # other headers in between: read them
                member = _walk_to(fd, size, path, end, offset)
                _check_member(member, name, length, offset)
                headers.append(member.header_offset)
                checked.add(i)
            else:
                raise Mismatch(f"member data at byte {offset} overlaps the member before")
            end = offset + padded(length)
        for member in _members(fd, size, path, end):  # nothing keyed after the last one
            problem = _unindexed(member)
            if problem is not None:
                raise problem
        for i in picks:
            if i in checked:
                continue
            found = next(_members(fd, size, path, headers[i]), None)
            if found is None:
                raise Mismatch(f"the archive ends at byte {headers[i]}, before {rows[i][2]!r}")
            _check_member(found, rows[i][2], rows[i][4], rows[i][3])
            checked.add(i)
        checks = {i: crc32c(os.pread(fd, rows[i][4], rows[i][3])) for i in picks}
    finally:
        os.close(fd)
    # One sample per key over the whole archive, as tfd-utils' dict and the tfd
    # grouping of the tar scan have it (a key's members need not follow each other).
    by_key: dict[str, Entry] = {}
    for i, ((key, ext, _, offset, length), header) in enumerate(zip(rows, headers, strict=True)):
        entry = by_key.get(key)
        if entry is None:
            entry = by_key[key] = Entry(key, header, 0)
        entry.members.append((ext, offset, length, None, checks.get(i)))
        entry.length = max(entry.length, offset + length - entry.offset)
    return list(by_key.values()), len(checked)
