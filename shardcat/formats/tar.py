"""tar archives holding WebDataset-style samples: the format class
(:class:`TarFormat`), grouping members into samples, SQL fields and DALI
indexes. Headers, pax and GNU sparse maps are read in
:mod:`shardcat.formats.tar_headers`.

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
holds ``(feature, data offset, size, None, check)`` per member, and for a sparse
member ``(feature, first stored byte, real size, extents, check)``
(:data:`MemberRow`; the check is the CRC32C of the member's content, so the
scan reads every member's data).
For compressed archives the offsets, those of extents too, are
decompressed-stream offsets (see :mod:`shardcat.sources.compressed`). Small
field members that are sparse are expanded before their fields are read.

SQL fields (``options["fields"]``, default True) come from small text and
``.json`` members: see :mod:`shardcat.readers.tar_fields`.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardcat.errors import CatalogError, CorruptRecordError
from shardcat.formats import native
from shardcat.formats.base import (
    BadRecord,
    Columns,
    Entry,
    Extents,
    Format,
    LegacyRows,
    Location,
    Mismatch,
    Scalar,
    ShardScan,
    set_aside,
)
from shardcat.formats.checks import crc32c
from shardcat.formats.tar_headers import (
    BLOCK,
    REGULAR,
    ZERO,
    Cursor,
    MapCursor,
    Member,
    StreamCursor,
    check_exact,
    checksum_ok,
    expand,
    iter_members,
    padded,
    parse_number,
    read_exact,
)
from shardcat.formats.tar_legacy import legacy_samples
from shardcat.formats.tar_rules import (
    DEFAULT_GROUPING,
    GROUPINGS,
    FieldNotes,
    check_grouping,
    grouping_of,
    member_fields,
    split_key,
    wants_data,
)
from shardcat.formats.tar_salvage import salvaging, set_aside_broken
from shardcat.sources.compressed import IndexingStream, detect_compression, open_stream
from shardcat.sources.local import iter_extents, read_extents
from shardcat.sources.rawio import Source, pread_exact
from shardcat.sources.remote import is_url

__all__ = [
    "GROUPINGS",
    "MemberRow",
    "TarFormat",
    "check_grouping",
    "iter_samples",
    "member_name",
    "regular_members",
    "split_key",
    "wds_index_lines",
]

_CURSORS = (MapCursor, StreamCursor, IndexingStream)


# -- scanning ------------------------------------------------------------------


#: One item of ``Entry.members``: ``(feature, data offset, size, extents, check)``:
#: extents None but for a sparse member (then its first stored byte and real size),
#: check the CRC32C of its content.
MemberRow = tuple[str, int, int, Extents | None, int]


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
    cur: Cursor,
    path: str,
    grouping: str,
    want: Callable[[str, int], bool] | None,
    members: Iterable[Member | BadRecord] | None = None,
    breaks: list[BadRecord] | None = None,
) -> Iterator[tuple[_Sample, dict[str, bytes]]]:
    """Samples in archive order, with the bytes of the members ``want(feature, size)``
    asks for; ``members``: the archive's members (default: the reference walk), a
    :class:`BadRecord` among them (a damaged header set aside) ends the sample
    before it and goes to ``breaks``."""
    sample: _Sample | None = None
    data: dict[str, bytes] = {}
    for m in iter_members(cur, path) if members is None else members:
        if isinstance(m, BadRecord):
            if breaks is not None:
                breaks.append(m)
            if sample is not None:
                yield sample, data
                sample, data = None, {}
            continue
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
        # every member's content is read: its CRC32C is the check reads compare with
        wanted = want is not None and want(feature, m.size)
        if m.extents is None and not wanted:  # hashed as it is read, never held whole
            check = check_exact(cur, m.stored_size, path, m.header_offset, m.name)
        else:
            raw = read_exact(cur, m.stored_size, path, m.header_offset, m.name)
            content = raw if m.extents is None else expand(raw, m.data_offset, m.extents)
            check = crc32c(content)
            if wanted:
                data[feature] = content
        sample.members.append((feature, m.data_offset, m.size, m.extents, check))
        sample.seen.add(feature)
        sample.end = m.data_offset + m.stored_size
        sample.spans.append((m.header_offset, sample.end))
    if sample is not None:
        yield sample, data


def _scan_cursor(
    cur: Cursor,
    path: str,
    options: Mapping[str, Any],
    members: Iterable[Member | BadRecord] | None = None,
) -> Iterator[Entry]:
    """The entries of the archive read through ``cur`` (see the module docstring);
    ``members``: its members when not the reference walk's (the native walk).
    When ``options`` set bad records aside, damaged headers are (see
    :mod:`shardcat.formats.tar_salvage`) and the samples they broke with them."""
    grouping = grouping_of(options)
    by_position = options.get("key", "key") is None
    want = wants_data if options.get("fields", True) else None
    bad = set_aside(options)
    breaks: list[BadRecord] = []
    if bad is not None and members is None:
        members = salvaging(iter_members)(cur, path)
    notes = FieldNotes()  # warned about at the end
    runs = (
        (sample, {feature: member_fields(feature, raw, notes) for feature, raw in data.items()})
        for sample, data in _samples(cur, path, grouping, want, members, breaks)
    )
    found: Iterable[_Found] = _whole_archive(runs) if grouping == "tfd" else _as_runs(runs)
    if bad is not None:
        found, set_aside_now = set_aside_broken(list(found), breaks, grouping)
        bad.extend(set_aside_now)
    for key, rows, start, end, fields in found:
        row_list: list[Any] = rows  # 4-tuples for sparse members
        yield Entry(
            None if by_position else key,
            start,
            end - start,
            fields,
            row_list,
        )
    notes.warn(path)


def iter_samples(path: str, grouping: str = "tfd") -> Iterator[tuple[str, dict[str, bytes]]]:
    """``(key, {feature: bytes})`` per run of consecutive members with one key,
    streamed in archive order (compressed archives are decompressed on the fly;
    sparse members come as their real content, holes as zeros). Unlike
    ``TarFormat.scan`` under ``tfd``, a key may come back (its members are not
    merged: that would hold the archive's bytes until its end)."""
    check_grouping(grouping)
    with open_stream(path) as stream:
        for sample, data in _samples(StreamCursor(stream), path, grouping, lambda f, n: True):
            yield sample.key, data


# -- reading -------------------------------------------------------------------


def _read_member(source: Source, offset: int, length: int, verify: bool) -> bytes:
    """The bytes of the member whose data starts at ``offset`` (with ``verify``,
    its header first: :func:`_check_header`)."""
    if verify:
        _check_header(source, offset, length)
    data = source.pread(length, offset)
    if len(data) != length:
        raise CorruptRecordError(
            source.path, offset, f"truncated member: {len(data)} of {length} bytes"
        )
    return data


def _check_header(source: Source, offset: int, length: int) -> None:
    """The header block right before the data at ``offset`` must be a valid header
    of a regular file whose size field is ``length`` (or 0, when a pax header
    carries the size)."""
    path = source.path
    if offset < BLOCK:
        raise CorruptRecordError(path, offset, "member data cannot start before byte 512")
    header = pread_exact(source, offset - BLOCK, BLOCK)
    if not checksum_ok(header):
        raise CorruptRecordError(
            path, offset - BLOCK, "bad tar header checksum before member data (stale shard?)"
        )
    if header[156:157] not in REGULAR:
        raise CorruptRecordError(
            path, offset - BLOCK, "header before member data is not a regular file"
        )
    size = parse_number(header[124:136], path, offset - BLOCK, "size")
    if size not in (0, length):
        raise CorruptRecordError(
            path,
            offset - BLOCK,
            f"header says {size} bytes, the catalog {length} (stale shard?)",
        )


def _assemble(source: Source, extents: Sequence[Sequence[int]], verify: bool) -> bytes:
    """The content of a sparse member from its :data:`Extents`: each data piece
    read with ``source.pread(length, offset)``, holes as zeros (with ``verify``,
    its pieces first: :func:`_check_pieces`).

    A short read is a truncated shard; pieces are read 1 MiB at a time, so a
    length past the end of the file costs only the bytes that exist.
    """
    data = read_extents(source, extents)
    if verify:
        _check_pieces(source, extents)
    return data


def _check_pieces(source: Source, extents: Sequence[Sequence[int]]) -> None:
    """The data pieces of a sparse member must follow each other in the archive (as
    every GNU sparse format stores them), and what comes after the last one,
    rounded up to a block, must be the next tar header, the end-of-archive zeros
    or the end of the file (a shard that changed since it was indexed usually
    fails that)."""
    path = source.path
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
        if block and (len(block) < BLOCK or (block != ZERO and not checksum_ok(block))):
            raise CorruptRecordError(
                path, after, "no tar header after sparse member data (stale shard?)"
            )


# -- the format ----------------------------------------------------------------


class TarFormat(Format):
    """tar archives of WebDataset-style samples (see the module docstring)."""

    NAME = "tar"
    TITLE = "tar"
    EXTENSIONS = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz")
    PARTS = True
    STREAMS = True
    ONE_RANGE = True  # a sample's own location; its members keep their extents

    def sniff(self, head: bytes) -> bool:
        """A tar archive starts with a header block whose checksum is right."""
        return len(head) >= BLOCK and head[:BLOCK] != ZERO and checksum_ok(head[:BLOCK])

    def scan(self, path: str, options: Mapping[str, Any]) -> Iterator[Entry]:
        """Yield one :class:`Entry` per sample of the archive at ``path``.

        ``options``: ``grouping`` (``webdataset`` or ``tfd``), ``key`` (None keys
        samples by position) and ``fields`` (extract SQL fields, default True).
        Compressed archives are read through a plain decompressing stream here;
        ingest uses :meth:`scan_stream` with one that records seek points.
        """
        if detect_compression(path) is not None:
            with open_stream(path) as stream:
                yield from _scan_cursor(StreamCursor(stream), path, options)
            return
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                yield from _scan_cursor(MapCursor(mm, size), path, options)

    def scan_shard(self, path: str, options: Mapping[str, Any]) -> ShardScan:
        """One shard's samples; a plain archive's headers walked by the native scanner
        when it is built and enabled (:func:`shardcat.formats.native.tar_members`),
        grouped here as :meth:`scan` groups them; else as every format does."""
        if not native.enabled() or detect_compression(path) is not None:
            return super().scan_shard(path, options)
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return ShardScan(Columns([], [], []))
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                cur = MapCursor(mm, len(mm))
                walk = iter_members if set_aside(options) is None else salvaging(iter_members)
                members = native.tar_members(mm, cur, path, walk)
                return ShardScan(Columns.of(_scan_cursor(cur, path, options, members)))

    def scan_stream(self, stream: Any, path: str, options: Mapping[str, Any]) -> Iterator[Entry]:
        """Like :meth:`scan`, over a binary stream read sequentially (compressed
        archives: ingest hands in the decompressed stream, which records seek points)."""
        # Cursors and the ingest stream already read in full (short only at the end),
        # skip and count ``pos`` from 0; any other stream gets a cursor around it.
        cur: Cursor = stream if isinstance(stream, _CURSORS) else StreamCursor(stream)
        return _scan_cursor(cur, path, options)

    def detect_options(self, path: str, sidecar: bool | None = None) -> dict[str, Any]:
        return {"grouping": DEFAULT_GROUPING}

    def key_rule(self, options: Mapping[str, Any]) -> str:
        grouping = grouping_of(options)
        return "position" if options.get("key", "key") is None else f"member-stem:{grouping}"

    def read(self, source: Source, location: Location, verify: bool = False) -> bytes:
        """The content of one member: ``location`` is a member row's data offset and
        size, with its extents for a sparse member (read piece by piece, holes as
        zeros). With ``verify``, a plain member's header block must be right before
        its data (a regular file of that size); a sparse member's data pieces must
        follow each other and be followed by a tar header or the archive's end."""
        if location.extents is not None:
            return _assemble(source, location.extents, verify)
        return _read_member(source, location.offset, location.length, verify)

    def read_chunks(
        self, source: Source, location: Location, verify: bool = False
    ) -> Iterator[bytes]:
        """:meth:`read` in pieces of at most 1 MiB as they are read (the checks of
        ``verify`` first), for members too large to hold."""
        extents = location.extents
        if verify:
            if extents is None:
                _check_header(source, location.offset, location.length)
            else:
                _check_pieces(source, extents)
        return iter_extents(source, extents or ((location.offset, location.length),))

    def decode(self, raw: Any, options: Mapping[str, Any]) -> dict[str, bytes]:
        """A sample is ``{feature: bytes}`` already."""
        return dict(raw)

    def feature_list(self, record: Any, name: str) -> list[Any] | None:
        return [record[name]] if name in record else None

    def features(self, record: Any) -> dict[str, list[Any]]:
        return {name: [value] for name, value in record.items()}

    def describe(self, record: Any) -> dict[str, str]:
        return {name: "bytes" for name in sorted(record)}

    def index_lines(self, entries: Sequence[Entry], options: Mapping[str, Any]) -> Iterator[str]:
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

    def check_entries(self, shard: LegacyRows) -> tuple[list[Entry], int]:
        """A tfd-utils tar index's ``(key, ext, member name, data offset, size)`` rows:
        members must follow each other header by header; where they do not, the
        headers in between are read, and a regular member with a key the index lacks
        is a mismatch, as are members after the last indexed one. The picked members'
        headers are re-read (checksum, regular file, name, size, data offset). One
        sample per key, as the ``tfd`` grouping has them. A remote archive is
        re-indexed from its data (one streamed read), its headers not walked."""
        if is_url(shard.path):
            raise Mismatch("a remote archive is re-indexed from its data (one streamed read)")
        return legacy_samples(shard.path, shard.size, shard.rows, shard.picks)


# -- DALI ----------------------------------------------------------------------


def regular_members(path: str) -> Iterator[tuple[str, int, int]]:
    """``(name, data offset, size)`` of every regular file member, in archive order.

    For a sparse member: its real name, its first stored byte and its real
    size, as Python's ``tarfile`` gives them (``offset_data``, ``size``); its
    bytes there are not its content (see :attr:`Member.extents`).
    """
    with open_stream(path) as stream:
        for m in iter_members(StreamCursor(stream), path):
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
