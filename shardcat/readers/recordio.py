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
:func:`detect_dataset_options` (the options of a new dataset: it reads every
shard's ``.idx``, once) then keys records by position instead, keeps each
record's ``.idx`` key in the SQL column ``idx_key`` (``SELECT key FROM ds
WHERE idx_key = '7'``), and says so with a warning; the same when a key
appears twice in one ``.idx``. Nothing is dropped. ``options={"idx": True}``
keys by the ``.idx`` anyway (duplicates then follow ``on_duplicate``).

**SQL fields** (header datasets, ``fields=True``): ``flag``, ``id``, ``id2``
(integers; an id above 2**63 - 1 does not fit SQL's integer and is NULL),
``label`` (NULL when flag > 0) and ``labels`` (a JSON array; NULL when flag =
0); ``idx_key`` (text) with ``idx="column"``, in raw datasets too.
:func:`field_types` declares them, so that every RecordIO dataset has the
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

import json
import math
import mmap
import numbers
import os
import struct
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any, Literal, NamedTuple

import numpy as np

from shardcat.errors import CatalogError, CorruptRecordError
from shardcat.readers.formats import Entry, Scalar, float32_shortest, pread_exact
from shardcat.readers.mxnet_idx import (
    IDX_AS_COLUMN,
    IDX_KEY,
    find_collision,
    idx_keys,
    idx_path_for,
    position_keys_note,
    read_idx,
)

__all__ = [
    "MAGIC",
    "IRHeader",
    "IRRecord",
    "RecordIOWriter",
    "dali_index_lines",
    "decode",
    "describe",
    "detect_dataset_options",
    "encode",
    "feature_list",
    "features",
    "field_types",
    "find_collision",
    "idx_path_for",
    "pack",
    "position_keys_note",
    "read",
    "scan",
    "sniff",
    "unpack",
]

NAME = "recordio"
TITLE = "RecordIO"
PARTS = False
EXTENSIONS = (".rec",)
MAGIC = 0xCED7230A
HEADER = 8  # magic + lrecord
MAX_LENGTH = (1 << 29) - 1
IR_SIZE = 24
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_FRAME = struct.Struct("<II")
_IR = struct.Struct("<IfQQ")
_INT64_MAX = (1 << 63) - 1
_LENGTH_MASK = (1 << 29) - 1
_HEADER_TYPES = {
    "flag": "integer",
    "label": "real",
    "labels": "text",
    "id": "integer",
    "id2": "integer",
}

Parts = list[tuple[int, int]]  # (offset of the data, length) of each frame


def _padded(n: int) -> int:
    return (n + 3) & ~3


def sniff(head: bytes) -> bool:
    """A RecordIO file starts with the magic word and a whole or first-part frame."""
    if len(head) < HEADER:
        return False
    magic, lrecord = _FRAME.unpack_from(head, 0)
    return magic == MAGIC and lrecord >> 29 in (0, 1)


# -- framing -------------------------------------------------------------------


def _frames(buf: Any, pos: int, size: int, path: str, base: int = 0) -> tuple[int, Parts]:
    """Walk the frames of the logical record starting at ``buf[pos]``.

    Returns the end of its last frame and its parts. Offsets in errors are
    ``base + `` buffer positions; the error's offset is the record's start.
    """
    start = pos
    parts: Parts = []
    while True:
        where = "" if pos == start else f" (frame at byte {base + pos})"
        if pos + HEADER > size:
            raise CorruptRecordError(
                path,
                base + start,
                f"truncated record: frame header needs {HEADER} bytes, "
                f"file has {size - pos} left{where}",
            )
        magic, lrecord = _FRAME.unpack_from(buf, pos)
        if magic != MAGIC:
            raise CorruptRecordError(
                path,
                base + start,
                f"bad RecordIO magic 0x{magic:08x}, expected 0x{MAGIC:08x}{where}",
            )
        cflag, length = lrecord >> 29, lrecord & _LENGTH_MASK
        if not parts and cflag not in (0, 1):
            raise CorruptRecordError(
                path,
                base + start,
                f"record starts with continuation flag {cflag} (expected 0 = whole record "
                "or 1 = first part)",
            )
        if parts and cflag not in (2, 3):
            raise CorruptRecordError(
                path,
                base + start,
                f"multi-part record broken off: continuation flag {cflag} where a middle (2) "
                f"or last (3) part must follow{where}",
            )
        end = pos + HEADER + _padded(length)
        if end > size:
            raise CorruptRecordError(
                path,
                base + start,
                f"truncated record: frame needs {end - pos} bytes, file has {size - pos} left"
                + where,
            )
        parts.append((pos + HEADER, length))
        pos = end
        if cflag in (0, 3):
            return pos, parts


def _join(buf: Any, parts: Parts) -> bytes:
    """The payload of a record from its parts (re-inserting the magic word between them)."""
    if len(parts) == 1:
        offset, length = parts[0]
        return bytes(buf[offset : offset + length])
    return _MAGIC_BYTES.join(bytes(buf[o : o + n]) for o, n in parts)


def encode(payload: bytes | bytearray | memoryview) -> bytes:
    """The frames dmlc's ``RecordIOWriter::WriteRecord`` writes for one payload."""
    data = bytes(payload)
    n = len(data)
    if n > MAX_LENGTH:
        raise ValueError(f"RecordIO records must be smaller than 2**29 bytes, not {n:,}")
    out: list[bytes] = []
    done = 0
    i = data.find(_MAGIC_BYTES)
    while i != -1:
        if i % 4:  # only aligned occurrences are cut out (the word cannot overlap itself)
            i = data.find(_MAGIC_BYTES, i + 1)
            continue
        out += (_FRAME.pack(MAGIC, (2 if out else 1) << 29 | (i - done)), data[done:i])
        done = i + 4
        i = data.find(_MAGIC_BYTES, done)
    out += (
        _FRAME.pack(MAGIC, (3 if out else 0) << 29 | (n - done)),
        data[done:],
        bytes(_padded(n) - n),
    )
    return b"".join(out)


# -- IRHeader --------------------------------------------------------------------


class IRHeader(NamedTuple):
    """MXNet's image-record header (``mx.recordio.IRHeader``).

    ``label`` is a float, or a float32 array when ``flag`` > 0.
    """

    flag: int
    label: Any
    id: int
    id2: int


def pack(header: Sequence[Any], s: bytes | bytearray | memoryview) -> bytes:
    """``header`` + ``s`` as one payload, like ``mx.recordio.pack``.

    A number label is stored in the header (flag 0); a list or array label
    becomes a float32 array after the header (flag = its size, label field 0).
    """
    head = IRHeader(*header)
    extra = b""
    if isinstance(head.label, numbers.Number):
        head = head._replace(flag=0)
    else:
        label = np.asarray(head.label, dtype=np.float32)
        head = head._replace(flag=label.size, label=0)
        extra = label.tobytes()
    return _IR.pack(*head) + extra + bytes(s)


def unpack(s: bytes | bytearray | memoryview) -> tuple[IRHeader, bytes]:
    """``(IRHeader, data)`` of a payload, like ``mx.recordio.unpack``.

    With flag > 0 the header's label is the float32 array that follows it.
    Raises ``ValueError`` when the payload is too short for its header.
    """
    s = bytes(s)
    if len(s) < IR_SIZE:
        raise ValueError(f"payload of {len(s)} bytes cannot hold a {IR_SIZE}-byte IRHeader")
    flag, label, id_, id2 = _IR.unpack_from(s, 0)
    if flag == 0:
        return IRHeader(flag, label, id_, id2), s[IR_SIZE:]
    end = IR_SIZE + 4 * flag
    if len(s) < end:
        raise ValueError(f"IRHeader flag {flag} needs {end} bytes, the payload has {len(s)}")
    labels = np.frombuffer(s, np.float32, flag, IR_SIZE).copy()
    return IRHeader(flag, labels, id_, id2), s[end:]


class IRRecord(bytes):
    """A payload that starts with an :class:`IRHeader`.

    It *is* the payload (``bytes``, equal to what MXNet's ``read_idx``
    returns); ``header`` and ``data`` unpack it on access.
    """

    __slots__ = ()

    @property
    def header(self) -> IRHeader:
        return unpack(self)[0]

    @property
    def data(self) -> bytes:
        return unpack(self)[1]


def _parse(buf: Any, offset: int, length: int) -> tuple[int, Any, int, int, int] | None:
    """(flag, label or tuple of labels, id, id2, data start) of a header, or None
    when the ``length`` bytes at ``offset`` cannot hold it."""
    if length < IR_SIZE:
        return None
    flag, label, id_, id2 = _IR.unpack_from(buf, offset)
    if flag == 0:
        return flag, label, id_, id2, IR_SIZE
    end = IR_SIZE + 4 * flag
    if end > length:
        return None
    return flag, struct.unpack_from(f"<{flag}f", buf, offset + IR_SIZE), id_, id2, end


def _fields(buf: Any, offset: int, length: int) -> dict[str, Scalar]:
    parsed = _parse(buf, offset, length)
    if parsed is None:
        return {}
    flag, label, id_, id2, _ = parsed
    out: dict[str, Scalar] = {"flag": flag}
    if flag == 0:
        if not math.isnan(label):  # SQLite stores NaN as NULL anyway
            out["label"] = float32_shortest(label)
    else:
        out["labels"] = json.dumps([float32_shortest(v) for v in label])
    if id_ <= _INT64_MAX:
        out["id"] = id_
    if id2 <= _INT64_MAX:
        out["id2"] = id2
    return out


# -- keys from an MXNet .idx (see shardcat.readers.mxnet_idx) ------------------------


def _keys_source(path: str, options: Mapping[str, Any]) -> dict[int, tuple[str, int]] | None:
    """The shard's index (offset -> key) when records are keyed by ``.idx`` (or keep
    its key in a column), else None."""
    idx = options.get("idx")
    if idx is False or (options.get("key", "key") is None and idx != IDX_AS_COLUMN):
        return None
    idx_path = idx_path_for(path)
    if os.path.isfile(idx_path):
        return read_idx(idx_path)
    if idx is True:
        raise CatalogError(
            f"{path}: no MXNet index {os.path.basename(idx_path)} beside it, but this dataset "
            "is keyed by .idx files (ingest with key=None to key records by position)"
        )
    return None  # keyed by position: a shard without .idx has no idx_key


def detect_dataset_options(
    files: Sequence[str], given: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The options of a new dataset of these shards: :func:`detect_options` of the
    first, and what only all of them tell. When the first shard has an ``.idx``
    and the ``.idx`` keys collide (across shards or within one), records are keyed
    by position and each ``.idx`` key goes to SQL column ``idx_key``
    (``idx="column"``), with a warning saying so. ``given``: the options the
    caller sets (``idx`` given, or ``key=None``: nothing to decide, no ``.idx``
    read). Reads every ``.idx`` once, as the ingest does anyway; for creating a
    dataset, not for opening one."""
    options = detect_options(files[0])
    given = given or {}
    if options["idx"] is not True or "idx" in given or given.get("key", "key") is None:
        return options
    indexes = [idx_path_for(f) for f in files if os.path.isfile(idx_path_for(f))]
    where = os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in indexes])
    try:
        clash = find_collision((os.path.relpath(p, where), idx_keys(p)) for p in indexes)
    except CorruptRecordError:  # not UTF-8: the scan of that shard reports it
        return options
    if clash is not None:
        options["idx"] = IDX_AS_COLUMN
        warnings.warn(f"{where}: {position_keys_note(clash)}", stacklevel=2)
    return options


# -- the format interface ----------------------------------------------------------


def scan(path: str, options: Mapping[str, Any]) -> Iterator[Entry]:
    """Yield one :class:`Entry` per logical record of the ``.rec`` at ``path``.

    Framing is checked frame by frame (magic word, continuation flags,
    lengths); a problem raises :class:`CorruptRecordError` with the byte
    offset of the record's first frame. ``options``: ``key`` (None: position
    keys), ``idx`` (keys from the ``.idx`` beside the file: True, False, or
    absent = when there is one; ``"column"``: position keys, the ``.idx`` key in
    field ``idx_key``), ``header`` and ``fields`` (extract IRHeader fields, both
    default True).
    """
    keys = _keys_source(path, options)
    in_column = options.get("idx") == IDX_AS_COLUMN  # keyed by position, .idx key a field
    want_fields = options.get("fields", True)
    want_header = want_fields and options.get("header", True)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        mm: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        try:
            pos = 0
            while pos < size:
                end, parts = _frames(mm, pos, size, path)
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
                        fields = _fields(mm, *parts[0])
                    else:
                        payload = _join(mm, parts)
                        fields = _fields(payload, 0, len(payload))
                if in_column:
                    if key is not None and want_fields:
                        fields[IDX_KEY] = key
                    key = None
                yield Entry(key, pos, end - pos, fields)
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


def key_rule(options: Mapping[str, Any]) -> str:
    """``mxnet-idx`` when records are keyed by ``.idx`` files, else ``position``
    (also with ``idx="column"``: the ``.idx`` key is then a SQL field)."""
    idx = options.get("idx", False)
    if options.get("key", "key") is None or not idx or idx == IDX_AS_COLUMN:
        return "position"
    return "mxnet-idx"


def field_types(options: Mapping[str, Any]) -> dict[str, str]:
    """The SQL columns (name -> ``integer``/``real``/``text``) that every dataset with
    these options has, NULL where a record has no value: the IRHeader's in header
    datasets, ``idx_key`` with ``idx="column"``; none without fields."""
    if not options.get("fields", True):
        return {}
    out = dict(_HEADER_TYPES) if options.get("header", True) else {}
    if options.get("idx") == IDX_AS_COLUMN:
        out[IDX_KEY] = "text"
    return out


def read(source: Any, path: str, offset: int, length: int, verify: bool = False) -> bytes:
    """The payload of the record whose frames span ``length`` bytes from ``offset``.

    Framing is always checked (there is no checksum to verify beyond it).
    """
    del verify  # RecordIO has no checksums; the framing check below is always done
    buf = pread_exact(source, path, offset, length)
    if length >= HEADER:
        magic, lrecord = _FRAME.unpack_from(buf, 0)
        n = lrecord & _LENGTH_MASK
        if magic == MAGIC and lrecord >> 29 == 0 and HEADER + _padded(n) == length:
            return buf[HEADER : HEADER + n]
    try:
        end, parts = _frames(buf, 0, length, path, base=offset)
    except CorruptRecordError as exc:
        if not exc.problem.startswith("truncated"):
            raise
        raise CorruptRecordError(
            path,
            offset,
            f"record does not end within the {length} bytes the catalog gives it (stale shard?)",
        ) from None
    if end != length:
        raise CorruptRecordError(
            path, offset, f"record spans {end} bytes, the catalog says {length} (stale shard?)"
        )
    return _join(buf, parts)


def decode(raw: bytes, options: Mapping[str, Any]) -> bytes:
    """The payload as MXNet's ``read_idx`` returns it (an :class:`IRRecord` in
    datasets whose records carry an IRHeader)."""
    return IRRecord(raw) if options.get("header", True) else raw


def features(record: bytes, *, with_data: bool = True) -> dict[str, list[Any]]:
    """``{feature: [values]}``: the IRHeader's values and ``data`` (or just ``data``).

    ``with_data=False`` leaves ``data`` out, so the payload is not copied.
    """
    if isinstance(record, IRRecord):
        parsed = _parse(record, 0, len(record))
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


def feature_list(record: bytes, name: str) -> list[Any] | None:
    """All values of feature ``name`` (see :func:`features`), or None.

    The payload is copied only when ``name`` is ``data``.
    """
    return features(record, with_data=name == "data").get(name)


_TYPES = {"flag": "uint32", "label": "float32", "id": "uint64", "id2": "uint64", "data": "bytes"}


def describe(record: bytes) -> dict[str, str]:
    """Feature name -> type (``labels`` as ``float32[n]``)."""
    return {
        name: f"float32[{len(values)}]" if name == "labels" else _TYPES[name]
        for name, values in sorted(features(record).items())
    }


def detect_options(path: str) -> dict[str, Any]:
    """``idx``: whether an MXNet ``.idx`` lies beside the file; ``header``: whether
    its first payload looks like an IRHeader (see the module docs)."""
    options: dict[str, Any] = {"idx": os.path.isfile(idx_path_for(path)), "header": True}
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return options
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            try:
                _, parts = _frames(mm, 0, size, path)
            except CorruptRecordError:  # the scan reports it with its offset
                return options
            payload = _join(mm, parts)
    parsed = _parse(payload, 0, len(payload))
    options["header"] = parsed is not None and all(
        math.isfinite(v) for v in (parsed[1] if parsed[0] else (parsed[1],))
    )
    return options


def dali_index_lines(entries: Sequence[Entry], options: Mapping[str, Any]) -> Iterator[str]:
    """The lines of DALI's ``rec2idx`` index for one ``.rec``: ``<n>\\t<offset>``,
    ``n`` counting records from 0 in file order, ``offset`` their first frame."""
    for n, entry in enumerate(entries):
        yield f"{n}\t{entry.offset}"


# -- writing -------------------------------------------------------------------------


class RecordIOWriter:
    """Writes ``.rec`` files (and their ``.idx``) as MXNet's ``MXIndexedRecordIO`` does.

    ``idx_path``: ``"auto"`` (default) writes the index beside the file (same
    stem, ``.idx``), a path writes it there, None writes none. ``write``
    frames a payload exactly like dmlc's writer and adds a ``key<TAB>offset``
    line; the key defaults to the record's number (0, 1, ...), so a writer fed
    ``write(payload)`` produces what ``write_idx(i, payload)`` does.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        idx_path: str | os.PathLike[str] | Literal["auto"] | None = "auto",
    ) -> None:
        self.path = os.fspath(path)
        self.idx_path = (
            idx_path_for(self.path)
            if idx_path == "auto"
            else (None if idx_path is None else os.fspath(idx_path))
        )
        self.count = 0
        self._file: IO[bytes] = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self._idx: IO[str] | None = None
        if self.idx_path is not None:
            try:
                self._idx = open(self.idx_path, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
            except BaseException:
                self._file.close()
                raise

    def tell(self) -> int:
        """Where the next record's first frame will start."""
        return self._file.tell()

    def write(self, payload: bytes | bytearray | memoryview, key: Any = None) -> int:
        """Append one record; returns the byte offset of its first frame."""
        frames = encode(payload)
        if key is not None and self._idx is None:
            raise ValueError("this writer writes no .idx, so a key would be lost")
        text = str(self.count if key is None else key)
        if self._idx is not None and (
            not text or text != text.lstrip() or any(c in text for c in "\t\r\n")
        ):
            raise ValueError(
                f"an .idx key must be non-empty, without tabs, line breaks or leading "
                f"spaces: {text!r}"
            )
        offset = self._file.tell()
        self._file.write(frames)
        if self._idx is not None:
            self._idx.write(f"{text}\t{offset}\n")
        self.count += 1
        return offset

    def write_idx(self, key: Any, payload: bytes | bytearray | memoryview) -> int:
        """``MXIndexedRecordIO.write_idx`` argument order: key first."""
        return self.write(payload, key)

    def flush(self) -> None:
        self._file.flush()
        if self._idx is not None:
            self._idx.flush()

    def close(self) -> None:
        self._file.close()
        if self._idx is not None:
            self._idx.close()

    def __enter__(self) -> RecordIOWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
