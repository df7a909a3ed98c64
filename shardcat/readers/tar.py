"""tar archives holding WebDataset-style samples.

Headers are parsed here, block by block, never through ``tarfile`` (which
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
as pieces of stored data and holes of zeros, read back with
:func:`assemble`. The map is checked: well-formed numbers (ASCII decimal or
tar octal/base-256, below 2**63), pieces in order and not overlapping,
inside the real size, their data exactly the member's stored bytes; a 1.0
map may not run past the member's data. Other sparse versions are refused.

**Which members are samples.** Regular files only (types ``0``, NUL and
``7``, and ``S``). Directories, symlinks, hardlinks, devices and fifos are skipped:
they are not samples and have no bytes of their own (a hardlink's bytes are
those of an earlier member, which is indexed under its own name). Sparse
files (above) are regular files. Members whose name yields no key under the
grouping rule (no extension) are skipped, as both WebDataset and tfd-utils
skip them.

**Grouping** (``options["grouping"]``, recorded per dataset):

- ``webdataset`` (default of ``Catalog.ingest`` and ``catalog ingest``):
  WebDataset's own rule, the regular expression
  ``^((?:.*/|)[^.]+)[.]([^/]*)$``: the basename is split at its *first* dot
  (``a.seg.png`` -> key ``a``, feature ``seg.png``); keys equal WebDataset's
  ``__key__``, member names are kept as written (``./a.jpg`` -> ``./a``).
- ``tfd`` (default of :class:`~shardcat.TarReader`): tfd-utils' rule, the
  member name as a ``PurePosixPath``: key ``with_suffix('')``, feature the
  suffix without its dot, so the split is at the *last* dot (``a.seg.png`` ->
  key ``a.seg``, feature ``png``) and the path is normalized (``./a.jpg`` ->
  ``a``); names without a suffix (``README``, ``.hidden``) are skipped.

In both, directories stay in the key (``train/a/x.jpg`` -> ``train/a/x``).
What makes a sample differs, as it does between the two tools:

- ``webdataset``: a run of *consecutive* members with the same key, as
  WebDataset writes and reads them. When a key comes back later in the
  archive, or a member repeats a feature the current sample already has, a
  new sample with the same key starts: that is a duplicate key, and the
  catalog's ``on_duplicate`` policy decides (an error by default;
  ``first``/``last`` keep one).
- ``tfd``: tfd-utils' ``{stem: {ext: member}}`` over the *whole* archive:
  every member of a key belongs to its one sample wherever it lies, so
  ``s6.cls s6.jpg s6.seg.png s6.txt`` is ``s6`` {cls, jpg, txt} and
  ``s6.seg`` {png}; a member name that comes back (``tar -r`` appends) replaces
  the earlier member: the last one wins, as in tfd-utils and ``tar -x``. An
  archive therefore never repeats a key under ``tfd``; samples come in the
  order their keys first appear, once the archive has been read to its end
  (:func:`iter_samples` still gives runs, in archive order).

**Entries.** One per sample: ``offset`` is the first header (including
GNU/pax extended headers) of its members, ``length`` runs to the end of the
data of its last member in the archive (for a sparse member, its stored
data): under ``tfd`` the span may hold other samples' members too, the
members themselves are exact; ``members``
holds ``(feature, data offset, size)`` per member, and for a sparse member
``(feature, first stored byte, real size, extents)`` (:data:`MemberRow`).
For compressed archives the offsets, those of extents too, are
decompressed-stream offsets (see :mod:`shardcat.readers.compressed`). Small
field members that are sparse are expanded before their fields are read.

**SQL fields** (``options["fields"]``, default True):

- small text members: the feature's last extension is one of
  ``TEXT_EXTENSIONS`` or ``INT_EXTENSIONS``, the member is at most
  ``MAX_TEXT_FIELD`` (256) bytes of UTF-8; the value is the text stripped of
  surrounding whitespace. For ``INT_EXTENSIONS`` (``cls``, ``cls2``,
  ``class``, ``count``, ``index``, ``inx``, ``id`` — the extensions
  WebDataset decodes as integers) a decimal integer is stored as an integer.
  The column is named after the feature (``cls``, ``seg.cls`` -> ``seg_cls``).
- ``.json`` members of at most ``MAX_JSON_MEMBER`` (4 MiB) holding an
  object: each top-level scalar becomes ``<feature>_<key>`` (``json_width``),
  and each scalar inside a top-level object ``<feature>_<key>_<subkey>``
  (``json_image_width`` for SA-1B's ``{"image": {"width": ...}}``); deeper
  values and lists are not fields. Booleans are stored as 0/1, strings only
  up to 256 bytes, null and non-finite numbers not at all; at most
  ``MAX_JSON_FIELDS`` (64) fields per member. Characters other than
  letters, digits and ``_`` in names become ``_``.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Protocol

from shardcat.errors import CatalogError, CorruptRecordError
from shardcat.readers.compressed import IndexingStream, detect_compression, open_stream
from shardcat.readers.formats import Entry, Scalar, pread_exact, read_full
from shardcat.readers.source import read_extents

__all__ = [
    "GROUPINGS",
    "Extents",
    "Member",
    "MemberRow",
    "assemble",
    "check_grouping",
    "dali_index_lines",
    "decode",
    "describe",
    "feature_list",
    "features",
    "iter_members",
    "iter_samples",
    "padded",
    "read",
    "scan",
    "scan_stream",
    "sniff",
    "split_key",
    "wds_index_lines",
]

NAME = "tar"
TITLE = "tar"
PARTS = True
EXTENSIONS = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz")
BLOCK = 512
GROUPINGS = ("webdataset", "tfd")
DEFAULT_GROUPING = "webdataset"
MAX_TEXT_FIELD = 256
MAX_JSON_MEMBER = 4 << 20
MAX_JSON_FIELDS = 64
INT_EXTENSIONS = frozenset({"cls", "cls2", "class", "count", "index", "inx", "id"})
TEXT_EXTENSIONS = frozenset({"txt", "text", "label", "caption", "transcript"})

_ZERO = bytes(BLOCK)
_REGULAR = frozenset({b"0", b"\0", b"7"})
_FILE_TYPES = _REGULAR | {b"S"}  # "S": an old GNU sparse file
# Types with no data blocks of their own (tarfile and GNU tar skip none for them).
_NO_DATA = frozenset({b"1", b"2", b"3", b"4", b"5", b"6"})
_GNU_TYPES = frozenset({b"L", b"K", b"S"})
_SIGNED_HEAD = struct.Struct("148b")
_SIGNED_TAIL = struct.Struct("356b")
_WDS_SPLIT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$", re.DOTALL)
_NOT_WORD = re.compile(r"[^0-9A-Za-z_]")
_INT_TEXT = re.compile(r"^[+-]?\d+$")
_CHUNK = 1 << 20  # reads and skips of member data go in pieces of this size at most
_MAX_OFF = (1 << 63) - 1  # the largest file offset or size (off_t)
_DECIMAL = re.compile(r"[0-9]{1,19}")  # ASCII digits only (int() takes others)
_DECIMAL_BYTES = re.compile(rb"[0-9]{1,19}")
_OLD_GNU_MAP = 386  # 4 (offset, numbytes) pairs of 12-byte numbers, then isextended, realsize
_OLD_GNU_EXT = 21  # pairs in an extension block, then its isextended byte at 504
_PAX_00 = ("GNU.sparse.offset", "GNU.sparse.numbytes")

#: ``(offset, length)`` pieces making up a sparse member's content, in order:
#: ``offset`` is where the piece's bytes are in the (decompressed) archive,
#: -1 for a hole (zeros).
Extents = tuple[tuple[int, int], ...]


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


class _Cursor(Protocol):
    pos: int

    def read(self, size: int) -> bytes: ...

    def skip(self, size: int) -> int: ...


class _MapCursor:
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


class _StreamCursor:
    """Any binary stream read sequentially (decompressed archives)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.pos = 0

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


