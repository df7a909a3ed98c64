"""The container-format interface (:class:`Format`), the record location it reads
(:class:`Location`), the entries its scan yields (:class:`Entry`) and the columns
ingest commits (:class:`Columns`).

A format is one module that knows bytes and nothing about SQL: it imports
nothing from :mod:`shardcat.catalog`. It subclasses :class:`Format`, whose
core is small, so mypy checks every format against one declaration:

- ``sniff(head)``: whether a file starting with ``head`` is in this format
  (formats are detected from content; extensions only break ties);
- ``scan(path, options)``: walk one shard once, verifying framing and
  checksums, yielding one :class:`Entry` per record; ``scan_stream`` the same
  over a sequential stream (compressed shards; ``STREAMS`` says it works);
- ``read(source, location, verify)``: one record's (or member's) payload
  through a :class:`~shardcat.sources.rawio.Source`;
- ``decode(raw, options)``: the user-facing record;
- ``feature_list(record, name)``: the values of one feature, or None.

Beside them: class attributes (``NAME``, ``TITLE``, ``EXTENSIONS``, ``PARTS``,
``STREAMS``, ``ONE_RANGE``, ``OWN_BYTES``), ``key_rule(options)`` (how a dataset with these
options is keyed) and ``scan_shard`` (provided: plain or compressed, through
the two scans; a format may override it with a faster path).

What only some formats can do is a small capability, a
:class:`typing.Protocol` declared beside the code that uses it and looked up
there; a format has it by defining its methods (no import needed, so formats
stay below everything that uses them):

- a record's whole feature view (``features``, ``describe``) and a payload
  read in pieces (``read_chunks``): :mod:`shardcat.readers.record_view`;
- dataset options read off the first shard (``detect_options``) and the SQL
  columns they declare (``field_types``): :mod:`shardcat.facade.dataset_options`;
- remote shards: the head its options need (``head_needed``) and a sidecar
  file (``sidecar``, ``dataset_sidecars``, ``detect_dataset_options``):
  :mod:`shardcat.facade.remote_detect`;
- DALI index lines (``index_lines``): :mod:`shardcat.facade.export`;
- legacy index import (``check_entries``, given :class:`LegacyRows`, raising
  :class:`Mismatch`): :mod:`shardcat.migrations.legacy.verify`.

The contract suite (:mod:`shardcat.testing.formats`) tests the core of every
format and each capability a format has.

A location is where a payload lives in its shard: usually one byte range
(``offset``, ``length``), but a format may describe more: ``extents``, the
byte ranges that make the payload in content order (a sparse tar member;
the footer and the column chunks of a Parquet row group), and ``item``,
which record inside those bytes it is (chunk + index formats: the row of a
row group, the record of a chunk). The catalog stores all of it and gives it
back as it was scanned.

The registry that finds formats by name or content is
:mod:`shardcat.formats.registry`.
"""

from __future__ import annotations

import math
import struct
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from shardcat.errors import CatalogError
from shardcat.formats.checks import keyed_checks
from shardcat.sources.compressed import IndexingStream, detect_compression
from shardcat.sources.rawio import Source

__all__ = [
    "BAD_RECORDS",
    "BadRecord",
    "Columns",
    "Entry",
    "Format",
    "LegacyRows",
    "Location",
    "Mismatch",
    "ShardScan",
    "float32_shortest",
    "set_aside",
]

# Scalar values that become SQL columns of a dataset's view.
Scalar = int | float | str
# Byte ranges in content order: (offset, length); offset -1 is a run of zeros.
Extents = tuple[tuple[int, int], ...]


@dataclass(slots=True)
class Location:
    """Where one payload lives in its shard (see the module docstring).

    ``offset``/``length``: the byte range (the first of several, or the span
    the format chooses, when ``extents`` is given); ``extents``: the ranges
    that make the payload, in content order, when it is not the one range;
    ``item``: which record inside those bytes (None: the bytes are the record).
    """

    offset: int
    length: int
    extents: Extents | None = None
    item: int | None = None


@dataclass(slots=True)
class Entry:
    """One record found by ``scan``.

    ``key`` is None for datasets keyed by position. ``offset``, ``length``,
    ``extents`` and ``item`` are the record's :class:`Location`. ``check``: the
    CRC32C of the payload ``read`` returns (:mod:`shardcat.formats.checks`;
    None: the scan has none, reads then check the record's framing). ``members``
    lists ``(feature, offset, length)`` for formats whose records are made of
    separately stored parts (tar samples, ``PARTS``); it stays empty for the
    others. A member stored in pieces adds a fourth item, its extents (None for
    one range), and a member's check is a fifth.
    """

    key: str | None
    offset: int
    length: int
    fields: dict[str, Scalar] = field(default_factory=dict)
    members: list[tuple[Any, ...]] = field(default_factory=list)
    extents: Extents | None = None
    item: int | None = None
    # not compared: entries are the same records whatever checks a scan computed
    check: int | None = field(default=None, compare=False)

    @property
    def location(self) -> Location:
        return Location(self.offset, self.length, self.extents, self.item)


