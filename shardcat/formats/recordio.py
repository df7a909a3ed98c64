"""MXNet RecordIO: dmlc framing, ``IRHeader`` records, ``.idx`` keys and writing.

**Framing** (dmlc-core ``recordio.h``/``recordio.cc``, what ``mx.recordio``
reads and writes). A ``.rec`` file is a sequence of frames, all little endian::

    uint32 magic      0xced7230a
    uint32 lrecord    cflag << 29 | length      (length < 2**29)
    byte   data[length]
    byte   pad[]      zeros up to the next multiple of 4

``cflag`` 0 is a whole record. dmlc's writer cuts a payload at every 4-byte
aligned occurrence of the magic word inside it (the word itself is dropped):
the pieces become frames with cflag 1 (first), 2 (middle) and 3 (last), and a
reader re-joins them with the magic word. A logical record is therefore one
cflag-0 frame, or a 1, 2..., 3 run of frames. The catalog stores, per record,
the byte offset of its first frame and the number of file bytes all its
frames span (headers and padding included), so one ``pread`` fetches it.

**IRHeader** (``mx.recordio.pack``/``unpack``): a payload may start with
``struct "IfQQ"`` = flag (uint32), label (float32), id (uint64), id2
(uint64), 24 bytes. When flag > 0 the label is instead a float32 array of
``flag`` values that follows the header (the header's label field is then 0).

**Header detection** (dataset option ``header``): by default it is read off
the first record of the first shard: on when that payload is at least 24
bytes, its ``24 + 4 * flag`` bytes fit in it, and its label(s) are finite
numbers; off otherwise (raw payloads, e.g. a JPEG: its first 4 bytes read as a
huge flag). An empty first shard means on. Pass ``options={"header": False}``
(``RecordIOReader(..., header=False)``) to force raw records. A record that
cannot hold the header in a header dataset simply has no fields.

**Keys** (dataset option ``idx``): when the first shard has an MXNet index
beside it (same stem, ``.idx``: ``key<TAB>offset`` lines as
``MXIndexedRecordIO`` writes them), records are keyed by the index's key text
(key rule ``mxnet-idx``); every shard then needs its ``.idx``, every record a
line in it, and every line must point at a record's first frame. Otherwise
records are keyed by position (key rule ``position``): ``"0"``..``"n-1"`` over
the whole dataset, shards in path order. For a single ``.rec`` these are the
sequential keys DALI's ``rec2idx`` and ``MXIndexedRecordIO`` over such an
index use; per-file numbering would collide across shards, so several shards
continue the count (a shard's first key is the number of records before it).
``key=None`` forces position keys even when ``.idx`` files exist. Only the
``.rec`` is watched for changes: after editing an ``.idx`` alone, re-ingest
with ``rescan=True`` (``reader.rebuild_index()``).

**Colliding ``.idx`` keys** (``idx="column"``): ``RecordIOWriter``, ``im2rec``
and ``rec2idx`` number each file's records from 0, so the ``.idx`` keys of
several shards collide, and keying by them would lose records.
:meth:`RecordIOFormat.detect_dataset_options` (the options of a new dataset: it reads every
shard's ``.idx``, once) then keys records by position instead, keeps each
record's ``.idx`` key in the SQL column ``idx_key`` (``SELECT key FROM ds
WHERE idx_key = '7'``), and says so with a warning; the same when a key
appears twice in one ``.idx``. Nothing is dropped. ``options={"idx": True}``
keys by the ``.idx`` anyway (duplicates then follow ``on_duplicate``).

**SQL fields** (header datasets, ``fields=True``): ``flag``, ``id``, ``id2``
(integers; an id above 2**63 - 1 does not fit SQL's integer and is NULL),
``label`` (NULL when flag > 0) and ``labels`` (a JSON array; NULL when flag =
0); ``idx_key`` (text) with ``idx="column"``, in raw datasets too.
:meth:`RecordIOFormat.field_types` declares them, so that every RecordIO dataset has the
same columns whatever its records hold (the ingest creates the declared
columns; a record that cannot hold the header has NULL in all of them).
Float32 values are stored as the shortest decimal that rounds back to the
same float32 (``0.1``, not ``0.10000000149011612``), so ``label = 0.1`` works.

**Records and features**: ``decode`` gives the payload exactly as
``MXIndexedRecordIO.read_idx`` returns it; in header datasets it is an
:class:`IRRecord` (a ``bytes`` subclass with ``header`` and ``data``). The
feature view of a header record is ``flag``, ``label`` (flag = 0) or
``labels`` (flag > 0), ``id``, ``id2`` and ``data`` (the bytes after the header
and label array); a raw record has just ``data``.
"""