_CURSORS = (_MapCursor, _StreamCursor, IndexingStream)


def _checksum_ok(block: bytes) -> bool:
    field_ = block[148:156].split(b"\0", 1)[0].strip()
    if not field_ or not all(48 <= c <= 55 for c in field_):
        return False
    stored = int(field_, 8)
    unsigned = sum(block[:148]) + 256 + sum(block[156:])
    if stored == unsigned:
        return True
    signed = sum(_SIGNED_HEAD.unpack_from(block)) + 256 + sum(_SIGNED_TAIL.unpack_from(block, 156))
    return stored == signed


def _number(raw: bytes, path: str, offset: int, what: str) -> int:
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


def _check_declared(cur: _Cursor, size: int, path: str, offset: int, name: str) -> None:
    """A member's ``size`` bytes from ``cur.pos`` must exist, when the cursor knows
    where the archive ends (plain files; a stream finds out as it reads)."""
    end = getattr(cur, "size", None)
    if isinstance(end, int) and size > end - cur.pos:
        raise CorruptRecordError(
            path,
            offset,
            f"truncated member {name!r} declares {size} bytes, "
            f"the archive ends after {max(0, end - cur.pos)} of them",
        )


def _read_exact(cur: _Cursor, size: int, path: str, offset: int, name: str) -> bytes:
    """``size`` bytes from ``cur``, read in bounded pieces: a size declared past
    the end of the archive is an error, never an allocation of that size."""
    _check_declared(cur, size, path, offset, name)
    data = cur.read(size) if size <= _CHUNK else read_full(cur, size)
    if len(data) < size:
        raise CorruptRecordError(
            path, offset, f"truncated member {name!r}: archive ends inside its data"
        )
    return data


