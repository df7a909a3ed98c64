"""tar archives holding WebDataset-style samples.

Headers are parsed here, block by block, never through ``tarfile`` (which
would keep every member in memory): 512-byte blocks, the header checksum
verified (unsigned or signed sum, as tar implementations write either),
numbers in octal or base-256. Supported: ustar (``prefix`` + ``name``), GNU
(``././@LongLink`` headers ``L`` for long names and ``K`` for long link
names), pax (``x`` extended headers whose ``path`` and ``size`` override the
ustar fields, ``g`` global headers that apply to every later member, UTF-8
names), v7. The archive ends at the first all-zero block or at the end of
the file when it falls on a header boundary. A truncated header, a bad
checksum, member data cut short, a malformed pax record or a name that is not
UTF-8 raises :class:`CorruptRecordError` naming the file and the byte offset
of the (first) header of that member.

**Which members are samples.** Regular files only (types ``0``, NUL and
``7``). Directories, symlinks, hardlinks, devices and fifos are skipped:
they are not samples and have no bytes of their own (a hardlink's bytes are
those of an earlier member, which is indexed under its own name). GNU sparse
members are refused (their stored bytes are not the file's content).
Members whose name yields no key under the grouping rule (no extension) are
skipped, as both WebDataset and tfd-utils skip them.

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
A sample is a run of *consecutive* members with the same key, as WebDataset
writes them. When a key comes back later in the archive, or a member repeats
a feature the current sample already has, a new sample with the same key
starts: that is a duplicate key, and the catalog's ``on_duplicate`` policy
decides (an error by default; ``first``/``last`` keep one). tfd-utils would
silently merge such members into one record.

**Entries.** One per sample: ``offset`` is the first header of its first
member (including GNU/pax extended headers), ``length`` runs to the end of
its last member's data; ``members`` holds ``(feature, data offset, size)``
per member. For compressed archives the offsets are decompressed-stream
offsets (see :mod:`shardcat.readers.compressed`).

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

__all__ = [
    "GROUPINGS",
    "Member",
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
# Types with no data blocks of their own (tarfile and GNU tar skip none for them).
_NO_DATA = frozenset({b"1", b"2", b"3", b"4", b"5", b"6"})
_GNU_TYPES = frozenset({b"L", b"K", b"S"})
_SIGNED_HEAD = struct.Struct("148b")
_SIGNED_TAIL = struct.Struct("356b")
_WDS_SPLIT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$", re.DOTALL)
_NOT_WORD = re.compile(r"[^0-9A-Za-z_]")
_INT_TEXT = re.compile(r"^[+-]?\d+$")


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

    @property
    def is_file(self) -> bool:
        return self.type in _REGULAR and not self.name.endswith("/")


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


def _pax(data: bytes, path: str, offset: int) -> dict[str, str]:
    """Records ``"<len> <key>=<value>\\n"`` of a pax extended header."""
    out: dict[str, str] = {}
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
        out[_text(key, path, offset, "pax key")] = _text(value, path, offset, "pax value")
        pos += length
    return out


def _read_exact(cur: _Cursor, size: int, path: str, offset: int, name: str) -> bytes:
    data = cur.read(size)
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


def iter_members(cur: _Cursor, path: str) -> Iterator[Member]:
    """Every member of the archive read through ``cur``, in archive order.

    The caller may read a yielded member's data from ``cur`` (from
    ``data_offset``) before asking for the next member; the rest is skipped.
    """
    global_pax: dict[str, str] = {}
    local_pax: dict[str, str] = {}
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
            data = _read_exact(cur, size, path, start, "././@LongLink")
            _skip_exact(cur, padded(size) - size, path, start, "././@LongLink")
            if kind == b"L":
                long_name = _text(_cstr(data), path, start, "member name")
            elif kind == b"x":
                local_pax.update(_pax(data, path, start))
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
            try:
                size = int(pax["size"])
            except ValueError:
                raise CorruptRecordError(path, first, f"bad pax size {pax['size']!r}") from None
        if kind == b"S":
            raise CorruptRecordError(path, first, f"GNU sparse member {name!r} is not supported")
        data_offset = cur.pos
        member = Member(name, kind, first, data_offset, size)
        yield member
        span = 0 if kind in _NO_DATA else padded(size)
        _skip_exact(cur, data_offset + span - cur.pos, path, first, name)
        local_pax, long_name, first = {}, None, None


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


@dataclass(slots=True)
class _Sample:
    key: str
    offset: int
    end: int = 0
    members: list[tuple[str, int, int]] = field(default_factory=list)
    fields: dict[str, Scalar] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)


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
        sample.members.append((feature, m.data_offset, m.size))
        sample.seen.add(feature)
        sample.end = m.data_offset + m.size
        if want is not None and want(feature, m.size):
            data[feature] = _read_exact(cur, m.size, path, m.header_offset, m.name)
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
    for sample, data in _samples(cur, path, grouping, want):
        fields: dict[str, Scalar] = {}
        for feature, raw in data.items():
            for name, value in member_fields(feature, raw).items():
                fields.setdefault(name, value)
        yield Entry(
            None if by_position else sample.key,
            sample.offset,
            sample.end - sample.offset,
            fields,
            sample.members,
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
    """``(key, {feature: bytes})`` per sample of the archive, in archive order
    (compressed archives are decompressed on the fly)."""
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
    """``(name, data offset, size)`` of every regular file member, in archive order."""
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
        (
            (member_name(str(e.key), feature), offset, size)
            for e in entries
            for feature, offset, size in e.members
        ),
        key=lambda m: m[1],
    )
    yield from wds_index_lines(members)