@dataclass(frozen=True, slots=True)
class BadRecord:
    """A record a scan set aside instead of failing its shard (ingest with
    ``on_bad_record="skip"``): where it starts in the shard (``offset``), the bytes
    set aside from there (``length``; None when unknown), why (``reason``, the
    error the default mode raises) and its key when it could be read."""

    offset: int
    length: int | None
    reason: str
    key: str | None = None


#: The scan option holding a list a scan appends :class:`BadRecord` items to, instead
#: of raising :class:`~shardcat.errors.CorruptRecordError` for a damaged record, where
#: the format can go on after it (ingest sets it with ``on_bad_record="skip"``; a
#: format that does not know it raises as usual).
BAD_RECORDS = "bad_records"


def set_aside(options: Mapping[str, Any]) -> list[BadRecord] | None:
    """The list bad records go to in a scan with ``options`` (None: raise instead)."""
    found: list[BadRecord] | None = options.get(BAD_RECORDS)
    return found


class Mismatch(Exception):
    """A shard's entries from a legacy index do not match its file (the message says
    how); the importer then re-indexes the shard from its data."""


@dataclass(slots=True)
class LegacyRows:
    """What a format's legacy-import capability (``check_entries``, see
    :mod:`shardcat.migrations.legacy.verify`) checks: the ``rows`` a legacy index
    holds for the uncompressed shard at ``path`` (``size`` bytes; their shape is the
    index's, :class:`~shardcat.migrations.legacy.index.LegacyShard`); ``picks``: the
    positions, in file order, of the entries to re-read from the file (the others
    are checked for layout only); ``options``: the dataset's."""

    path: str
    size: int
    rows: list[Any]
    picks: Sequence[int]
    options: Mapping[str, Any]


@dataclass(slots=True)
class Columns:
    """A shard's scanned records column by column: what ingest commits.

    Each list has one item per record, in file order. ``keys``: None items
    for datasets keyed by position. ``fields``: one list per field name, in
    the order the names were first seen, None where a record has no value.
    ``members``: one row per member of a PARTS record, ``(ordinal, name,
    offset, length)`` plus the member's extents (None: one range) and its check.
    ``extents``/``items``: None when no record has any (the common case);
    ``checks``: each record's check (:attr:`Entry.check`), None when none has one.
    ``bad``: the records set aside (see :class:`BadRecord`), not among the others.
    A native scanner fills these lists directly; :meth:`of` builds them from
    a format's :class:`Entry` objects.
    """

    keys: list[str | None]
    offsets: list[int]
    lengths: list[int]
    fields: dict[str, list[Scalar | None]] = field(default_factory=dict)
    members: list[tuple[Any, ...]] = field(default_factory=list)
    extents: list[Extents | None] | None = None
    items: list[int | None] | None = None
    checks: list[int | None] | None = None
    bad: list[BadRecord] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)

    @classmethod
    def of(cls, entries: Iterable[Entry]) -> Columns:
        entries = entries if isinstance(entries, list) else list(entries)
        n = len(entries)
        fields: dict[str, list[Scalar | None]] = {}
        members: list[tuple[Any, ...]] = []
        extents: list[Extents | None] | None = None
        items: list[int | None] | None = None
        for i, e in enumerate(entries):
            for name, value in e.fields.items():
                column = fields.get(name)
                if column is None:
                    column = fields[name] = [None] * n
                column[i] = value
            if e.members:
                members.extend((i, *m) for m in e.members)
            if e.extents is not None:
                if extents is None:
                    extents = [None] * n
                extents[i] = e.extents
            if e.item is not None:
                if items is None:
                    items = [None] * n
                items[i] = e.item
        checks = [e.check for e in entries]
        return cls(
            [e.key for e in entries],
            [e.offset for e in entries],
            [e.length for e in entries],
            fields,
            members,
            extents,
            items,
            checks if not checks or any(c is not None for c in checks) else None,
        )

    def keyed_checks(self) -> list[int | None] | None:
        """Each record's check mixed with its key: what the catalog stores (see
        :mod:`shardcat.formats.checks`); None when no record has a check."""
        return None if self.checks is None else keyed_checks(self.checks, self.keys)

    def select(self, keep: Sequence[int]) -> Columns:
        """The records at the ordinals ``keep`` (ascending), renumbered from 0."""
        renumber = {old: new for new, old in enumerate(keep)}
        return Columns(
            [self.keys[i] for i in keep],
            [self.offsets[i] for i in keep],
            [self.lengths[i] for i in keep],
            {name: [column[i] for i in keep] for name, column in self.fields.items()},
            [(renumber[m[0]], *m[1:]) for m in self.members if m[0] in renumber],
            None if self.extents is None else [self.extents[i] for i in keep],
            None if self.items is None else [self.items[i] for i in keep],
            None if self.checks is None else [self.checks[i] for i in keep],
            self.bad,
        )


@dataclass
class ShardScan:
    """What ingest stores for one shard: its records as :class:`Columns` and, for a
    compressed shard, the seek points of its decompressed stream."""

    columns: Columns
    compression: str | None = None
    seek_kind: str | None = None
    seek_index: bytes | None = field(default=None, repr=False)


