"""tar headers, read for :mod:`shardcat.formats.tar`: the blocks of an archive
walked member by member (:func:`iter_members`), with pax and GNU extended
headers and GNU sparse maps.

Headers are parsed block by block, never through ``tarfile`` (which
would keep every member in memory): 512-byte blocks, the header checksum
verified (unsigned or signed sum, as tar implementations write either),
numbers in octal or base-256. Supported: ustar (``prefix`` + ``name``), GNU
(``././@LongLink`` headers ``L`` for long names and ``K`` for long link
names), pax (``x`` extended headers whose ``path`` and ``size`` override the
ustar fields, ``g`` global headers that apply to every later member, UTF-8
names), v7, and GNU sparse files (below). The archive ends at the first
all-zero block or at the end of the file when it falls on a header boundary.
A truncated header, a bad checksum, member data cut short, a malformed pax
record, a damaged sparse map or a name that is not UTF-8 raises
:class:`CorruptRecordError` naming the file and the byte offset of the
(first) header of that member. No declared size is trusted beyond the bytes
that exist: in a plain file a member (or extended header) whose size runs
past the end of the archive is an error before anything is read, and a
stream is read and skipped in pieces of at most 1 MiB, so a size field of
2**63 costs no allocation of that size.

**Sparse files** (GNU tar ``--sparse``), in all of GNU tar's formats: old
GNU (type ``S``: 4 ``(offset, numbytes)`` pairs in the header at byte 386,
21 more in each extension block while ``isextended`` is set, the real size
at byte 483), and pax versions 0.0 (``GNU.sparse.offset`` /
``GNU.sparse.numbytes`` records in turn), 0.1 (``GNU.sparse.map``) and 1.0
(``GNU.sparse.major``/``minor`` ``1``/``0``, the map as decimal lines at the
start of the data, padded to whole blocks). Such a member is indexed under
its real name (``GNU.sparse.name``, else the name it would have anyway: the
0.0 and old GNU header name) with its real size (``GNU.sparse.size`` or
``GNU.sparse.realsize``; the old GNU realsize field), as Python's ``tarfile``
reads it, and comes with its extents (:attr:`Member.extents`): its content
as pieces of stored data and holes of zeros, read back by
``TarFormat.read``. The map is checked: well-formed numbers (ASCII decimal
or tar octal/base-256, below 2**63), pieces in order and not overlapping,
inside the real size, their data exactly the member's stored bytes; a 1.0
map may not run past the member's data. Other sparse versions are refused.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from shardcat.errors import CorruptRecordError
from shardcat.formats.base import Extents
from shardcat.formats.checks import fallback_crc32c
from shardcat.sources.rawio import read_full

__all__ = [
    "BLOCK",
    "REGULAR",
    "ZERO",
    "Cursor",
    "Extents",
    "MapCursor",
    "Member",
    "StreamCursor",
    "checksum_ok",
    "expand",
    "iter_members",
    "padded",
    "parse_number",
    "read_exact",
]

BLOCK = 512
ZERO = bytes(BLOCK)
REGULAR = frozenset({b"0", b"\0", b"7"})
_FILE_TYPES = REGULAR | {b"S"}  # "S": an old GNU sparse file
# Types with no data blocks of their own (tarfile and GNU tar skip none for them).
_NO_DATA = frozenset({b"1", b"2", b"3", b"4", b"5", b"6"})
_GNU_TYPES = frozenset({b"L", b"K", b"S"})
_SIGNED_HEAD = struct.Struct("148b")
_SIGNED_TAIL = struct.Struct("356b")
_CHUNK = 1 << 20  # reads and skips of member data go in pieces of this size at most
_MAX_OFF = (1 << 63) - 1  # the largest file offset or size (off_t)
_DECIMAL = re.compile(r"[0-9]{1,19}")  # ASCII digits only (int() takes others)
_DECIMAL_BYTES = re.compile(rb"[0-9]{1,19}")
_OLD_GNU_MAP = 386  # 4 (offset, numbytes) pairs of 12-byte numbers, then isextended, realsize
_OLD_GNU_EXT = 21  # pairs in an extension block, then its isextended byte at 504
_PAX_00 = ("GNU.sparse.offset", "GNU.sparse.numbytes")


# -- headers -------------------------------------------------------------------


@dataclass(slots=True)
class Member:
    """One archive member: ``header_offset`` is its first header block (extended
    headers included), ``data_offset`` where its bytes start."""

    name: str
    type: bytes
    header_offset: int
    data_offset: int
    size: int
    #: For a sparse member: its content as :data:`Extents` (``size`` is then the
    #: real size, ``data_offset`` the first stored byte); None for any other member.
    extents: Extents | None = None

    @property
    def is_file(self) -> bool:
        return self.type in _FILE_TYPES and not self.name.endswith("/")

    @property
    def stored_size(self) -> int:
        """How many bytes of data the member has in the archive from ``data_offset``."""
        if self.extents is None:
            return self.size
        return sum(length for at, length in self.extents if at >= 0)


class Cursor(Protocol):
    """Where member headers are read from: ``pos`` counts the bytes read or skipped;
    ``size`` is where the archive ends, None when the cursor cannot know (a stream)."""

    pos: int

    @property
    def size(self) -> int | None: ...

    def read(self, size: int) -> bytes: ...

    def skip(self, size: int) -> int: ...


class MapCursor:
    """A plain archive, memory-mapped: headers are slices, skipped data is never touched."""

    def __init__(self, mm: mmap.mmap | bytes, size: int) -> None:
        self.mm = mm
        self.size = size
        self.pos = 0

    def read(self, size: int) -> bytes:
        data = self.mm[self.pos : self.pos + size]
        self.pos += len(data)
        return data

    def skip(self, size: int) -> int:
        done = min(size, self.size - self.pos)
        self.pos += done
        return done


class StreamCursor:
    """Any binary stream read sequentially (decompressed archives)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.pos = 0
        self.size: int | None = None

    def read(self, size: int) -> bytes:
        data = read_full(self.stream, size)
        self.pos += len(data)
        return data

    def skip(self, size: int) -> int:
        done = 0
        while done < size:
            chunk = self.read(min(1 << 20, size - done))
            if not chunk:
                break
            done += len(chunk)
        return done