def _skip_exact(cur: _Cursor, size: int, path: str, offset: int, name: str) -> None:
    if size > 0 and cur.skip(size) < size:
        raise CorruptRecordError(
            path, offset, f"truncated member {name!r}: archive ends inside its data"
        )


def padded(size: int) -> int:
    """``size`` rounded up to a whole number of 512-byte blocks (the space a
    member's data takes in the archive)."""
    return -(-size // BLOCK) * BLOCK


# -- sparse members ------------------------------------------------------------


def _old_gnu_map(cur: _Cursor, block: bytes, path: str, offset: int) -> list[tuple[int, int]]:
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
                        _number(pair[:12], path, offset, "sparse offset"),
                        _number(pair[12:], path, offset, "sparse numbytes"),
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
    cur: _Cursor, size: int, path: str, offset: int, name: str
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


def _expand(stored: bytes, data_offset: int, extents: Extents) -> bytes:
    """A sparse member's content from its stored bytes (read from ``data_offset``)."""
    return b"".join(
        bytes(length) if at < 0 else stored[at - data_offset : at - data_offset + length]
        for at, length in extents
    )


def _is_pax_sparse(pax: Mapping[str, str], pairs_00: Sequence[tuple[str, str]]) -> bool:
    return bool(pairs_00) or any(key.startswith("GNU.sparse.") for key in pax)


def _pax_sparse(
    cur: _Cursor,
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


def iter_members(cur: _Cursor, path: str) -> Iterator[Member]:
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
        if not block or block == _ZERO:
            if first is not None:
                raise CorruptRecordError(
                    path, first, "archive ends after an extended header, before its member"
                )
            return
        if len(block) < BLOCK:
            raise CorruptRecordError(
                path, start, f"truncated tar header ({len(block)} of {BLOCK} bytes)"
            )
        if not _checksum_ok(block):
            raise CorruptRecordError(path, start, "bad tar header checksum (corrupt header)")
        kind = block[156:157]
        size = _number(block[124:136], path, start, "size")
        if size < 0:
            raise CorruptRecordError(path, start, f"negative member size {size}")
        if first is None:
            first = start
        if kind in (b"L", b"K", b"x", b"g"):
            label = "././@LongLink" if kind in (b"L", b"K") else "pax header"
            data = _read_exact(cur, size, path, start, label)
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
            real_size = _number(block[483:495], path, first, "sparse real size")
            if not 0 <= real_size <= _MAX_OFF:
                raise CorruptRecordError(path, first, f"bad GNU sparse real size {real_size}")
            sparse = (
                name,
                real_size,
                _extents(pairs, real_size, data_start, size, path, first, name),
            )
        elif kind in _REGULAR and _is_pax_sparse(local_pax, pairs_00):
            sparse = _pax_sparse(cur, local_pax, pairs_00, name, size, path, first)
        if sparse is None:
            member = Member(name, kind, first, data_start, size)
        else:
            member = Member(sparse[0], kind, first, cur.pos, sparse[1], sparse[2])
        yield member
        span = 0 if kind in _NO_DATA else padded(size)
        _skip_exact(cur, data_start + span - cur.pos, path, first, name)
        local_pax, pairs_00, long_name, first = {}, [], None, None


# -- grouping ------------------------------------------------------------------


def split_key(name: str, grouping: str) -> tuple[str, str] | None:
    """``(key, feature)`` of a member name under a grouping rule; None when the
    member belongs to no sample (no extension)."""
    if grouping == "webdataset":
        match = _WDS_SPLIT.match(name)
        return None if match is None else (match.group(1), match.group(2))
    if grouping == "tfd":
        p = PurePosixPath(name)
        ext = p.suffix.lstrip(".")
        if not ext:
            return None
        return p.with_suffix("").as_posix(), ext
    raise _unknown_grouping(grouping)


def _unknown_grouping(grouping: object) -> CatalogError:
    return CatalogError(f"unknown tar grouping {grouping!r}; use one of {', '.join(GROUPINGS)}")


def check_grouping(grouping: str) -> str:
    """``grouping`` itself when it is one of :data:`GROUPINGS`; else a :class:`CatalogError`."""
    if grouping not in GROUPINGS:
        raise _unknown_grouping(grouping)
    return grouping


def _grouping(options: Mapping[str, Any]) -> str:
    return check_grouping(str(options.get("grouping") or DEFAULT_GROUPING))


# -- fields --------------------------------------------------------------------


def _field_name(*parts: str) -> str:
    return "_".join(_NOT_WORD.sub("_", p) for p in parts)


def _wants_data(feature: str, size: int) -> bool:
    ext = feature.rsplit(".", 1)[-1].lower()
    if ext in TEXT_EXTENSIONS or ext in INT_EXTENSIONS:
        return size <= MAX_TEXT_FIELD
    return ext == "json" and size <= MAX_JSON_MEMBER


def _json_scalar(value: Any) -> Scalar | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value if len(value.encode("utf-8", "surrogatepass")) <= MAX_TEXT_FIELD else None
    return None


def member_fields(feature: str, data: bytes) -> dict[str, Scalar]:
    """The SQL fields one member contributes (see the module docstring)."""
    ext = feature.rsplit(".", 1)[-1].lower()
    out: dict[str, Scalar] = {}
    if ext == "json":
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            return out
        if not isinstance(doc, dict):
            return out
        for key, value in doc.items():
            items = value.items() if isinstance(value, dict) else [(None, value)]
            for sub, inner in items:
                scalar = _json_scalar(inner)
                if scalar is None:
                    continue
                name = _field_name(feature, key) if sub is None else _field_name(feature, key, sub)
                out.setdefault(name, scalar)
                if len(out) >= MAX_JSON_FIELDS:
                    return out
        return out
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        return out
    name = _field_name(feature)
    out[name] = int(text) if ext in INT_EXTENSIONS and _INT_TEXT.match(text) else text
    return out


# -- scanning ------------------------------------------------------------------


#: One item of ``Entry.members``: ``(feature, data offset, size)``, and for a
#: sparse member ``(feature, first stored byte, real size, extents)``.
MemberRow = tuple[str, int, int] | tuple[str, int, int, Extents]


@dataclass(slots=True)
class _Sample:
    """A run of consecutive members with one key (each feature once)."""

    key: str
    offset: int
    end: int = 0
    members: list[MemberRow] = field(default_factory=list)
    #: (first header, end of data) of each member, as ``members``
    spans: list[tuple[int, int]] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)


# (key, members, first header, end of the last member's data, fields) of one sample
_Found = tuple[str, list[MemberRow], int, int, dict[str, Scalar]]
_Run = tuple[_Sample, dict[str, dict[str, Scalar]]]  # a run and its members' fields


def _merged_fields(per_member: Iterable[dict[str, Scalar]]) -> dict[str, Scalar]:
    fields: dict[str, Scalar] = {}
    for member in per_member:
        for name, value in member.items():
            fields.setdefault(name, value)
    return fields


def _as_runs(runs: Iterable[_Run]) -> Iterator[_Found]:
    """``webdataset``: every run of consecutive members is a sample."""
    for run, fields in runs:
        yield run.key, run.members, run.offset, run.end, _merged_fields(fields.values())


def _whole_archive(runs: Iterable[_Run]) -> Iterator[_Found]:
    """``tfd``: tfd-utils' ``{stem: {ext: member}}`` over the whole archive. Every
    member of a key is in its one sample wherever it lies; a member name that
    comes back (``tar -r``) replaces the earlier member, keeping its place (the
    last one wins, as in tfd-utils and ``tar -x``). Samples come in the order
    their keys first appear, once the archive has been read to its end."""
    whole: dict[str, dict[str, tuple[MemberRow, int, int, dict[str, Scalar]]]] = {}
    for run, fields in runs:
        sample = whole.setdefault(run.key, {})
        for row, (head, end) in zip(run.members, run.spans, strict=True):
            sample[row[0]] = (row, head, end, fields.get(row[0], {}))
    for key, sample in whole.items():
        kept = list(sample.values())
        yield (
            key,
            [k[0] for k in kept],
            min(k[1] for k in kept),
            max(k[2] for k in kept),
            _merged_fields(k[3] for k in kept),
        )


def _samples(
    cur: _Cursor, path: str, grouping: str, want: Callable[[str, int], bool] | None
) -> Iterator[tuple[_Sample, dict[str, bytes]]]:
    """Samples in archive order, with the bytes of the members ``want(feature, size)``
    asks for."""
    sample: _Sample | None = None
    data: dict[str, bytes] = {}
    for m in iter_members(cur, path):
        if not m.is_file:
            continue
        parts = split_key(m.name, grouping)
        if parts is None:
            continue
        key, feature = parts
        if sample is not None and (key != sample.key or feature in sample.seen):
            yield sample, data
            sample, data = None, {}
        if sample is None:
            sample = _Sample(key, m.header_offset)
        if m.extents is None:
            sample.members.append((feature, m.data_offset, m.size))
        else:
            sample.members.append((feature, m.data_offset, m.size, m.extents))
        sample.seen.add(feature)
        sample.end = m.data_offset + m.stored_size
        sample.spans.append((m.header_offset, sample.end))
        if want is not None and want(feature, m.size):
            raw = _read_exact(cur, m.stored_size, path, m.header_offset, m.name)
            data[feature] = raw if m.extents is None else _expand(raw, m.data_offset, m.extents)
    if sample is not None:
        yield sample, data


def scan_stream(stream: Any, path: str, options: Mapping[str, Any]) -> Iterator[Entry]:
    """Like :func:`scan`, over a binary stream read sequentially (compressed archives:
    ingest hands in the decompressed stream, which records seek points)."""
    # Cursors and the ingest stream already read in full (short only at the end),
    # skip and count ``pos`` from 0; any other stream gets a cursor around it.
    cur: _Cursor = stream if isinstance(stream, _CURSORS) else _StreamCursor(stream)
    grouping = _grouping(options)
    by_position = options.get("key", "key") is None
    want = _wants_data if options.get("fields", True) else None
    runs = (
        (sample, {feature: member_fields(feature, raw) for feature, raw in data.items()})
        for sample, data in _samples(cur, path, grouping, want)
    )
    found = _whole_archive(runs) if grouping == "tfd" else _as_runs(runs)
    for key, rows, start, end, fields in found:
        members: list[Any] = rows  # 4-tuples for sparse members
        yield Entry(
            None if by_position else key,
            start,
            end - start,
            fields,
            members,
        )


def scan(path: str, options: Mapping[str, Any]) -> Iterator[Entry]:
    """Yield one :class:`Entry` per sample of the archive at ``path``.

    ``options``: ``grouping`` (``webdataset`` or ``tfd``), ``key`` (None keys
    samples by position) and ``fields`` (extract SQL fields, default True).
    Compressed archives are read through a plain decompressing stream here;
    ingest uses :func:`scan_stream` with one that records seek points.
    """
    if detect_compression(path) is not None:
        with open_stream(path) as stream:
            yield from scan_stream(_StreamCursor(stream), path, options)
        return
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            yield from scan_stream(_MapCursor(mm, size), path, options)


def iter_samples(path: str, grouping: str = "tfd") -> Iterator[tuple[str, dict[str, bytes]]]:
    """``(key, {feature: bytes})`` per run of consecutive members with one key,
    streamed in archive order (compressed archives are decompressed on the fly;
    sparse members come as their real content, holes as zeros). Unlike
    :func:`scan` under ``tfd``, a key may come back (its members are not
    merged: that would hold the archive's bytes until its end)."""
    check_grouping(grouping)
    with open_stream(path) as stream:
        for sample, data in _samples(_StreamCursor(stream), path, grouping, lambda f, n: True):
            yield sample.key, data


def sniff(head: bytes) -> bool:
    """A tar archive starts with a header block whose checksum is right."""
    return len(head) >= BLOCK and head[:BLOCK] != _ZERO and _checksum_ok(head[:BLOCK])


def detect_options(path: str) -> dict[str, Any]:
    return {"grouping": DEFAULT_GROUPING}


def key_rule(options: Mapping[str, Any]) -> str:
    grouping = _grouping(options)
    return "position" if options.get("key", "key") is None else f"member-stem:{grouping}"


def read(source: Any, path: str, offset: int, length: int, verify: bool = False) -> bytes:
    """The bytes of the member whose data starts at ``offset``.

    With ``verify``, the header block right before the data must be a valid
    header of a regular file whose size field is ``length`` (or 0, when a
    pax header carries the size).
    """
    if verify:
        if offset < BLOCK:
            raise CorruptRecordError(path, offset, "member data cannot start before byte 512")
        header = pread_exact(source, path, offset - BLOCK, BLOCK)
        if not _checksum_ok(header):
            raise CorruptRecordError(
                path, offset - BLOCK, "bad tar header checksum before member data (stale shard?)"
            )
        if header[156:157] not in _REGULAR:
            raise CorruptRecordError(
                path, offset - BLOCK, "header before member data is not a regular file"
            )
        size = _number(header[124:136], path, offset - BLOCK, "size")
        if size not in (0, length):
            raise CorruptRecordError(
                path,
                offset - BLOCK,
                f"header says {size} bytes, the catalog {length} (stale shard?)",
            )
    data: bytes = source.pread(length, offset)
    if len(data) != length:
        raise CorruptRecordError(path, offset, f"truncated member: {len(data)} of {length} bytes")
    return data


def assemble(
    source: Any, path: str, extents: Sequence[tuple[int, int]], verify: bool = False
) -> bytes:
    """The content of a sparse member from its :data:`Extents`: each data piece
    read with ``source.pread(length, offset)``, holes as zeros.

    A short read is a truncated shard; pieces are read 1 MiB at a time, so a
    length past the end of the file costs only the bytes that exist. With
    ``verify``, the data pieces must follow each other in the archive (as
    every GNU sparse format stores them), and what comes after the last one,
    rounded up to a block, must be the next tar header, the end-of-archive
    zeros or the end of the file (a shard that changed since it was indexed
    usually fails that).
    """
    data = read_extents(source, path, extents)
    if verify:
        end: int | None = None  # where the last data piece ends in the archive
        for at, length in extents:
            if at == -1:
                continue
            if end is not None and at != end:
                raise CorruptRecordError(
                    path,
                    at,
                    f"sparse member data at byte {at} does not follow the piece before ({end})",
                )
            end = at + length
        if end is not None:
            after = padded(end)
            block = source.pread(BLOCK, after)
            if block and (len(block) < BLOCK or (block != _ZERO and not _checksum_ok(block))):
                raise CorruptRecordError(
                    path, after, "no tar header after sparse member data (stale shard?)"
                )
    return data


def decode(raw: Any, options: Mapping[str, Any] | None = None) -> dict[str, bytes]:
    """A sample is ``{feature: bytes}`` already."""
    return dict(raw)


def feature_list(record: Mapping[str, bytes], name: str) -> list[Any] | None:
    return [record[name]] if name in record else None


def features(record: Mapping[str, bytes]) -> dict[str, list[Any]]:
    return {name: [value] for name, value in record.items()}


def describe(record: Mapping[str, bytes]) -> dict[str, str]:
    return {name: "bytes" for name in sorted(record)}


# -- DALI ----------------------------------------------------------------------


def regular_members(path: str) -> Iterator[tuple[str, int, int]]:
    """``(name, data offset, size)`` of every regular file member, in archive order.

    For a sparse member: its real name, its first stored byte and its real
    size, as Python's ``tarfile`` gives them (``offset_data``, ``size``); its
    bytes there are not its content (see :attr:`Member.extents`).
    """
    with open_stream(path) as stream:
        for m in iter_members(_StreamCursor(stream), path):
            if m.is_file:
                yield m.name, m.data_offset, m.size


def member_name(key: str, feature: str) -> str:
    """The member name a catalog ``(key, feature)`` pair came from. Exact for the
    ``webdataset`` grouping; for ``tfd`` it is the normalized path (``./x`` -> ``x``)."""
    return f"{key}.{feature}"


def wds_index_lines(members: Iterable[tuple[str, int, int]]) -> list[str]:
    """DALI ``wds2idx`` index lines (version ``v1.2``) for one archive.

    ``members``: ``(member name, data offset, size)`` of its regular files in
    archive order. As ``wds2idx`` does: the name is split at the first dot
    of its basename, hidden files (basename starting with a dot) are left
    out, consecutive members with the same base form one sample, and each
    sample is one line of ``<ext> <data offset> <size> <name>`` groups. The
    first line is ``v1.2 <number of samples>``.
    """
    samples: list[list[str]] = []
    last: str | None = None
    for name, offset, size in members:
        dot = name.find(".", name.rfind("/") + 1)
        base, ext = name[:dot], name[dot + 1 :]
        if not base or base.endswith("/"):
            continue
        if base != last:
            samples.append([])
            last = base
        samples[-1].append(f"{ext} {offset} {size} {name}")
    if not samples:
        raise CatalogError("no samples: DALI cannot index an empty webdataset archive")
    return [f"v1.2 {len(samples)}", *(" ".join(s) for s in samples)]


def dali_index_lines(entries: Sequence[Entry], options: Mapping[str, Any]) -> Iterator[str]:
    """The lines of DALI's ``wds2idx`` index for one shard, from its catalog entries.

    Member names are rebuilt as ``<key>.<feature>``: exact for the
    ``webdataset`` grouping; under ``tfd`` a name tfd-utils normalized
    (``./a.jpg``) comes out normalized (``a.jpg``). Members the catalog does
    not hold (no extension, links, samples dropped as duplicates) are not
    listed, where ``wds2idx`` would list extension-less regular files.
    """
    if options.get("key", "key") is None:
        raise CatalogError(
            "a tar dataset keyed by position does not know its member names; "
            "ingest it keyed by member stem for a DALI index"
        )
    members = sorted(
        (_dali_member(str(e.key), row) for e in entries for row in e.members),
        key=lambda m: m[1],
    )
    yield from wds_index_lines(members)


def _dali_member(key: str, row: Sequence[Any]) -> tuple[str, int, int]:
    """``(member name, data offset, size)`` for DALI, which reads ``size`` bytes
    from ``offset``: a sparse member can be given only when it has no holes."""
    name, offset, size = member_name(key, row[0]), row[1], row[2]
    extents = row[3] if len(row) > 3 else None
    if extents is None or len(extents) == 0:
        return name, offset, size
    if len(extents) == 1 and extents[0][0] >= 0:
        return name, extents[0][0], size
    raise CatalogError(
        f"member {name!r} is a sparse file with holes: a DALI index cannot describe it"
    )