class Format(ABC):
    """One container format (see the module docstring). Subclasses set the class
    attributes and define the abstract methods; the others have defaults. What
    only some formats do (capabilities) is not declared here: a format has one by
    defining its methods (see the module docstring for where each is declared)."""

    #: registry name, stored with every dataset of this format
    NAME: ClassVar[str]
    #: name in messages ("TFRecord")
    TITLE: ClassVar[str]
    #: file name endings, used only to break ties between sniffs
    EXTENSIONS: ClassVar[tuple[str, ...]] = ()
    #: records are made of separately stored members (``Entry.members``); a reader
    #: then reads one member per feature, and the raw record is ``{feature: bytes}``
    PARTS: ClassVar[bool] = False
    #: ``scan_stream`` works, so gzip/bz2/xz-compressed shards can be indexed
    STREAMS: ClassVar[bool] = False
    #: every record is one plain byte range (``Entry.extents`` and ``item`` stay
    #: None): readers then look up offset and length only (faster); an ingest
    #: refuses entries with more for such a format
    ONE_RANGE: ClassVar[bool] = False
    #: a raw record is the record's own bytes (False: it names its place in a block
    #: shared with other records, as Parquet's rows do); ``catalog dedup`` compares them
    OWN_BYTES: ClassVar[bool] = True

    @abstractmethod
    def sniff(self, head: bytes) -> bool:
        """Whether a file whose first bytes (up to 512) are ``head`` is in this format."""

    @abstractmethod
    def scan(self, path: str, options: Mapping[str, Any]) -> Iterator[Entry]:
        """Every record of the shard at ``path``, in file order, framing verified;
        damaged framing raises :class:`~shardcat.errors.CorruptRecordError` with
        the file and byte offset."""

    @abstractmethod
    def read(self, source: Source, location: Location, verify: bool = False) -> bytes:
        """The payload at ``location`` through ``source.pread`` (``source.path``
        names the file in errors); ``verify``: check its checksum where it has one.
        A format must not keep ``location`` after the call: readers may reuse one
        object for every record of a batch."""

    @abstractmethod
    def decode(self, raw: Any, options: Mapping[str, Any]) -> Any:
        """The user-facing record for the raw payload (``{member: bytes}`` for PARTS)."""

    @abstractmethod
    def feature_list(self, record: Any, name: str) -> Sequence[Any] | None:
        """The values of feature ``name`` of a decoded record (None: no such feature)."""

    # -- with defaults ------------------------------------------------------------

    def scan_stream(self, stream: Any, path: str, options: Mapping[str, Any]) -> Iterator[Entry]:
        """``scan`` over a binary stream read sequentially (``STREAMS``): offsets are
        offsets in the stream (the decompressed bytes of a compressed shard)."""
        raise CatalogError(f"{path}: {self.TITLE} shards cannot be read as a stream")

    def key_rule(self, options: Mapping[str, Any]) -> str:
        """How a dataset's records are keyed: ``"position"`` for position keys; any
        other text is recorded as is (default: ``"key"``, the scan's keys)."""
        return "position" if options.get("key", "key") is None else "key"

    # -- provided ---------------------------------------------------------------

    def scan_shard(self, path: str, options: Mapping[str, Any]) -> ShardScan:
        """Scan one shard whatever its compression: plain shards through ``scan``,
        gzip/bz2/xz-compressed ones through ``scan_stream`` over a stream that
        records seek points (returned with the entries)."""
        compression = detect_compression(path)
        if compression is None:
            return ShardScan(Columns.of(self.scan(path, options)))
        if not self.STREAMS:
            raise CatalogError(f"{path}: {self.TITLE} shards cannot be {compression}-compressed")
        with IndexingStream(path, compression) as stream:
            columns = Columns.of(self.scan_stream(stream, path, options))
            index = stream.seek_index()
        kind, blob = index if index is not None else (None, None)
        return ShardScan(columns, compression, kind, blob)

    def __repr__(self) -> str:
        return f"<format {self.NAME}>"


_F32 = struct.Struct("<f")
_F32_PACK, _F32_UNPACK = _F32.pack, _F32.unpack
_isfinite = math.isfinite
_np_float32 = np.float32


def float32_shortest(value: float) -> float:
    """The shortest decimal that rounds to the same float32 (0.1 for float32(0.1)).

    ``value`` is a float32 widened to a Python float. Integers, infinities and
    NaN come back unchanged. Most values people type have at most 6 significant
    digits, so one ``%.6g`` round trip settles them (``g`` drops trailing zeros:
    ``0.1``, ``3.1``); the others take numpy's shortest float32 repr (Dragon4),
    one call instead of trying 7, 8 and 9 digits. The one difference from
    trying 6..9 digits: at a power of two the interval that rounds back is
    narrower below than above, and numpy finds the shorter decimal above
    (``2**-96`` is stored as ``1.2621775e-29``, not ``1.26217745e-29``).
    """
    if value.is_integer() or not _isfinite(value):
        return value
    text = float(f"{value:.6g}")
    if _F32_UNPACK(_F32_PACK(text))[0] == value:
        return text
    return float(str(_np_float32(value)))