def checksum_ok(block: bytes) -> bool:
    field_ = block[148:156].split(b"\0", 1)[0].strip()
    if not field_ or not all(48 <= c <= 55 for c in field_):
        return False
    stored = int(field_, 8)
    unsigned = sum(block[:148]) + 256 + sum(block[156:])
    if stored == unsigned:
        return True
    signed = sum(_SIGNED_HEAD.unpack_from(block)) + 256 + sum(_SIGNED_TAIL.unpack_from(block, 156))
    return stored == signed


def parse_number(raw: bytes, path: str, offset: int, what: str) -> int:
    if raw[:1] in (b"\x80", b"\xff"):  # GNU base-256
        value = int.from_bytes(raw[1:], "big")
        if raw[0] == 0xFF:
            value -= 256 ** (len(raw) - 1)
        return value
    text = raw.split(b"\0", 1)[0].strip()
    try:
        return int(text or b"0", 8)
    except ValueError:
        raise CorruptRecordError(path, offset, f"bad {what} field {raw!r} in tar header") from None


def _text(raw: bytes, path: str, offset: int, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptRecordError(path, offset, f"{what} {raw!r} is not UTF-8") from None


def _cstr(raw: bytes) -> bytes:
    return raw.split(b"\0", 1)[0]


def _pax(data: bytes, path: str, offset: int) -> list[tuple[str, str]]:
    """Records ``"<len> <key>=<value>\\n"`` of a pax extended header, in order
    (GNU sparse 0.0 repeats its keys)."""
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space]) if space > pos else 0
        except ValueError:
            length = 0
        record = data[pos : pos + length]
        if length <= 0 or len(record) < length or not record.endswith(b"\n"):
            raise CorruptRecordError(path, offset, f"malformed pax record at +{pos}")
        key, eq, value = record[space - pos + 1 : -1].partition(b"=")
        if not eq:
            raise CorruptRecordError(path, offset, f"malformed pax record at +{pos}")
        out.append((_text(key, path, offset, "pax key"), _text(value, path, offset, "pax value")))
        pos += length
    return out


