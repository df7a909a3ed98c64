"""Trust but verify: a shard's legacy entries checked against its file before they
are committed; any mismatch re-indexes that shard from its data instead (the
report says why).

- compressed shards are always re-indexed (seek points come from the data);
- a shard modified after the index file was written (its mtime is newer) is
  re-indexed: a copy that keeps mtimes (``mv``, ``cp -a``, ``rsync -a``)
  keeps the import fast;
- TFRecord: the entries must tile the file exactly (each frame starts where
  the previous one ends, the last one ends at the end of the file), so a
  record missing from the index cannot go unnoticed;
- tar: members must follow each other header by header; where they do not,
  the headers in between are read, and a regular member with a key that the
  index lacks is a mismatch; so are members after the last indexed one;
- RecordIO: offsets must be unique and start at byte 0; the last record must
  end at the end of the file;
- a sample of ``sample`` entries per shard (default 64: the first, the last
  and evenly spaced ones; 0 = all) is re-read: TFRecord frames with their
  length and both CRCs and the key feature's value, tar headers (checksum,
  regular file, name, size, data offset), RecordIO magic and framing spanning
  exactly the record.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterator, Mapping
from typing import Any

from shardcat.errors import CorruptRecordError
from shardcat.legacy.index import TFRECORD_FRAME, LegacyIndex, LegacyShard
from shardcat.legacy.pickles import NO_FIELDS, NO_MEMBERS
from shardcat.readers import recordio as recordio_format
from shardcat.readers import tar as tar_format
from shardcat.readers.compressed import detect_compression
from shardcat.readers.formats import Entry, Format, get_format
from shardcat.readers.source import FileSource

__all__ = ["DEFAULT_SAMPLE", "Mismatch", "infer_key", "verify_shard"]

DEFAULT_SAMPLE = 64
_by_offset = operator.attrgetter("offset")
_by_length = operator.attrgetter("length")


class Mismatch(Exception):
    """The legacy entries of a shard do not match the file (the message says how)."""


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
    for name, values in fmt.features(record).items():
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
    for path, (_, shard) in sorted(shards.items()):
        if not shard.rows or detect_compression(path) is not None:
            continue
        first = min(shard.rows, key=lambda e: e.offset)
        key, offset, length = first.key, first.offset, first.length
        fd = os.open(path, os.O_RDONLY)
        try:
            raw = fmt.read(FileSource(fd), path, offset, length, False)
            candidates = _key_candidates(fmt, raw, options, key)
        except (CorruptRecordError, OSError):
            continue
        finally:
            os.close(fd)
        if candidates:
            return candidates[0]
    return "key"


def _tfrecord_entries(size: int, entries: list[Entry]) -> list[Entry]:
    """The entries in file order, checked to tile the file frame after frame."""
    entries.sort(key=_by_offset)
    starts = [*map(_by_offset, entries)]
    ends = [o + TFRECORD_FRAME + n for o, n in zip(starts, map(_by_length, entries), strict=True)]
    if [0, *ends[:-1]] != starts:  # find the first gap or overlap
        pos = 0
        for offset, end in zip(starts, ends, strict=True):
            if offset != pos:
                raise Mismatch(
                    f"the index has no record starting at byte {pos} (its next one is at "
                    f"byte {offset})"
                    if offset > pos
                    else f"records at byte {offset} overlap the one before"
                )
            pos = end
    end = ends[-1] if ends else 0
    if end != size:
        raise Mismatch(f"the index ends at byte {end}, the file at byte {size}")
    return entries


def _recordio_entries(size: int, rows: list[Any]) -> list[Entry]:
    rows.sort(key=lambda r: r[1])
    if not rows:
        if size:
            raise Mismatch("the index is empty, the file is not")
        return []
    if rows[0][1] != 0:
        raise Mismatch("the record at byte 0 has no line in the index")
    entries = []
    for (key, offset), nxt in zip(rows, [*(r[1] for r in rows[1:]), size], strict=True):
        if nxt - offset < recordio_format.HEADER:
            raise Mismatch(
                f"no record fits between bytes {offset} and {nxt} (duplicate offset, or the "
                "index runs past the end of the file)"
            )
        entries.append(Entry(key, offset, nxt - offset, NO_FIELDS, NO_MEMBERS))
    return entries


class _PreadCursor:
    """What :func:`shardcat.readers.tar.iter_members` walks, from any offset of a file."""

    def __init__(self, fd: int, size: int, pos: int) -> None:
        self.fd, self.size, self.pos = fd, size, pos

    def read(self, size: int) -> bytes:
        data = os.pread(self.fd, size, self.pos)
        self.pos += len(data)
        return data

    def skip(self, size: int) -> int:
        done = max(0, min(size, self.size - self.pos))
        self.pos += done
        return done


def _members(fd: int, size: int, path: str, start: int) -> Iterator[tar_format.Member]:
    return tar_format.iter_members(_PreadCursor(fd, size, start), path)


def _unindexed(member: tar_format.Member) -> Mismatch | None:
    if member.is_file and tar_format.split_key(member.name, "tfd") is not None:
        return Mismatch(
            f"member {member.name!r} (header at byte {member.header_offset}) is not in the index"
        )
    return None


def _walk_to(fd: int, size: int, path: str, start: int, target: int) -> tar_format.Member:
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


def _check_member(member: tar_format.Member, name: str, size: int, offset: int) -> None:
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


def _tar_entries(path: str, size: int, rows: list[Any], sample: int) -> tuple[list[Entry], int]:
    """Samples from tfd-utils' members (one per key, as the tar scan's tfd grouping
    has them), checked header by header where members do not follow each other."""
    rows.sort(key=lambda r: r[3])
    headers: list[int] = []
    checked: set[int] = set()
    fd = os.open(path, os.O_RDONLY)
    try:
        end = 0
        for i, (key, ext, name, offset, length) in enumerate(rows):
            if tar_format.split_key(name, "tfd") != (key, ext):
                raise Mismatch(f"entry {key!r}/{ext!r} does not match its member name {name!r}")
            if offset - tar_format.BLOCK == end:  # right after the member before: one header
                headers.append(end)
            elif offset - tar_format.BLOCK > end:  # other headers in between: read them
                member = _walk_to(fd, size, path, end, offset)
                _check_member(member, name, length, offset)
                headers.append(member.header_offset)
                checked.add(i)
            else:
                raise Mismatch(f"member data at byte {offset} overlaps the member before")
            end = offset + tar_format.padded(length)
        for member in _members(fd, size, path, end):  # nothing keyed after the last one
            problem = _unindexed(member)
            if problem is not None:
                raise problem
        for i in _sample(len(rows), sample):
            if i in checked:
                continue
            found = next(_members(fd, size, path, headers[i]), None)
            if found is None:
                raise Mismatch(f"the archive ends at byte {headers[i]}, before {rows[i][2]!r}")
            _check_member(found, rows[i][2], rows[i][4], rows[i][3])
            checked.add(i)
    finally:
        os.close(fd)
    # One sample per key over the whole archive, as tfd-utils' dict and the tfd
    # grouping of the tar scan have it (a key's members need not follow each other).
    by_key: dict[str, Entry] = {}
    for (key, ext, _, offset, length), header in zip(rows, headers, strict=True):
        entry = by_key.get(key)
        if entry is None:
            entry = by_key[key] = Entry(key, header, 0)
        entry.members.append((ext, offset, length))
        entry.length = max(entry.length, offset + length - entry.offset)
    return list(by_key.values()), len(checked)


def verify_shard(
    format: str,
    index: LegacyIndex,
    shard: LegacyShard,
    st: os.stat_result,
    options: Mapping[str, Any],
    sample: int,
) -> tuple[list[Entry], int]:
    """The shard's entries from its legacy rows, checked against the file (raises
    :class:`Mismatch`); also how many entries were re-read."""
    path = shard.path
    if detect_compression(path) is not None:
        raise Mismatch("compressed shard: its seek points are built from the data")
    if st.st_mtime_ns > index.mtime_ns:
        raise Mismatch("the shard was modified after the legacy index was written")
    fmt = get_format(format)
    try:
        if format == "tar":
            return _tar_entries(path, st.st_size, shard.rows, sample)
        if format == "tfrecord":
            entries = _tfrecord_entries(st.st_size, shard.rows)
        else:
            entries = _recordio_entries(st.st_size, shard.rows)
        picks = _sample(len(entries), sample)
        key_feature = options.get("key") if format == "tfrecord" else None
        fd = os.open(path, os.O_RDONLY)
        try:
            source = FileSource(fd)
            for i in picks:
                e = entries[i]
                raw = fmt.read(source, path, e.offset, e.length, True)
                if key_feature is not None and e.key is not None:
                    values = fmt.feature_list(fmt.decode(raw, options), key_feature)
                    found = _spell(values[0]) if values else None
                    if found != e.key:
                        raise Mismatch(
                            f"the record at byte {e.offset} has {key_feature}={found!r}, the "
                            f"index says {e.key!r}"
                        )
        finally:
            os.close(fd)
        return entries, len(picks)
    except CorruptRecordError as exc:
        raise Mismatch(f"{exc.problem} (at byte {exc.offset})") from None
    except UnicodeDecodeError as exc:
        raise Mismatch(f"a key is not UTF-8: {exc}") from None