from __future__ import annotations

import math
import mmap
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from shardcat.errors import CatalogError, CorruptRecordError, Hint, ShardcatWarning
from shardcat.formats import native
from shardcat.formats.base import (
    BadRecord,
    Columns,
    Entry,
    Format,
    LegacyRows,
    Location,
    Mismatch,
    Scalar,
    ShardScan,
    set_aside,
)
from shardcat.formats.checks import crc32c
from shardcat.formats.irheader import (
    HEADER_TYPES,
    IRHeader,
    IRRecord,
    header_fields,
    pack,
    parse_header,
    unpack,
)
from shardcat.formats.mxnet_idx import (
    IDX_AS_COLUMN,
    IDX_KEY,
    find_collision,
    idx_keys,
    idx_path_for,
    position_keys_note,
    read_idx,
)
from shardcat.formats.recordio_frames import (
    FRAME,
    HEADER,
    LENGTH_MASK,
    MAGIC,
    RecordIOWriter,
    encode,
    join_parts,
    padded,
    resync,
    walk_frames,
)
from shardcat.sources.compressed import detect_compression
from shardcat.sources.local import shard_to_check
from shardcat.sources.rawio import Source, pread_exact

# The writer and the IRHeader live in their own modules; this one is their
# public home (``from shardcat.formats.recordio import IRHeader, pack``).
__all__ = [
    "MAGIC",
    "IRHeader",
    "IRRecord",
    "RecordIOFormat",
    "RecordIOWriter",
    "encode",
    "find_collision",
    "idx_path_for",
    "pack",
    "position_keys_note",
    "unpack",
]

_TYPES = {"flag": "uint32", "label": "float32", "id": "uint64", "id2": "uint64", "data": "bytes"}
# Legacy entries carry no fields and no members: one shared empty value each.
_NO_FIELDS: dict[str, Scalar] = {}
_NO_MEMBERS: list[tuple[Any, ...]] = []


# -- keys from an MXNet .idx (see shardcat.formats.mxnet_idx) ------------------------


def _reads_idx(options: Mapping[str, Any]) -> bool:
    """Whether a scan with these options reads the ``.idx`` (not with ``idx=False``,
    nor keyed by position unless the ``.idx`` key is a column)."""
    idx = options.get("idx")
    return idx is not False and (options.get("key", "key") is not None or idx == IDX_AS_COLUMN)


def _keys_source(path: str, options: Mapping[str, Any]) -> dict[int, tuple[str, int]] | None:
    """The shard's index (offset -> key) when records are keyed by ``.idx`` (or keep
    its key in a column), else None."""
    if not _reads_idx(options):
        return None
    idx = options.get("idx")
    idx_path = idx_path_for(path)
    if os.path.isfile(idx_path):
        return read_idx(idx_path)
    if idx is True:
        raise CatalogError(
            f"{path}: no MXNet index {os.path.basename(idx_path)} beside it, but this dataset "
            "is keyed by .idx files",
            hint=Hint.naming(
                "key=None",
                "--by-position",
                before="(ingest with ",
                after=" to key records by position)",
            ),
        )
    return None  # keyed by position: a shard without .idx has no idx_key


def _legacy_entries(size: int, rows: list[Any]) -> list[Entry]:
    """Entries from an MXNet ``.idx``'s ``(key, offset)`` rows: offsets unique, the
    first at byte 0, each record running to the next one, the last to the end of
    the file."""
    rows.sort(key=lambda r: r[1])
    if not rows:
        if size:
            raise Mismatch("the index is empty, the file is not")
        return []
    if rows[0][1] != 0:
        raise Mismatch("the record at byte 0 has no line in the index")
    entries = []
    for (key, offset), nxt in zip(rows, [*(r[1] for r in rows[1:]), size], strict=True):
        if nxt - offset < HEADER:
            raise Mismatch(
                f"no record fits between bytes {offset} and {nxt} (duplicate offset, or the "
                "index runs past the end of the file)"
            )
        entries.append(Entry(key, offset, nxt - offset, _NO_FIELDS, _NO_MEMBERS))
    return entries