def _decimal(text: str | bytes, path: str, offset: int, what: str) -> int:
    """A size or offset written in decimal (pax records, the GNU sparse 1.0 map)."""
    if isinstance(text, bytes):
        digits = _DECIMAL_BYTES.fullmatch(text) is not None
    else:
        digits = _DECIMAL.fullmatch(text) is not None
    value = int(text) if digits else -1
    if not 0 <= value <= _MAX_OFF:
        raise CorruptRecordError(path, offset, f"bad {what} {text[:40]!r}")
    return value


def _check_declared(cur: Cursor, size: int, path: str, offset: int, name: str) -> None:
    """A member's ``size`` bytes from ``cur.pos`` must exist, when the cursor knows
    where the archive ends (plain files; a stream finds out as it reads)."""
    end = cur.size
    if end is not None and size > end - cur.pos:
        raise CorruptRecordError(
            path,
            offset,
            f"truncated member {name!r} declares {size} bytes, "
            f"the archive ends after {max(0, end - cur.pos)} of them",
        )


def read_exact(cur: Cursor, size: int, path: str, offset: int, name: str) -> bytes:
    """``size`` bytes from ``cur``, read in bounded pieces: a size declared past
    the end of the archive is an error, never an allocation of that size."""
    _check_declared(cur, size, path, offset, name)
    data = cur.read(size) if size <= _CHUNK else read_full(cur, size)
    if len(data) < size:
        raise CorruptRecordError(
            path, offset, f"truncated member {name!r}: archive ends inside its data"
        )
    return data


def check_exact(cur: Cursor, size: int, path: str, offset: int, name: str) -> int:
    """The CRC32C of the ``size`` bytes :func:`read_exact` would read, read and hashed
    in pieces: a member of any size is checked without being held whole."""
    _check_declared(cur, size, path, offset, name)
    crc, left = 0, size
    while left:
        piece = cur.read(min(left, _CHUNK))
        if not piece:
            raise CorruptRecordError(
                path, offset, f"truncated member {name!r}: archive ends inside its data"
            )
        crc = fallback_crc32c(piece, crc)  # (the package's: it continues a CRC)
        left -= len(piece)
    return crc


def _skip_exact(cur: Cursor, size: int, path: str, offset: int, name: str) -> None:
    if size > 0 and cur.skip(size) < size:
        raise CorruptRecordError(
            path, offset, f"truncated member {name!r}: archive ends inside its data"
        )


def padded(size: int) -> int:
    """``size`` rounded up to a whole number of 512-byte blocks (the space a
    member's data takes in the archive)."""
    return -(-size // BLOCK) * BLOCK


# -- sparse members ------------------------------------------------------------


def _old_gnu_map(cur: Cursor, block: bytes, path: str, offset: int) -> list[tuple[int, int]]:
    """The ``(offset, numbytes)`` map of an old GNU sparse (``S``) member: 4 pairs
    in its header, 21 in each extension block that follows (read from ``cur``)
    while the block before sets its ``isextended`` byte. As GNU tar reads it,
    a pair whose numbytes field starts with NUL is unused and ends the map;
    any pair written after that is a damaged map."""
    pairs: list[tuple[int, int]] = []
    ended = False

    def take(raw: bytes) -> None:
        nonlocal ended
        for at in range(0, len(raw), 24):
            pair = raw[at : at + 24]
            if pair[12] == 0:
                ended = True
            elif ended:
                raise CorruptRecordError(path, offset, "GNU sparse map entry after its end")
            else:
                pairs.append(
                    (
                        parse_number(pair[:12], path, offset, "sparse offset"),
                        parse_number(pair[12:], path, offset, "sparse numbytes"),
                    )
                )

    take(block[_OLD_GNU_MAP : _OLD_GNU_MAP + 96])
    extended = block[482]
    while extended:
        ext = cur.read(BLOCK)
        if len(ext) < BLOCK:
            raise CorruptRecordError(
                path, offset, "truncated GNU sparse map: archive ends inside its extension blocks"
            )
        take(ext[: _OLD_GNU_EXT * 24])
        extended = ext[504]
    return pairs


def _pax_10_map(
    cur: Cursor, size: int, path: str, offset: int, name: str
) -> tuple[list[tuple[int, int]], int]:
    """The map at the start of a GNU sparse 1.0 member's data, read from ``cur``:
    decimal numbers, one a line (the number of pairs, then offset and numbytes
    of each), padded to whole blocks. Returns the pairs and the bytes the map
    takes. It may not run past the member's ``size`` bytes."""
    numbers: list[int] = []
    count: int | None = None
    buf = b""
    used = 0
    while count is None or len(numbers) < 2 * count:
        line_end = buf.find(b"\n")
        if line_end < 0:
            if len(buf) > 19:
                raise CorruptRecordError(path, offset, f"bad GNU sparse map number {buf[:40]!r}")
            if used + BLOCK > size:
                raise CorruptRecordError(
                    path, offset, f"GNU sparse map of {name!r} runs past the member's data"
                )
            more = cur.read(BLOCK)
            if len(more) < BLOCK:
                raise CorruptRecordError(
                    path, offset, "truncated GNU sparse map: archive ends inside it"
                )
            buf += more
            used += BLOCK
            continue
        value = _decimal(buf[:line_end], path, offset, "GNU sparse map number")
        buf = buf[line_end + 1 :]
        if count is not None:
            numbers.append(value)
        elif 4 * value > size:  # each pair takes 4 bytes at least ("0\n0\n")
            raise CorruptRecordError(
                path,
                offset,
                f"GNU sparse map of {name!r}: {value} pairs do not fit in {size} bytes",
            )
        else:
            count = value
    return list(zip(numbers[::2], numbers[1::2], strict=True)), used


def _pax_0x_map(
    pax: Mapping[str, str], pairs_00: Sequence[tuple[str, str]], path: str, offset: int
) -> list[tuple[int, int]]:
    """The map of a GNU sparse 0.1 (``GNU.sparse.map``: offset,numbytes,...) or
    0.0 member (``GNU.sparse.offset`` and ``GNU.sparse.numbytes`` records, in turn)."""
    if "GNU.sparse.map" in pax:
        if pairs_00:
            raise CorruptRecordError(
                path, offset, "two GNU sparse maps (0.0 and 0.1) in one header"
            )
        text = pax["GNU.sparse.map"]
        numbers = [
            _decimal(t, path, offset, "GNU sparse map number") for t in text.split(",") if text
        ]
        if len(numbers) % 2:
            raise CorruptRecordError(path, offset, "GNU sparse map with an odd count of numbers")
        pairs = list(zip(numbers[::2], numbers[1::2], strict=True))
    else:
        if len(pairs_00) % 2 or any(key != _PAX_00[i % 2] for i, (key, _) in enumerate(pairs_00)):
            raise CorruptRecordError(
                path, offset, "GNU sparse 0.0 map records are not offset/numbytes pairs"
            )
        numbers = [_decimal(v, path, offset, "GNU sparse map number") for _, v in pairs_00]
        pairs = list(zip(numbers[::2], numbers[1::2], strict=True))
    if "GNU.sparse.numblocks" in pax:
        blocks = _decimal(pax["GNU.sparse.numblocks"], path, offset, "GNU.sparse.numblocks")
        if blocks != len(pairs):
            raise CorruptRecordError(
                path, offset, f"GNU sparse map has {len(pairs)} entries, numblocks says {blocks}"
            )
    return pairs


def _extents(
    pairs: Sequence[tuple[int, int]],
    real_size: int,
    data_offset: int,
    stored: int,
    path: str,
    offset: int,
    name: str,
) -> Extents:
    """A sparse map checked (non-negative, in order, not overlapping, inside the
    real size, its data exactly the ``stored`` bytes) and made :data:`Extents`:
    pieces of data stored one after another from ``data_offset``, holes between."""
    out: list[tuple[int, int]] = []
    logical = 0  # where in the real file the map has got to
    stored_at = data_offset

    def add(at: int, length: int) -> None:
        if out and (out[-1][0] < 0) == (at < 0):  # merge hole with hole, data with data
            out[-1] = (out[-1][0], out[-1][1] + length)
        else:
            out.append((at, length))

    for at, length in pairs:
        if at < 0 or length < 0:
            raise CorruptRecordError(
                path, offset, f"sparse map of {name!r}: negative number ({at}, {length})"
            )
        if at < logical:
            raise CorruptRecordError(
                path,
                offset,
                f"sparse map of {name!r}: the piece at {at} starts before the one before ends "
                f"({logical})",
            )
        if at + length > real_size:
            raise CorruptRecordError(
                path,
                offset,
                f"sparse map of {name!r}: the piece at {at} of {length} bytes runs past the "
                f"real size {real_size}",
            )
        if at > logical:
            add(-1, at - logical)
        if length:
            add(stored_at, length)
            stored_at += length
        logical = at + length
    if logical < real_size:
        add(-1, real_size - logical)
    if stored_at - data_offset != stored:
        raise CorruptRecordError(
            path,
            offset,
            f"sparse map of {name!r} holds {stored_at - data_offset} bytes of data, "
            f"the member {stored}",
        )
    return tuple(out)


def expand(stored: bytes, data_offset: int, extents: Extents) -> bytes:
    """A sparse member's content from its stored bytes (read from ``data_offset``)."""
    return b"".join(
        bytes(length) if at < 0 else stored[at - data_offset : at - data_offset + length]
        for at, length in extents
    )


def _is_pax_sparse(pax: Mapping[str, str], pairs_00: Sequence[tuple[str, str]]) -> bool:
    return bool(pairs_00) or any(key.startswith("GNU.sparse.") for key in pax)


def _pax_sparse(
    cur: Cursor,
    pax: Mapping[str, str],
    pairs_00: Sequence[tuple[str, str]],
    name: str,
    size: int,
    path: str,
    offset: int,
) -> tuple[str, int, Extents]:
    """Real name, real size and extents of a pax GNU sparse member (versions 0.0,
    0.1 and 1.0) whose data starts at ``cur.pos`` and declares ``size`` bytes;
    reads the 1.0 map from ``cur``."""
    name = pax.get("GNU.sparse.name", name)
    data_offset = cur.pos
    if "GNU.sparse.major" in pax or "GNU.sparse.minor" in pax:
        version = (pax.get("GNU.sparse.major"), pax.get("GNU.sparse.minor"))
        if version != ("1", "0"):
            raise CorruptRecordError(
                path, offset, f"unsupported GNU sparse format version {'.'.join(map(str, version))}"
            )
        real_key = "GNU.sparse.realsize" if "GNU.sparse.realsize" in pax else "GNU.sparse.size"
        pairs, used = _pax_10_map(cur, size, path, offset, name)
        data_offset += used
        size -= used
    elif "GNU.sparse.map" in pax or pairs_00:
        real_key = "GNU.sparse.size"
        pairs = _pax_0x_map(pax, pairs_00, path, offset)
    else:
        raise CorruptRecordError(path, offset, f"GNU sparse member {name!r} has no sparse map")
    if real_key not in pax:
        raise CorruptRecordError(path, offset, f"GNU sparse member {name!r} has no real size")
    real_size = _decimal(pax[real_key], path, offset, real_key)
    return name, real_size, _extents(pairs, real_size, data_offset, size, path, offset, name)


def iter_members(cur: Cursor, path: str) -> Iterator[Member]:
    """Every member of the archive read through ``cur``, in archive order.

    The caller may read a yielded member's data from ``cur`` (from
    ``data_offset``) before asking for the next member; the rest is skipped.
    Sparse members come with their real name and size and their extents.
    """
    global_pax: dict[str, str] = {}
    local_pax: dict[str, str] = {}
    pairs_00: list[tuple[str, str]] = []  # GNU sparse 0.0 map records, in order
    long_name: str | None = None
    first: int | None = None
    while True:
        start = cur.pos
        block = cur.read(BLOCK)
        if not block or block == ZERO:
            if first is not None:
                raise CorruptRecordError(
                    path, first, "archive ends after an extended header, before its member"
                )
            return
        if len(block) < BLOCK:
            raise CorruptRecordError(
                path, start, f"truncated tar header ({len(block)} of {BLOCK} bytes)"
            )
        if not checksum_ok(block):
            raise CorruptRecordError(path, start, "bad tar header checksum (corrupt header)")
        kind = block[156:157]
        size = parse_number(block[124:136], path, start, "size")
        if size < 0:
            raise CorruptRecordError(path, start, f"negative member size {size}")
        if first is None:
            first = start
        if kind in (b"L", b"K", b"x", b"g"):
            label = "././@LongLink" if kind in (b"L", b"K") else "pax header"
            data = read_exact(cur, size, path, start, label)
            _skip_exact(cur, padded(size) - size, path, start, label)
            if kind == b"L":
                long_name = _text(_cstr(data), path, start, "member name")
            elif kind == b"x":
                records = _pax(data, path, start)
                local_pax.update(records)
                pairs_00.extend(r for r in records if r[0] in _PAX_00)
            elif kind == b"g":
                global_pax.update(_pax(data, path, start))
                first = None  # a global header belongs to no member
            continue  # "K": a long link name; links are not samples
        pax = {**global_pax, **local_pax} if global_pax else local_pax
        if "path" in pax:
            name = pax["path"]
        elif long_name is not None:
            name = long_name
        else:
            name = _text(_cstr(block[:100]), path, start, "member name")
            prefix = _cstr(block[345:500])
            if prefix and kind not in _GNU_TYPES:
                name = _text(prefix, path, start, "member name prefix") + "/" + name
        if "size" in pax:
            size = _decimal(pax["size"], path, first, "pax size")
        sparse: tuple[str, int, Extents] | None = None
        pairs = _old_gnu_map(cur, block, path, first) if kind == b"S" else []
        data_start = cur.pos  # after an old GNU sparse member's extension blocks
        if kind not in _NO_DATA:
            _check_declared(cur, size, path, first, name)
        if kind == b"S":
            real_size = parse_number(block[483:495], path, first, "sparse real size")
            if not 0 <= real_size <= _MAX_OFF:
                raise CorruptRecordError(path, first, f"bad GNU sparse real size {real_size}")
            sparse = (
                name,
                real_size,
                _extents(pairs, real_size, data_start, size, path, first, name),
            )
        elif kind in REGULAR and _is_pax_sparse(local_pax, pairs_00):
            sparse = _pax_sparse(cur, local_pax, pairs_00, name, size, path, first)
        if sparse is None:
            member = Member(name, kind, first, data_start, size)
        else:
            member = Member(sparse[0], kind, first, cur.pos, sparse[1], sparse[2])
        yield member
        span = 0 if kind in _NO_DATA else padded(size)
        _skip_exact(cur, data_start + span - cur.pos, path, first, name)
        local_pax, pairs_00, long_name, first = {}, [], None, None