def _no_line(path: str, offset: int) -> CorruptRecordError:
    return CorruptRecordError(
        path, offset, f"record has no line in {os.path.basename(idx_path_for(path))}"
    )


def _unclaimed(path: str, keys: dict[int, tuple[str, int]]) -> CorruptRecordError:
    offset, (key, line_at) = min(keys.items(), key=lambda item: item[1][1])
    return CorruptRecordError(
        idx_path_for(path),
        line_at,
        f"key {key!r} points at byte {offset}, where no record of {path} starts",
    )


def _walk(
    mm: Any,
    pos: int,
    size: int,
    path: str,
    keys: dict[int, tuple[str, int]] | None,
    bad: list[BadRecord] | None,
) -> tuple[int, Any]:
    """:func:`walk_frames` of the record at ``pos``; when it is damaged and ``bad``
    sets records aside: ``(where the next sound record starts, None)``, the damaged
    stretch in ``bad`` with its ``.idx`` key (``keys``, claimed), and any ``.idx``
    key pointing inside it as a bad record of its own."""
    try:
        return walk_frames(mm, pos, size, path)
    except CorruptRecordError as exc:
        if bad is None:
            raise
        end = resync(mm, pos, size)
        first = None if keys is None else keys.pop(pos, None)
        bad.append(BadRecord(pos, end - pos, exc.problem, None if first is None else first[0]))
        for at in sorted(o for o in keys or () if pos < o < end):
            why = f"inside the damaged bytes from byte {pos}"
            bad.append(BadRecord(at, None, why, keys.pop(at)[0] if keys else None))
        return end, None


def _put(column: list[Scalar | None], i: int, value: Scalar) -> None:
    column.extend([None] * (i - len(column)))
    column.append(value)


def _native_scan(path: str, options: Mapping[str, Any]) -> Columns:
    """:meth:`RecordIOFormat.scan`'s records as columns: whole frames through the
    native scanner, every other record through the reference walk at its offset
    (same errors, same offsets), ``.idx`` keys claimed in file order as there."""
    keys = _keys_source(path, options)
    in_column = options.get("idx") == IDX_AS_COLUMN
    want_fields = bool(options.get("fields", True))
    want_header = want_fields and bool(options.get("header", True))
    checks: list[int | None] = []
    bad = set_aside(options)
    c = Columns([], [], [], {}, checks=checks)
    key_list: list[str | None] = []
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        mm: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        try:
            pos = 0
            while True:
                pos, done = native.recordio_frames(mm, pos, want_header, c)
                if keys is not None:  # claim the .idx lines of the new records
                    for i in range(len(key_list), len(c.offsets)):
                        found = keys.pop(c.offsets[i], None)
                        if found is None:
                            raise _no_line(path, c.offsets[i])
                        key_list.append(found[0])
                if done:
                    break
                end, parts = _walk(mm, pos, size, path, keys, bad)
                if parts is None:  # set aside
                    pos = end
                    continue
                if keys is not None:
                    found = keys.pop(pos, None)
                    if found is None:
                        raise _no_line(path, pos)
                    key_list.append(found[0])
                i = len(c.offsets)
                payload = join_parts(mm, parts)
                if want_header:
                    for name, value in header_fields(payload, 0, len(payload)).items():
                        _put(c.fields.setdefault(name, []), i, value)
                c.offsets.append(pos)
                c.lengths.append(end - pos)
                checks.append(crc32c(payload))
                pos = end
        finally:
            if size:
                mm.close()
    if keys:
        raise _unclaimed(path, keys)
    n = len(c.offsets)
    if in_column or keys is None:
        if in_column and want_fields and keys is not None:
            column = c.fields.setdefault(IDX_KEY, [])
            column.extend(key_list)
        c.keys = [None] * n
    else:
        c.keys = list(key_list)
    for column in c.fields.values():
        column.extend([None] * (n - len(column)))
    return c


def _crc_of(buf: Any, parts: Any) -> int:
    """The check of the record made of ``parts`` of ``buf`` (its payload's CRC32C)."""
    if len(parts) == 1:
        start, n = parts[0]
        return crc32c(memoryview(buf)[start : start + n])
    return crc32c(join_parts(buf, parts))


def features_of(record: bytes, *, with_data: bool = True) -> dict[str, list[Any]]:
    """``{feature: [values]}``: the IRHeader's values and ``data`` (or just ``data``).

    ``with_data=False`` leaves ``data`` out, so the payload is not copied.
    """
    if isinstance(record, IRRecord):
        parsed = parse_header(record, 0, len(record))
        if parsed is not None:
            flag, label, id_, id2, start = parsed
            out: dict[str, list[Any]] = {"flag": [flag]}
            if flag == 0:
                out["label"] = [label]
            else:
                out["labels"] = list(label)
            out.update(id=[id_], id2=[id2])
            if with_data:
                out["data"] = [record[start:]]
            return out
    return {"data": [bytes(record)]} if with_data else {}


class RecordIOFormat(Format):
    """MXNet RecordIO ``.rec`` files (see the module docstring)."""

    NAME = "recordio"
    TITLE = "RecordIO"
    EXTENSIONS = (".rec",)
    PARTS = False
    STREAMS = False
    ONE_RANGE = True

    def sniff(self, head: bytes) -> bool:
        """A RecordIO file starts with the magic word and a whole or first-part frame."""
        if len(head) < HEADER:
            return False
        magic, lrecord = FRAME.unpack_from(head, 0)
        return bool(magic == MAGIC and lrecord >> 29 in (0, 1))

    def scan(self, path: str, options: Mapping[str, Any]) -> Iterator[Entry]:
        """Yield one :class:`Entry` per logical record of the ``.rec`` at ``path``.

        Framing is checked frame by frame (magic word, continuation flags,
        lengths); a problem raises :class:`CorruptRecordError` with the byte
        offset of the record's first frame, or, when ``options`` set bad records
        aside, is set aside up to the next sound record (:func:`resync`).
        ``options``: ``key`` (None: position keys), ``idx`` (keys from the ``.idx``
        beside the file: True, False, or absent = when there is one; ``"column"``:
        position keys, the ``.idx`` key in field ``idx_key``), ``header`` and
        ``fields`` (extract IRHeader fields, both default True).
        """
        keys = _keys_source(path, options)
        in_column = options.get("idx") == IDX_AS_COLUMN  # keyed by position, .idx key a field
        want_fields = options.get("fields", True)
        want_header = want_fields and options.get("header", True)
        bad = set_aside(options)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            mm: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
            try:
                pos = 0
                while pos < size:
                    end, parts = _walk(mm, pos, size, path, keys, bad)
                    if parts is None:  # set aside
                        pos = end
                        continue
                    key = None
                    if keys is not None:
                        found = keys.pop(pos, None)
                        if found is None:
                            raise CorruptRecordError(
                                path,
                                pos,
                                f"record has no line in {os.path.basename(idx_path_for(path))}",
                            )
                        key = found[0]
                    fields: dict[str, Scalar] = {}
                    if want_header:
                        if len(parts) == 1:
                            fields = header_fields(mm, *parts[0])
                        else:
                            payload = join_parts(mm, parts)
                            fields = header_fields(payload, 0, len(payload))
                    if in_column:
                        if key is not None and want_fields:
                            fields[IDX_KEY] = key
                        key = None
                    yield Entry(key, pos, end - pos, fields, check=_crc_of(mm, parts))
                    pos = end
            finally:
                if size:
                    mm.close()
        if keys:
            offset, (key, line_at) = min(keys.items(), key=lambda item: item[1][1])
            raise CorruptRecordError(
                idx_path_for(path),
                line_at,
                f"key {key!r} points at byte {offset}, where no record of {path} starts",
            )

    def scan_shard(self, path: str, options: Mapping[str, Any]) -> ShardScan:
        """One shard's records through the native scanner when it is built and enabled
        (:func:`shardcat.formats.native.recordio_frames`); else as every format does."""
        if not native.enabled() or detect_compression(path) is not None:
            return super().scan_shard(path, options)  # compressed: the usual error
        return ShardScan(_native_scan(path, options))

    def key_rule(self, options: Mapping[str, Any]) -> str:
        """``mxnet-idx`` when records are keyed by ``.idx`` files, else ``position``
        (also with ``idx="column"``: the ``.idx`` key is then a SQL field)."""
        idx = options.get("idx", False)
        if options.get("key", "key") is None or not idx or idx == IDX_AS_COLUMN:
            return "position"
        return "mxnet-idx"

    def field_types(self, options: Mapping[str, Any]) -> dict[str, str]:
        """The SQL columns (name -> ``integer``/``real``/``text``) that every dataset with
        these options has, NULL where a record has no value: the IRHeader's in header
        datasets, ``idx_key`` with ``idx="column"``; none without fields."""
        if not options.get("fields", True):
            return {}
        out = dict(HEADER_TYPES) if options.get("header", True) else {}
        if options.get("idx") == IDX_AS_COLUMN:
            out[IDX_KEY] = "text"
        return out

    def read(self, source: Source, location: Location, verify: bool = False) -> bytes:
        """The payload of the record whose frames span ``location.length`` bytes from
        ``location.offset``. Framing is always checked (RecordIO has no checksum to
        verify beyond it, so ``verify`` changes nothing)."""
        path, offset, length = source.path, location.offset, location.length
        buf = pread_exact(source, offset, length)
        if length >= HEADER:
            magic, lrecord = FRAME.unpack_from(buf, 0)
            n = lrecord & LENGTH_MASK
            if magic == MAGIC and lrecord >> 29 == 0 and HEADER + padded(n) == length:
                return buf[HEADER : HEADER + n]
        try:
            end, parts = walk_frames(buf, 0, length, path, base=offset)
        except CorruptRecordError as exc:
            if not exc.problem.startswith("truncated"):
                raise
            raise CorruptRecordError(
                path,
                offset,
                f"record does not end within the {length} bytes the catalog gives it "
                "(stale shard?)",
            ) from None
        if end != length:
            raise CorruptRecordError(
                path, offset, f"record spans {end} bytes, the catalog says {length} (stale shard?)"
            )
        return join_parts(buf, parts)

    def decode(self, raw: Any, options: Mapping[str, Any]) -> bytes:
        """The payload as MXNet's ``read_idx`` returns it (an :class:`IRRecord` in
        datasets whose records carry an IRHeader)."""
        return IRRecord(raw) if options.get("header", True) else bytes(raw)

    def features(self, record: Any) -> dict[str, list[Any]]:
        """``{feature: [values]}``: the IRHeader's values and ``data`` (or just ``data``)."""
        return features_of(record)

    def feature_list(self, record: Any, name: str) -> list[Any] | None:
        """All values of feature ``name`` (see :meth:`features`), or None.

        The payload is copied only when ``name`` is ``data``.
        """
        return features_of(record, with_data=name == "data").get(name)

    def describe(self, record: Any) -> dict[str, str]:
        """Feature name -> type (``labels`` as ``float32[n]``)."""
        return {
            name: f"float32[{len(values)}]" if name == "labels" else _TYPES[name]
            for name, values in sorted(features_of(record).items())
        }

    def sidecar(self, path: str, options: Mapping[str, Any] | None = None) -> str | None:
        return None if options is not None and not _reads_idx(options) else idx_path_for(path)

    def head_needed(self, head: str) -> int | None:
        """The first record's frame when it is one part; None when compressed or
        split in parts (the walk then reads what the caller's cap holds)."""
        if detect_compression(head):
            return None
        with open(head, "rb") as f:
            first = f.read(HEADER)
        if len(first) < HEADER:
            return 0
        magic, lrecord = int.from_bytes(first[:4], "little"), int.from_bytes(first[4:], "little")
        if magic != MAGIC or lrecord >> 29 != 0:
            return None if magic == MAGIC else 0
        return HEADER + padded(lrecord & LENGTH_MASK)

    def detect_options(self, path: str, sidecar: bool | None = None) -> dict[str, Any]:
        """``idx``: whether an MXNet ``.idx`` lies beside the file (``sidecar``: whether
        the shard has one, asked of its store already); ``header``: whether its first
        payload looks like an IRHeader (see the module docs)."""
        idx = os.path.isfile(idx_path_for(path)) if sidecar is None else sidecar
        options: dict[str, Any] = {"idx": idx, "header": True}
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return options
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                try:
                    _, parts = walk_frames(mm, 0, size, path)
                except CorruptRecordError:  # the scan reports it with its offset
                    return options
                payload = join_parts(mm, parts)
        parsed = parse_header(payload, 0, len(payload))
        options["header"] = parsed is not None and all(
            math.isfinite(v) for v in (parsed[1] if parsed[0] else (parsed[1],))
        )
        return options

    def dataset_sidecars(self, options: Mapping[str, Any], given: Mapping[str, Any]) -> bool:
        """When the first shard has an ``.idx`` and the caller decided neither ``idx``
        nor ``key=None``: whether the ``.idx`` keys collide decides."""
        return (
            options.get("idx") is True
            and "idx" not in given
            and given.get("key", "key") is not None
        )

    def detect_dataset_options(
        self,
        files: Sequence[str],
        given: Mapping[str, Any] | None = None,
        *,
        first: Mapping[str, Any] | None = None,
        sidecars: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """The options of a new dataset of these shards: :meth:`detect_options` of the
        first (``first``: read already), and what only all of them tell. When the
        first shard has an ``.idx`` and the ``.idx`` keys collide (across shards or
        within one), records are keyed by position and each ``.idx`` key goes to SQL
        column ``idx_key`` (``idx="column"``), with a warning saying so. ``given``:
        the options the caller sets (``idx`` given, or ``key=None``: nothing to
        decide, no ``.idx`` read). Reads every ``.idx`` once (``sidecars``: name ->
        local copy, for remote shards), as the ingest does anyway; for creating a
        dataset, not for opening one."""
        options = dict(first) if first is not None else self.detect_options(files[0])
        if not self.dataset_sidecars(options, given or {}):
            return options
        if sidecars is None:
            found = (os.path.abspath(idx_path_for(f)) for f in files)
            sidecars = {p: p for p in found if os.path.isfile(p)}
        if not sidecars:
            return options
        # by characters, cut back to a "/": names may be URLs (commonpath folds "//")
        prefix = os.path.commonprefix([n.rsplit("/", 1)[0] + "/" for n in sidecars])  # noqa: RUF071
        where = prefix[: prefix.rfind("/")]
        try:
            clash = find_collision(
                (name[len(where) + 1 :], idx_keys(path)) for name, path in sidecars.items()
            )
        except CorruptRecordError:  # not UTF-8: the scan of that shard reports it
            return options
        if clash is not None:
            options["idx"] = IDX_AS_COLUMN
            warnings.warn(f"{where}: {position_keys_note(clash)}", ShardcatWarning, stacklevel=2)
        return options

    def index_lines(self, entries: Sequence[Entry], options: Mapping[str, Any]) -> Iterator[str]:
        """The lines of DALI's ``rec2idx`` index for one ``.rec``: ``<n>\\t<offset>``,
        ``n`` counting records from 0 in file order, ``offset`` their first frame."""
        for n, entry in enumerate(entries):
            yield f"{n}\t{entry.offset}"

    def check_entries(self, shard: LegacyRows) -> tuple[list[Entry], int]:
        """A legacy ``.idx``'s ``(key, offset)`` rows: offsets must be unique and start
        at byte 0, the last record must end at the end of the file; the picked records
        are re-read (magic and framing spanning exactly the record) and get their
        check (the others keep none: reads check them by their framing)."""
        path, size, picks = shard.path, shard.size, shard.picks
        entries = _legacy_entries(size, shard.rows)
        ranges = [(entries[i].offset, entries[i].length + 16) for i in picks]  # + framing
        storage = shard.options.get("storage_options")
        with shard_to_check(path, size, storage, ranges) as source:
            for i in picks:
                entries[i].check = crc32c(self.read(source, entries[i].location, True))
        return entries, len(picks)
